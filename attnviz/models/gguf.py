"""GGUF files: convert once to a plain Hugging Face directory, cache it, load that.

De-quantising SmolLM2-135M takes ~20 s on a 2-core machine, and a model
loaded from GGUF refuses ``save_pretrained``; so the first load builds a plain
float32 model from the GGUF weights and saves it (with the tokenizer) under the
user cache directory. Later loads read the cached directory (~1 s). The cache is keyed by
the file's content (size and a hash of its header and tensor index), not its path.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from attnviz.common.cache import cache_root
from attnviz.common.errors import AttnvizError, ModelSpecError, OutputError
from attnviz.common.progress import progress_bar, quiet_third_party, status
from attnviz.models.hf import first_line, load_hf_model
from attnviz.models.placement import Placement
from attnviz.outputs import staging

__all__ = ["cache_root", "converted_gguf_dir"]
#: conversion directories of attnviz versions before the shared temporary prefix (no owner recorded)
_LEGACY_TEMP_PREFIX = ".convert-"
_LEGACY_ABANDONED_SECONDS = 3600


#: GGUF metadata value types (the GGUF specification): fixed sizes in bytes; 8 is a string, 9 an array.
_GGUF_FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
#: Bytes hashed when a file's index cannot be parsed (not a GGUF file attnviz knows).
_FALLBACK_HASH_BYTES = 16 * 2**20


def gguf_index_end(data: bytes) -> int:
    """Byte offset where a GGUF file's header, metadata and tensor index end (the tensor data follows).

    ``data``: the file's first bytes; :class:`IndexError` when the index runs past them.
    Layout (GGUF v2/v3, little endian): magic ``GGUF``, u32 version, u64 tensor count, u64
    metadata count; the metadata key/value pairs; one (name, dims, type, offset) entry per tensor.
    """
    import struct

    view = memoryview(data)
    position = 0

    def read(fmt: str) -> int:
        nonlocal position
        size = struct.calcsize(fmt)
        if position + size > len(view):
            raise IndexError("the GGUF index runs past the bytes read")
        value = struct.unpack_from(fmt, view, position)[0]
        position += size
        return value

    def skip(count: int) -> None:
        nonlocal position
        position += count
        if position > len(view):
            raise IndexError("the GGUF index runs past the bytes read")

    def skip_value(kind: int) -> None:
        if kind in _GGUF_FIXED_SIZES:
            skip(_GGUF_FIXED_SIZES[kind])
        elif kind == _GGUF_STRING:
            skip(read("<Q"))
        elif kind == _GGUF_ARRAY:
            element, count = read("<I"), read("<Q")
            if element in _GGUF_FIXED_SIZES:
                skip(_GGUF_FIXED_SIZES[element] * count)
            else:
                for _ in range(count):
                    skip_value(element)
        else:
            raise ValueError(f"unknown GGUF value type {kind}")

    if bytes(view[:4]) != b"GGUF" or read("<4xI") not in (2, 3):
        raise ValueError("not a GGUF v2/v3 file")
    tensors, entries = read("<Q"), read("<Q")
    for _ in range(entries):
        skip(read("<Q"))  # key
        skip_value(read("<I"))
    for _ in range(tensors):
        skip(read("<Q"))  # name
        skip(8 * read("<I") + 4 + 8)  # dims, type, data offset
    return position


def _index_bytes(handle: BinaryIO, size: int) -> bytes:
    """The header and tensor index of a GGUF file (its first 16 MiB when it cannot be parsed)."""
    chunk = 4 * 2**20
    while True:
        handle.seek(0)
        data = handle.read(chunk)
        try:
            return data[: gguf_index_end(data)]
        except IndexError:
            if chunk >= size:
                return data[:_FALLBACK_HASH_BYTES]
            chunk *= 4
        except (ValueError, OverflowError):
            return data[:_FALLBACK_HASH_BYTES]


def content_key(path: Path) -> str:
    """``{stem}-{digest}``: the digest covers the file size and its header and tensor index.

    The same file copied to another place (another virtual environment) gets the same key, so
    one conversion serves them all; a different model, or different quantisation, changes the
    index and gets its own. Reading the index costs milliseconds, not a pass over the weights.
    """
    digest = hashlib.sha256()
    size = path.stat().st_size
    digest.update(f"size:{size}:".encode())
    try:
        with open(path, "rb") as handle:
            digest.update(_index_bytes(handle, size))
    except OSError as exc:
        raise ModelSpecError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from exc
    return f"{path.stem}-{digest.hexdigest()[:16]}"


def _legacy_key(path: Path) -> str:
    """The key attnviz used before content keys (path + size + modification time)."""
    stat = path.stat()
    digest = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return f"{path.stem}-{digest}"


def _adopt(legacy: Path, target: Path) -> bool:
    """Make a conversion cached under the old path-based key available under the content key.

    Hard links: no copy of the weights, and attnviz versions that still use the old key keep theirs.
    """
    try:
        tmp = staging.new_temp_dir(target.parent, target.name)
    except OSError:
        return False
    try:
        for entry in legacy.iterdir():
            if entry.is_file():
                try:
                    os.link(entry, tmp / entry.name)
                except OSError:
                    shutil.copy2(entry, tmp / entry.name)
        os.replace(tmp, target)
        return True
    except OSError:
        return False
    finally:
        staging.remove_path(tmp)


def _is_complete(directory: Path) -> bool:
    return (directory / "config.json").is_file() and (directory / "model.safetensors").is_file()


def converted_gguf_dir(path: Path) -> Path:
    """A Hugging Face directory holding ``path``'s weights de-quantised to float32 (cached)."""
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise ModelSpecError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from exc
    if magic != b"GGUF":  # refuse before anything is created in the cache
        raise ModelSpecError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
    target = cache_root() / "gguf" / content_key(path)
    _remove_stale_conversions(target.parent)
    if _is_complete(target):
        return target
    legacy = target.parent / _legacy_key(path)
    if _is_complete(legacy) and _adopt(legacy, target):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create attnviz's cache {target.parent}: {exc.strerror or exc}") from exc
    if target.exists():  # incomplete: a directory without its weights is never used
        staging.remove_path(target)
    with status(f"converting {path.name} from GGUF (once; cached in {target.parent})"):
        try:
            tmp = staging.new_temp_dir(target.parent, target.name)
        except OSError as exc:
            raise (staging.output_error(exc, target) or exc) from exc
        try:
            _convert(path, tmp)
            staging.ordinary_permissions(tmp)
            if not target.exists():  # else another process finished first
                os.replace(tmp, target)
        except OSError as exc:
            raise (staging.output_error(exc, target) or exc) from exc
        except AttnvizError:
            raise
        except Exception as exc:
            error = staging.output_error(exc, target)
            if error is None:
                raise
            raise error from exc
        finally:
            staging.remove_path(tmp)
    return target


