"""What a bug report needs: versions, the device, the fused kernel's state and where the caches live.

``attnviz env`` prints :func:`describe_environment`; a notebook can show it too. Nothing here loads
a model, builds the kernel or writes a file.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

#: distributions whose versions matter to attnviz, in the order they are listed
PACKAGES = (
    "attnviz",
    "torch",
    "transformers",
    "safetensors",
    "tokenizers",
    "accelerate",
    "gguf",
    "typer",
    "rich",
    "triton",
)


@dataclass
class Environment:
    """One machine as attnviz sees it. Every field is plain data (``to_dict`` gives JSON)."""

    python: str
    platform: str
    versions: dict[str, str]  # distribution -> version ("not installed")
    device: dict[str, Any]  # cpu capability, cores, threads, cuda
    kernel: dict[str, str]  # state, why, build_directory
    caches: dict[str, str]  # what -> path
    #: device -> what computes its statistics pass: the CPU's fused tile kernel, Triton's on a GPU, or torch
    kernels: dict[str, str] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)  # attnviz's environment variables that are set

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe_environment() -> Environment:
    """Versions of attnviz and what it runs on, the device, the fused kernel's state and why, the caches."""
    import torch

    from attnviz.common.cache import cache_root
    from attnviz.common.parallel import physical_cores
    from attnviz.core.kernel import describe_kernel
    from attnviz.core.triton_launch import launches_path

    cuda = torch.cuda.is_available()
    device: dict[str, Any] = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "physical_cores": physical_cores(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda or "none",
        "gpus": [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())] if cuda else [],
    }
    state, why, directory = describe_kernel()
    from torch.utils.cpp_extension import get_default_build_root

    try:
        from huggingface_hub import constants

        hub_cache = str(constants.HF_HUB_CACHE)
    except ImportError:  # pragma: no cover - transformers depends on it
        hub_cache = "unknown"
    caches = {
        "attnviz": str(cache_root()),
        "converted GGUF models": str(cache_root() / "gguf"),
        "kernel builds": str(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()),
        "GPU kernel launches": str(launches_path()),
        "Hugging Face hub": hub_cache,
    }
    variables = {
        name: value
        for name, value in sorted(os.environ.items())
        if name.startswith("ATTNVIZ_") or name in ("HF_HUB_OFFLINE", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
    }
    return Environment(
        python=sys.version.split()[0],
        platform=platform.platform(),
        versions={name: _version(name) for name in PACKAGES},
        device=device,
        kernel={"state": state, "why": why, "build_directory": str(directory) if directory else ""},
        kernels=_kernels_per_device(state, why, cuda),
        caches=caches,
        variables=variables,
    )


def _kernels_per_device(state: str, why: str, cuda: bool) -> dict[str, str]:
    """What computes the statistics pass on each device (see :mod:`attnviz.core.triton_rows` for the GPU's)."""
    from attnviz.core.kernel import kernel_disabled
    from attnviz.core.triton_launch import tuning_enabled
    from attnviz.core.triton_rows import float32_precision, triton_available

    if state in ("loaded", "built"):
        cpu = "fused tile kernel"
    elif state in ("not built", "building"):
        cpu = f"fused tile kernel, once built ({why})"
    else:
        cpu = f"torch operations (fused kernel {state}" + (f": {why})" if why else ")")
    kernels = {"cpu": cpu}
    if cuda:
        if kernel_disabled():
            gpu = "torch operations (fused kernels disabled by ATTNVIZ_KERNEL=0)"
        elif triton_available():
            products = {"tf32x3": "three TF32 products", "ieee": "full precision"}[float32_precision()]
            launches = "timed on the GPU on first use" if tuning_enabled() else "from attnviz's table"
            gpu = f"Triton tile kernel (float32 products: {products}; launches {launches})"
        else:
            gpu = "torch operations (Triton is not installed: pip install triton)"
        kernels["cuda"] = gpu
    return kernels
