"""GGUF files: convert once to a plain Hugging Face directory, cache it, load that.

De-quantising SmolLM2-135M takes ~20 s on a 2-core machine, and a model
loaded from GGUF refuses ``save_pretrained``; so the first load builds a plain
float32 model from the GGUF weights and saves it (with the tokenizer) under the
user cache directory. Later loads read the cached directory (~1 s).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from attnviz.errors import ModelSpecError
from attnviz.models.hf import load_hf_model
from attnviz.reporting import status


def cache_root() -> Path:
    """``$ATTNVIZ_CACHE`` or ``$XDG_CACHE_HOME/attnviz`` (default ``~/.cache/attnviz``)."""
    if os.environ.get("ATTNVIZ_CACHE"):
        return Path(os.environ["ATTNVIZ_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnviz"


def _cache_key(path: Path) -> str:
    """Name + size + modification time: a changed file gets a fresh conversion."""
    stat = path.stat()
    digest = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return f"{path.stem}-{digest}"


def converted_gguf_dir(path: Path) -> Path:
    """A Hugging Face directory holding ``path``'s weights de-quantised to float32 (cached)."""
    target = cache_root() / "gguf" / _cache_key(path)
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with status(f"converting {path.name} from GGUF (once; cached in {target.parent})"):
        tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
        try:
            _convert(path, tmp)
            if target.exists():  # another process finished first
                shutil.rmtree(tmp)
            else:
                os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert(path: Path, out_dir: Path) -> None:
    import torch
    import transformers

    folder, name = str(path.parent), path.name
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
        quantised = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except ImportError as exc:
        raise ModelSpecError(f"loading GGUF files needs extra packages: pip install gguf accelerate ({exc})") from exc
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelSpecError(f"cannot read GGUF file {path}: {str(exc).splitlines()[0]}") from exc
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict(), strict=False)
    plain.tie_weights()
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def load_gguf(path: Path, *, name: str, device, dtype):
    """Load a ``.gguf`` file: its converted (cached) Hugging Face directory, through :func:`load_hf_model`."""
    return load_hf_model(converted_gguf_dir(Path(path)), name=name, device=device, dtype=dtype)
