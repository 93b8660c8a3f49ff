"""Loading a physically pruned Hugging Face checkpoint written by ``attnviz prune``.

Layers of a pruned checkpoint may keep different numbers of heads, which a transformers config
cannot express: the model is built at full size from ``config.json``, each attention site is
shrunk to the head counts recorded in ``attnviz-pruned.json`` (its format is described in
:mod:`attnviz.models.pruned_format`, which writes it), and then the weights are read. A pruned vision
classifier reads its image processor in place of a tokenizer (:mod:`attnviz.models.vision_pruning`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file
from torch import nn

from attnviz.common.errors import AttnvizError, ModelSpecError
from attnviz.common.progress import quiet_third_party
from attnviz.core import ATTENTION_NAME, register_attention
from attnviz.models.base import PRUNED_MARKER, LoadedModel
from attnviz.models.hf import HFModel
from attnviz.models.hf_checks import first_line, refuse_custom_code
from attnviz.models.hf_loading import model_class_for
from attnviz.models.physical import find_attention_blocks, shrink_to_counts
from attnviz.models.placement import LoaderOptions, Loading
from attnviz.models.pruned_format import FORMAT_NAME, FORMAT_VERSION
from attnviz.models.pruning_records import RecordError, identity_from_marker
from attnviz.models.vision import VisionModel
from attnviz.models.vision_families import VISION_FAMILIES, image_task_of, is_vision_type, load_image_processor

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11


def read_pruned_metadata(path: str | os.PathLike) -> dict:
    """``attnviz-pruned.json`` of a pruned checkpoint directory, checked."""
    marker = Path(path) / PRUNED_MARKER
    try:
        metadata = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelSpecError(f"{marker} is not readable JSON ({exc}): prune the model again") from exc
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT_NAME:
        raise ModelSpecError(f"{marker} is not an attnviz pruned-checkpoint marker: prune the model again")
    if metadata.get("version") != FORMAT_VERSION:
        raise ModelSpecError(
            f"{marker} has format version {metadata.get('version')}; this attnviz reads version {FORMAT_VERSION}"
        )
    return metadata


def _state_dict(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelSpecError(f"{path} has no .safetensors weights: prune the model again")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except Exception as exc:  # SafetensorError on a damaged header, OSError on a truncated file
            raise ModelSpecError(f"{file} is not a readable safetensors file ({exc}): prune the model again") from exc
    return state


def _check_missing(model: nn.Module, missing: list[str], loaded_keys: set[str], path: Path) -> None:
    """Keys absent from the file are fine only when they are tied to a loaded tensor (e.g. lm_head ↔ embeddings)."""
    tensors = dict(model.state_dict(keep_vars=True))
    loaded_storage = {tensors[key].data_ptr() for key in loaded_keys if key in tensors}
    untied = [key for key in missing if tensors[key].data_ptr() not in loaded_storage]
    if untied:
        raise ModelSpecError(f"{path} lacks weights {', '.join(untied[:3])}…: prune the model again")


def _disagrees(path: Path, what: str) -> ModelSpecError:
    return ModelSpecError(
        f"{path / PRUNED_MARKER} does not describe the model beside it: {what}; prune the model again"
    )


def _check_shapes(model: nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """Refuse weights whose shapes differ from those the record's head counts make (before loading them)."""
    expected = model.state_dict()
    for key, tensor in state.items():
        if key in expected and tuple(tensor.shape) != tuple(expected[key].shape):
            raise _disagrees(
                path,
                f"the weights hold {key} as {list(tensor.shape)}, but the head counts it records make it "
                f"{list(expected[key].shape)}",
            )


@quiet_third_party()  # transformers' loading bars off for this call only
def load_pruned_model(path: str | os.PathLike, **options: Unpack[LoaderOptions]) -> LoadedModel:
    """Load a physically pruned checkpoint written by ``attnviz prune`` (see the module docstring); ``options``:
    where it goes (:class:`~attnviz.models.placement.Loading`; accelerate's placement does not apply)."""
    import transformers  # here, under quiet_third_party: a first import in a notebook warns about ipywidgets
    from transformers.initialization import no_init_weights

    loading = Loading(**options)  # the registry gives it no device_map: a pruned checkpoint loads whole
    path = Path(path).expanduser()
    metadata = read_pruned_metadata(path)
    refuse_custom_code(str(path))
    register_attention()
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), trust_remote_code=False)
        vision = is_vision_type(getattr(config, "model_type", ""))  # reads images: an image processor, no tokenizer
        tokenizer = None if vision else transformers.AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except AttnvizError:
        raise
    except Exception as exc:  # OSError, ValueError, tokenizers' own exceptions on a damaged tokenizer.json, …
        raise ModelSpecError(f"cannot load pruned model {path}: {first_line(exc)}") from exc
    processor = load_image_processor(str(path)) if vision else None

    def wrap(model: nn.Module) -> LoadedModel:
        if vision:
            return wrap_pruned_vision(model, processor, path, loading.name)
        loaded = HFModel(model, tokenizer, name=loading.name or str(path))
        loaded.checkpoint_path = str(path)
        return loaded

    cls = model_class_for(config)
    with no_init_weights():  # every weight is read from the file below
        model = cls._from_config(config, attn_implementation=ATTENTION_NAME, dtype=loading.dtype)
    model.eval()
    blocks = find_attention_blocks(wrap(model))  # the full-size model the record describes
    try:
        identity, counts = identity_from_marker(metadata, {s: (b.num_heads, b.num_kv_heads) for s, b in blocks.items()})
    except RecordError as exc:
        raise _disagrees(path, str(exc)) from exc
    shrink_to_counts(wrap(model), counts, blocks)
    state = _state_dict(path)
    _check_shapes(model, state, path)
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        raise ModelSpecError(f"the weights in {path} do not fit its attnviz-pruned.json: {exc}") from exc
    if result.unexpected_keys:
        raise ModelSpecError(f"{path} has unexpected weights {', '.join(result.unexpected_keys[:3])}…")
    if result.missing_keys and hasattr(model, "tie_weights"):
        model.tie_weights()  # e.g. lm_head shares the embedding matrix and is not stored separately
    _check_missing(model, result.missing_keys, set(state), path)
    loaded = wrap(loading.place(model))  # dtype was set at construction (rotary buffers stay float32)
    loaded.head_identity = identity
    loaded.check_weights()
    if vision:
        loaded.layout()  # a probe forward pass that checks the patch grid against the patterns
    return loaded


def wrap_pruned_vision(model: Any, processor: Any, path: Path, name: str | None) -> VisionModel:
    """A vision model built from the pruned checkpoint ``path`` (and its image processor) as a :class:`VisionModel`."""
    kinds = VISION_FAMILIES[model.config.model_type](model.config)
    loaded = VisionModel(model, processor, name=name or str(path), extra_kinds=kinds)
    loaded.image_task = image_task_of(str(path))
    loaded.checkpoint_path = str(path)
    return loaded
