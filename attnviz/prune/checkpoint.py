"""Pruned checkpoints on disk: writing them safely (:mod:`attnviz.models.pruned` loads them back).

``attnviz prune … --out DIR`` writes, for a Hugging Face model:

* ``DIR/`` — the **physically pruned** checkpoint: ``config.json`` (the original
  configuration, unchanged), ``model.safetensors`` with the smaller weights,
  the tokenizer files, and ``attnviz-pruned.json`` (the marker; see below).
  Layers may keep different numbers of heads, which a transformers config
  cannot express, so plain ``transformers`` refuses this directory (size
  mismatch); ``attnviz.models.specs.load_model(DIR)`` — and every attnviz
  command — loads it through :func:`load_pruned_model`.
* ``DIR/transformers-masked/`` — the **masked-weights** form (unless disabled):
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

Toy models are written with ``attnviz.toy.save_toy_model`` instead (the toy
format holds per-layer head counts itself).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from attnviz.core import AttentionSite
from attnviz.errors import OutputParameterError
from attnviz.io import check_output_parent, staged_directory
from attnviz.models.base import LoadedModel
from attnviz.models.physical import SitePlan, find_attention_blocks, masked_weights_model
from attnviz.models.pruned import FORMAT_NAME, FORMAT_VERSION, PRUNED_MARKER

#: sub-directory of the plain-transformers, masked-weights copy
TRANSFORMERS_COPY = "transformers-masked"


# -- the output directory ----------------------------------------------------------------------------


def model_source_paths(spec: str, loaded: LoadedModel | None = None) -> list[Path]:
    """Files and directories a model was read from (the pruned output must never touch them)."""
    paths = []
    spec_path = Path(spec).expanduser()
    if spec_path.exists():
        paths.append(spec_path.resolve())
    if loaded is not None:
        source = getattr(getattr(loaded.model, "config", None), "_name_or_path", None) or getattr(
            loaded.model, "name_or_path", None
        )
        if source and Path(source).exists():
            paths.append(Path(source).resolve())
        if getattr(loaded, "checkpoint_path", None):
            paths.append(Path(loaded.checkpoint_path).resolve())
    return paths


def check_output_dir(out: str | os.PathLike, *, force: bool, inputs: list[Path] = ()) -> Path:
    """Validate ``--out`` before any work: a new or empty directory, or ``force``; never an input.

    Raises :class:`OutputError`.
    """
    out = Path(out).expanduser()
    resolved = out.resolve()
    for source in inputs:
        source_dir = source if source.is_dir() else source.parent
        if resolved == source or resolved == source_dir or source_dir in resolved.parents or resolved in source.parents:
            raise OutputParameterError(
                "out", f"{{out}} {out} would overwrite the input model at {source}: choose another directory", out
            )
    if out.exists() and not out.is_dir():
        raise OutputParameterError("out", f"{{out}} {out} is a file, not a directory: choose a directory path", out)
    if out.is_dir() and any(out.iterdir()) and not force:
        raise OutputParameterError(
            "out", f"{{out}} {out} exists and is not empty: choose a new directory or add {{force}} to replace it", out
        )
    check_output_parent(resolved)
    return out


def write_directory_atomically(out: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp_dir)`` in a temporary directory next to ``out``, then move it into place.

    An existing ``out`` (allowed by ``--force``) is replaced only once the new
    directory is complete; on any error nothing at ``out`` changes.
    """
    with staged_directory(out) as tmp:
        write(tmp)
    return Path(out)


# -- writing -----------------------------------------------------------------------------------------


def pruned_metadata(
    source: str,
    original: LoadedModel,
    plans: Mapping[AttentionSite, SitePlan],
    transformers_copy: str | None,
) -> dict:
    """The content of ``attnviz-pruned.json`` (see the module docstring)."""
    blocks = find_attention_blocks(original)
    families = {block.family for block in blocks.values()}
    sites = []
    for site, plan in sorted(plans.items()):
        block = blocks[site]
        sites.append(
            {
                "stack": site.stack,
                "layer": site.layer,
                "heads": len(plan.keep_heads),
                "kv_heads": len(plan.keep_kv_heads),
                "original_heads": block.num_heads,
                "original_kv_heads": block.num_kv_heads,
                "kept_heads": plan.keep_heads,
                "kept_kv_heads": plan.keep_kv_heads,
                "removed_heads": plan.removed,
                "masked_heads": plan.masked,
            }
        )
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "source": source,
        "family": families.pop() if len(families) == 1 else sorted(families),
        "architecture": type(original.model).__name__,
        "sites": sites,
        "transformers_copy": transformers_copy,
    }


def save_pruned_checkpoint(
    out: str | os.PathLike,
    *,
    source: str,
    original: LoadedModel,
    pruned: LoadedModel,
    plans: Mapping[AttentionSite, SitePlan],
    removed: Mapping[AttentionSite, list[int]],
    transformers_copy: bool = True,
) -> Path:
    """Write the physically pruned ``pruned`` (and the masked-weights copy) to ``out``, atomically.

    ``out`` must have passed :func:`check_output_dir`.
    """
    metadata = pruned_metadata(source, original, plans, TRANSFORMERS_COPY if transformers_copy else None)

    def write(tmp: Path) -> None:
        pruned.model.save_pretrained(tmp)
        pruned.tokenizer.save_pretrained(tmp)
        (tmp / PRUNED_MARKER).write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")
        if transformers_copy:
            masked = masked_weights_model(original, removed)
            masked.save_pretrained(tmp / TRANSFORMERS_COPY)
            original.tokenizer.save_pretrained(tmp / TRANSFORMERS_COPY)

    return write_directory_atomically(Path(out), write)


def save_toy_checkpoint(out: str | os.PathLike, pruned: LoadedModel) -> Path:
    """Write a pruned toy model to ``out`` atomically (the toy checkpoint format)."""
    from attnviz.toy.checkpoint import write_checkpoint_files

    return write_directory_atomically(Path(out), lambda tmp: write_checkpoint_files(pruned, tmp))
