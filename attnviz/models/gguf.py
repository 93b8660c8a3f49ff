"""GGUF files: convert once to a plain Hugging Face directory, cache it, load that.

De-quantising SmolLM2-135M takes ~20 s on a 2-core machine, and a model
loaded from GGUF refuses ``save_pretrained``; so the first load builds a plain
float32 model from the GGUF weights and saves it (with the tokenizer) under the
user cache directory. Later loads read the cached directory (~1 s).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from attnviz import staging
from attnviz.errors import AttnvizError, ModelSpecError, OutputError
from attnviz.io import cache_root
from attnviz.models.hf import first_line, load_hf_model
from attnviz.reporting import status

__all__ = ["cache_root", "converted_gguf_dir"]
#: conversion directories of attnviz versions before the shared temporary prefix (no owner recorded)
_LEGACY_TEMP_PREFIX = ".convert-"
_LEGACY_ABANDONED_SECONDS = 3600


def _cache_key(path: Path) -> str:
    """Name + size + modification time: a changed file gets a fresh conversion."""
    stat = path.stat()
    digest = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return f"{path.stem}-{digest}"


def converted_gguf_dir(path: Path) -> Path:
    """A Hugging Face directory holding ``path``'s weights de-quantised to float32 (cached)."""
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise ModelSpecError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from exc
    if magic != b"GGUF":  # refuse before anything is created in the cache
        raise ModelSpecError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
    target = cache_root() / "gguf" / _cache_key(path)
    _remove_stale_conversions(target.parent)
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
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
            raise staging.output_error(exc, target) from exc
        try:
            _convert(path, tmp)
            staging.ordinary_permissions(tmp)
            if not target.exists():  # else another process finished first
                os.replace(tmp, target)
        except OSError as exc:
            raise staging.output_error(exc, target) from exc
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


def _convert(path: Path, out_dir: Path) -> None:
    import torch
    import transformers

    folder, name = str(path.parent), path.name
    transformers.utils.logging.disable_progress_bar()  # attnviz shows its own status line
    transformers.utils.logging.set_verbosity_error()
    try:
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
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def load_gguf(path: Path, *, name: str, device, dtype, device_map: str | None = None):
    """Load a ``.gguf`` file: its converted (cached) Hugging Face directory, through :func:`load_hf_model`."""
    return load_hf_model(converted_gguf_dir(Path(path)), name=name, device=device, dtype=dtype, device_map=device_map)
