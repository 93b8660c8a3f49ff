"""The pruned Hugging Face checkpoint format, and writing it (:mod:`attnviz.models.pruned` loads it back).

``attnviz prune … --out DIR`` writes, for a Hugging Face model:

* ``DIR/`` — the **physically pruned** checkpoint: ``config.json`` (the original
  configuration, unchanged), ``model.safetensors`` with the smaller weights,
  the tokenizer files (an image classifier: its image processor), and ``attnviz-pruned.json``
  (the marker; see below).
  Layers may keep different numbers of heads, which a transformers config
  cannot express, so plain ``transformers`` refuses this directory (size
  mismatch); ``attnviz.models.specs.load_model(DIR)`` — and every attnviz
  command — loads it through :func:`load_pruned_model`.
* ``DIR/transformers-masked/`` — the **masked-weights** form (only when asked for: as large as the original):
  an ordinary full-size checkpoint whose removed heads have zeroed
  output-projection weights. ``AutoModel.from_pretrained`` loads it with no
  attnviz installed and gets the same outputs, but no speed-up.

``attnviz-pruned.json``::

    {"format": "attnviz-pruned", "version": 1,
     "source": "<model spec pruned>", "family": "bert" | "gpt2" | "llama",
     "architecture": "<transformers class>",
     "sites": [{"stack": "self", "layer": 0,
                "heads": 9, "kv_heads": 3,          # what the weights hold now
                "original_heads": 12,                # before pruning
                "kept_heads": [0, 1, …],             # original index of each kept query head, in order
                "kept_kv_heads": [0, 1, 2],
                "removed_heads": [3, …],             # every removed head (original indices)
                "masked_heads": [5]}, …],            # removed heads kept with zeroed output (GQA)
     "transformers_copy": "transformers-masked" | null}

:meth:`attnviz.models.hf.HFModel.save_pruned` writes it; toy models save themselves in the
toy checkpoint format instead (it holds per-layer head counts itself).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attnviz.common.progress import quiet_third_party
from attnviz.core import AttentionSite
from attnviz.models.base import PRUNED_MARKER, LoadedModel, PrunedCopy
from attnviz.models.identity import original_layout
from attnviz.models.physical import SitePlan, find_attention_blocks, masked_weights_model
from attnviz.outputs.files import staged_directory

FORMAT_NAME = "attnviz-pruned"
FORMAT_VERSION = 1
#: sub-directory of the plain-transformers, masked-weights copy
TRANSFORMERS_COPY = "transformers-masked"


def write_directory_atomically(out: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp_dir)`` in a temporary directory next to ``out``, then move it into place.

    An existing ``out`` (when the caller allows replacing it) is replaced only once the new
    directory is complete; on any error nothing at ``out`` changes.
    """
    with staged_directory(out) as tmp:
        write(tmp)
    return Path(out)


def pruned_metadata(
    source: str,
    original: LoadedModel,
    plans: Mapping[AttentionSite, SitePlan],
    transformers_copy: str | None,
) -> dict:
    """The content of ``attnviz-pruned.json`` (see the module docstring).

    Heads are numbered as in the model ``original`` was pruned from: pruning a pruned checkpoint again
    records the heads by the numbers its own record gave them.
    """
    blocks = find_attention_blocks(original)
    families = {block.family for block in blocks.values()}
    identity = original.head_identity
    sites = []
    for site, plan in sorted(plans.items()):
        block = blocks[site]
        ids = (
            list(range(block.num_heads)) if identity is None else identity.ids(site.stack, site.layer, block.num_heads)
        )
        gone_before = [] if identity is None else identity.masked_ids(site.stack, site.layer)
        full_heads = block.num_heads if identity is None else original_layout({site: block.num_heads}, identity)[site]
        kept = [ids[h] for h in plan.keep_heads]
        masked = sorted({ids[h] for h in plan.masked} | (set(gone_before) & set(kept)))
        entry: dict[str, Any] = {
            "stack": site.stack,
            "layer": site.layer,
            "heads": len(plan.keep_heads),
            "kv_heads": len(plan.keep_kv_heads),
            "original_heads": full_heads,
            "original_kv_heads": block.num_kv_heads if identity is None else None,
            "kept_heads": kept,
            "kept_kv_heads": plan.keep_kv_heads,
            "removed_heads": sorted(set(range(full_heads)) - set(kept) | set(masked)),
            "masked_heads": masked,
        }
        if identity is not None:  # key/value heads are numbered as in the model pruned again: not recorded
            del entry["original_kv_heads"], entry["kept_kv_heads"]
        sites.append(entry)
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "source": source,
        "family": families.pop() if len(families) == 1 else sorted(families),
        "architecture": type(original.model).__name__,
        "sites": sites,
        "transformers_copy": transformers_copy,
    }


@quiet_third_party()  # no "Writing model shards" bar; the caller's settings as they were afterwards
def save_pruned_checkpoint(
    out: str | os.PathLike,
    *,
    source: str,
    original: LoadedModel,
    pruned: LoadedModel,
    plans: Mapping[AttentionSite, SitePlan],
    removed: Mapping[AttentionSite, Sequence[int]],
    transformers_copy: bool = False,
    preprocessor: Any = None,
    save_options: Mapping[str, Any] | None = None,
    extra_files: Mapping[str, str] | None = None,
) -> Path:
    """Write the physically pruned ``pruned`` (and the masked-weights copy) to ``out``, atomically.

    ``out`` must have passed :func:`check_output_dir`. ``preprocessor``: what turns inputs into tensors, saved
    in both directories (default: the tokenizer; a vision model's image processor); ``save_options``: keyword
    arguments of the pruned model's ``save_pretrained``; ``extra_files``: ``{name: text}`` written beside it.
    """
    metadata = pruned_metadata(source, original, plans, TRANSFORMERS_COPY if transformers_copy else None)
    preprocessor = original.tokenizer if preprocessor is None else preprocessor

    def write(tmp: Path) -> None:
        model: Any = pruned.model  # a transformers model: save_pretrained is its own
        model.save_pretrained(tmp, **(save_options or {}))
        preprocessor.save_pretrained(tmp)
        (tmp / PRUNED_MARKER).write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        if transformers_copy:
            masked: Any = masked_weights_model(original, removed)
            masked.save_pretrained(tmp / TRANSFORMERS_COPY)
            preprocessor.save_pretrained(tmp / TRANSFORMERS_COPY)

    return write_directory_atomically(Path(out), write)


def save_pruned_copy(
    out: str | os.PathLike,
    pruned: PrunedCopy,
    *,
    source: str,
    original: LoadedModel,
    transformers_copy: bool = False,
    **options: Any,
) -> tuple[Path, Path | None]:
    """:func:`save_pruned_checkpoint` of what ``original.remove_heads`` made (``options``: its ``preprocessor``,
    ``save_options``, ``extra_files``) -> (the directory, its masked-weights copy or None), as ``save_pruned``
    returns them."""
    path = save_pruned_checkpoint(
        out,
        source=source,
        original=original,
        pruned=pruned.model,
        plans=pruned.plans or {},
        removed=pruned.removed,
        transformers_copy=transformers_copy,
        **options,
    )
    return path, (path / TRANSFORMERS_COPY if transformers_copy else None)