def _remove_stale_conversions(directory: Path) -> None:
    """Remove conversions a killed process left half-done (SIGKILL, power loss) in the cache."""
    if not directory.is_dir():
        return
    staging.remove_stale_temporaries(directory)
    # Older attnviz versions named them .convert-*, without their owner: removed once clearly abandoned.
    for legacy in directory.glob(f"{_LEGACY_TEMP_PREFIX}*"):
        try:
            abandoned = time.time() - legacy.stat().st_mtime > _LEGACY_ABANDONED_SECONDS
        except OSError:
            continue
        if abandoned:
            staging.remove_path(legacy)


def _tensor_progress(iterable: Iterable[Any], desc: str | None = None, **_: Any) -> Iterator[Any]:
    """Stands in for the ``tqdm`` of transformers' GGUF reader: the tensors advance attnviz's own progress bar."""
    items = list(iterable)
    with progress_bar() as bar:
        task = bar.add_task("de-quantising the GGUF tensors", total=len(items), status="")
        for item in items:
            yield item
            bar.advance(task)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """While converting: transformers' own progress bars and info logs off, its GGUF reader's tensor loop
    on attnviz's progress display; everything as it was afterwards (a caller's settings are left alone)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_reader

    reader_progress = getattr(gguf_reader, "tqdm", None)
    if reader_progress is not None:
        gguf_reader.tqdm = _tensor_progress
    try:
        with quiet_third_party():
            yield
    finally:
        if reader_progress is not None:
            gguf_reader.tqdm = reader_progress


def _convert(path: Path, out_dir: Path) -> None:
    import torch
    import transformers

    folder, name = str(path.parent), path.name
    try:
        with _quiet_transformers():
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name, trust_remote_code=False)
            quantised = transformers.AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, dtype=torch.float32, trust_remote_code=False
            )
    except ImportError as exc:
        raise ModelSpecError(f"loading GGUF files needs extra packages: pip install gguf accelerate ({exc})") from exc
    except Exception as exc:  # gguf, tokenizers and transformers raise many types on a damaged file
        raise ModelSpecError(f"cannot read GGUF file {path}: {first_line(exc)}") from exc
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = quantised.state_dict()
    result = plain.load_state_dict(state, strict=False)
    plain.tie_weights()
    # A key absent from the GGUF is fine only when tying filled it (lm_head ↔ embeddings); else it would be random.
    tensors = dict(plain.state_dict(keep_vars=True))
    loaded = {tensors[key].data_ptr() for key in state if key in tensors}
    untied = sorted(key for key in result.missing_keys if tensors[key].data_ptr() not in loaded)
    if untied or result.unexpected_keys:
        names = ", ".join((untied or sorted(result.unexpected_keys))[:3])
        raise ModelSpecError(
            f"GGUF file {path} does not cover the model: {len(untied)} tensor(s) missing, "
            f"{len(result.unexpected_keys)} unexpected ({names}, …)"
        )
    with _quiet_transformers():  # saving shows a bar of its own
        plain.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)


def load_gguf(path: Path, *, name: str, device, dtype, device_map: Placement | None = None):
    """Load a ``.gguf`` file: its converted (cached) Hugging Face directory, through :func:`load_hf_model`."""
    return load_hf_model(converted_gguf_dir(Path(path)), name=name, device=device, dtype=dtype, device_map=device_map)
