"""Whether a model spec names anything on this machine, decided at once: no torch, no network, nothing loaded.

attnviz reads a hub id from the local Hugging Face cache only; it never downloads (the user asks for a download
with huggingface_hub's own ``hf download ORG/NAME``). So a spec that is no path, no shipped name and no cached hub
id names nothing: :func:`check_model_spec` refuses it with the closest names (``did you mean minilm?``) before
any slow import, instead of transformers retrying the network for half a minute.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from attnviz.common.errors import ModelSpecError

#: the short names of the models shipped in pip packages (``attnviz.models.specs`` says where their files are)
SHORT_NAMES = ("minilm", "smollm2")
#: toy checkpoints shipped in attnviz/sample_data/toy, by the short name a spec may use
SHIPPED_TOYS = {
    "toy-copy": "copy",
    "toy-induction": "induction",
    "toy-previous-token": "previous-token",
    "toy-reverse": "reverse",
    "toy-sort": "sort",
    "toy-odd-patch": "odd-patch",  # a small ViT (attnviz.toy.odd_patch): reads images
    "toy-caption": "caption",  # a small ViT + GPT-2 captioner (attnviz.toy.caption): writes about images
}
SHIPPED_NAMES = (*SHORT_NAMES, *SHIPPED_TOYS)
#: entries of a folder looked at for a misspelled local path (a bigger folder is not worth reading for a hint)
_MOST_ENTRIES = 500


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache: ``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def cached_hub_ids() -> list[str]:
    """Hub ids with a ``models--org--name`` folder in the local Hugging Face cache."""
    root = hub_cache_dir()
    if not root.is_dir():
        return []
    return sorted(folder.name.removeprefix("models--").replace("--", "/") for folder in root.glob("models--*"))


def cached_snapshot(hub_id: str) -> Path | None:
    """The folder of the local Hugging Face cache that holds ``hub_id``'s files (with its ``config.json``), or None.

    The snapshot ``refs/main`` points at when it is complete, else the newest complete one. attnviz loads that
    folder as a local directory, so nothing asks huggingface_hub (which may reach the network even for a cached
    file) for anything.
    """
    repository = hub_cache_dir() / f"models--{hub_id.replace('/', '--')}"
    snapshots = repository / "snapshots"
    try:
        main = (repository / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, ValueError):
        main = ""
    if main and (snapshots / main / "config.json").is_file():
        return snapshots / main
    try:
        complete = [folder for folder in snapshots.iterdir() if (folder / "config.json").is_file()]
    except OSError:
        return None
    return max(complete, key=lambda folder: folder.stat().st_mtime, default=None)


def in_hub_cache(hub_id: str) -> bool:
    """Whether the local Hugging Face cache holds a snapshot of ``hub_id`` with its ``config.json``."""
    return cached_snapshot(hub_id) is not None


def looks_like_hub_id(spec: str) -> bool:
    """``org/name`` or ``name``: letters, digits, ``-_.`` with at most one slash, not a path."""
    return re.fullmatch(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?", spec) is not None


def check_model_spec(spec: str, names: Iterable[str] = SHIPPED_NAMES) -> None:
    """Refuse at once a ``spec`` that names nothing here: no existing path, none of ``names``, no cached hub id.

    Raises :class:`ModelSpecError` with the closest names (shipped names, cached hub ids, entries of the folder a
    path would lie in).
    """
    spec = spec.strip()
    path = Path(spec).expanduser()
    names = list(names)
    if not spec or path.exists() or path.is_symlink() or spec.lower() in names:
        return
    suggestions = closest_names(spec, names)
    hint = f": did you mean {' or '.join(suggestions)}?" if suggestions else ""
    if path.suffix.lower() == ".gguf":
        raise ModelSpecError(f"GGUF file {path} does not exist{hint}")
    if not looks_like_hub_id(spec):
        raise ModelSpecError(f"model path {spec} does not exist{hint}")
    if in_hub_cache(spec):
        return
    download = "ORG/NAME" if suggestions else spec
    raise ModelSpecError(
        f"unknown model {spec!r}{hint} ({spec!r} is no shipped model name, no local path and no hub id in the local "
        f"Hugging Face cache {hub_cache_dir()}; attnviz reads hub ids from that cache and never downloads: fetch one "
        f"first with `hf download {download}`; `attnviz models` lists what loads here)"
    )


_CLOSE_MARGIN = 0.15  # similarity below the best match's that still counts as a tie


def closest_names(spec: str, names: Iterable[str] = SHIPPED_NAMES, most: int = 3) -> list[str]:
    """Up to ``most`` known specs spelled like ``spec``: shipped names, cached hub ids, entries of its folder."""
    candidates = {name.lower(): name for name in [*names, *cached_hub_ids(), *_folder_entries(spec)]}
    matches = difflib.get_close_matches(spec.lower(), list(candidates), n=most, cutoff=0.6)
    if not matches:
        return []
    # a clear winner stands alone: "toy-inductoin" is toy-induction (0.92), not also toy-caption (0.67)
    scores = [difflib.SequenceMatcher(None, match, spec.lower()).ratio() for match in matches]
    return [candidates[match] for match, score in zip(matches, scores) if score >= scores[0] - _CLOSE_MARGIN]


def _folder_entries(spec: str) -> list[str]:
    """Model-like entries (folders, ``.gguf`` files) of the folder ``spec`` would lie in, spelled as paths."""
    path = Path(spec)
    folder = path.parent
    try:
        with os.scandir(folder.expanduser()) as entries:
            found = []
            for index, entry in enumerate(entries):
                if index >= _MOST_ENTRIES:
                    break
                if not entry.name.startswith(".") and (entry.is_dir() or entry.name.lower().endswith(".gguf")):
                    found.append(str(folder / entry.name) if str(folder) != "." else f"./{entry.name}")
            return found
    except OSError:
        return []
