"""Where a model's weights are, when accelerate placed them (``device_map``): several devices, the CPU or the disk.

A model dispatched by accelerate (``from_pretrained(..., device_map="auto", max_memory=..., offload_folder=...)``)
keeps each offloaded module's weights on the ``meta`` device between calls; the hooks accelerate attached load them
onto the module's execution device for its forward and drop them afterwards. Everything attnviz computes runs the
model's own forward, so captures, statistics and patching work unchanged; what needs care is (1) where inputs go
and (2) code that reads weights directly (output-projection slices, the final norm and unembedding, pruning), which
must load an offloaded module's weights for the duration of the read (:func:`weights_loaded`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

import torch
from torch import nn


def is_dispatched(model: nn.Module) -> bool:
    """Whether accelerate placed ``model`` with a device map (its modules carry accelerate's hooks)."""
    return bool(getattr(model, "hf_device_map", None)) or any(hasattr(module, "_hf_hook") for module in model.modules())


def _execution_device(module: nn.Module) -> torch.device | None:
    hook = getattr(module, "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    if device is None:
        # a SequentialHook holds several hooks; any of them that moves weights names the device
        for inner in getattr(hook, "hooks", ()):
            device = getattr(inner, "execution_device", None)
            if device is not None:
                break
    if device is None:
        return None
    return torch.device(f"cuda:{device}" if isinstance(device, int) else device)


def input_device(model: nn.Module) -> torch.device:
    """The device inputs go to: the execution device of the module that reads them (the input embedding), else
    the first parameter that is not on the meta device, else the CPU."""
    if is_dispatched(model):
        reader = getattr(model, "get_input_embeddings", None)
        embedding = reader() if callable(reader) else None
        for module in ([embedding] if isinstance(embedding, nn.Module) else []) + list(model.modules()):
            device = _execution_device(module)
            if device is not None:
                return device
    for parameter in model.parameters():
        if parameter.device.type != "meta":
            return parameter.device
    return next(model.parameters()).device if any(True for _ in model.parameters()) else torch.device("cpu")


def offloaded(model: nn.Module) -> bool:
    """Whether some weights of a dispatched model are offloaded (on the meta device between calls)."""
    return is_dispatched(model) and any(parameter.device.type == "meta" for parameter in model.parameters())


@contextlib.contextmanager
def weights_loaded(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` with its weights in memory for the duration of the block, then offloaded again.

    For a module that accelerate offloaded (to the CPU or the disk) this loads its weights onto its execution
    device, as its forward does; for any other module it does nothing.
    """
    if not any(hasattr(inner, "_hf_hook") for inner in module.modules()):
        yield module
        return
    from accelerate.utils import align_module_device

    with align_module_device(module):
        yield module


def held_weight(module: nn.Module, name: str) -> torch.Tensor | None:
    """``module``'s parameter ``name``, detached, kept past the call: a copy where accelerate offloaded the module
    (its own tensor goes back to the meta device afterwards), the parameter itself otherwise; None if it has none."""
    if not any(hasattr(inner, "_hf_hook") for inner in module.modules()):
        tensor = getattr(module, name, None)
        return tensor.detach() if isinstance(tensor, torch.Tensor) else None
    with weights_loaded(module):
        tensor = getattr(module, name, None)
        return tensor.detach().clone() if isinstance(tensor, torch.Tensor) else None


@dataclass(frozen=True)
class Placement:
    """How accelerate places a model as it loads: ``from_pretrained``'s ``device_map``, ``max_memory`` and
    ``offload_folder`` (where weights that fit neither a GPU nor ``max_memory["cpu"]`` go, read back per forward)."""

    device_map: str = "auto"
    max_memory: Mapping[int | str, int | str] | None = None
    offload_folder: str | None = None

    def from_pretrained_arguments(self) -> dict[str, Any]:
        arguments: dict[str, Any] = {"device_map": self.device_map}
        if self.max_memory is not None:
            arguments["max_memory"] = dict(self.max_memory)
        if self.offload_folder is not None:
            arguments["offload_folder"] = self.offload_folder
        return arguments


class LoaderOptions(TypedDict, total=False):
    """The keywords every model loader of :mod:`attnviz.models.specs` takes besides the path (see :class:`Loading`)."""

    name: str | None
    device: torch.device | str
    dtype: torch.dtype
    device_map: Placement | None


@dataclass(frozen=True)
class Loading:
    """How a loader puts a model in place: the ``name`` it is shown by (None: its path), the ``device`` and ``dtype``
    of its weights, and accelerate's placement (``device_map``), which takes the place of ``device``."""

    name: str | None = None
    device: torch.device | str = "cpu"
    dtype: torch.dtype = torch.float32
    device_map: Placement | None = None

    def place(self, model: nn.Module) -> nn.Module:
        """``model`` on the device (unless accelerate placed it), in eval mode."""
        if not self.device_map:
            model.to(self.device)
        return model.eval()
