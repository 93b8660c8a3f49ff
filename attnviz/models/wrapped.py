"""A transformers model the user already holds, run through attnviz's core only while attnviz uses it.

:func:`wrap` takes a model loaded by the user (``AutoModel.from_pretrained(...)``, fine-tuned, in half
precision, on a GPU, dispatched with ``device_map``, in train or eval mode) and returns a
:class:`~attnviz.models.base.LoadedModel`. Nothing about the user's model changes for good: each
attnviz call that runs it (capture, statistics, probes, pruning's scoring, generation, the atlas)
enters :meth:`WrappedModel.running`, which

* switches every config of the model to attnviz's attention function (``config._attn_implementation``
  and those of its sub-models), and puts every module in eval mode (no dropout in a capture);
* puts back, on the way out, exactly the implementation names and per-module training flags it found.

So the model computes bit-identical outputs before and after, and ``model.config._attn_implementation``
is what the user set. The tokenizer is copied (attnviz pads on the right and needs a pad token; the
user's tokenizer keeps its own settings).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import nn

from attnviz.common.errors import InputError, UnsupportedModelError
from attnviz.common.progress import quiet_third_party
from attnviz.core import ATTENTION_NAME, AttentionContext, register_attention
from attnviz.models.audio import AudioModel, check_audio_processor
from attnviz.models.audio_families import reads_audio
from attnviz.models.base import EncodedBatch
from attnviz.models.hf import HFModel
from attnviz.models.hf_checks import refuse_unreadable_family
from attnviz.models.placement import offloaded
from attnviz.models.vlm import VisionLanguageModel
from attnviz.models.vlm_families import VLM_FAMILIES, is_vision_language_type, vision_language_family


class _OnCoreWhileRunning:
    """What a model the user holds needs: attnviz's core switched in only inside :meth:`running` (see the module
    docstring). Mixed in before a loaded-model class, whose ``forward`` it runs inside :meth:`running`."""

    model: Any
    name: str
    #: the configs (top-level and sub-model configs) whose attention implementation attnviz switches
    _configs: list[Any]
    _depth: int = 0  # nesting of running(): only the outermost switches and restores

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The model on attnviz's core, in eval mode; its own implementation and modes are restored afterwards."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.check_loaded()
        implementations = [config._attn_implementation_internal for config in self._configs]
        # only the modules in training mode are switched and restored (a model in eval mode, the usual case, is not
        # walked again: setting every module's flag costs more than a short input's forward)
        training = [module for module in self.model.modules() if module.training]
        self._depth = 1
        try:
            for config in self._configs:
                config._attn_implementation_internal = ATTENTION_NAME
            if training:
                self.model.eval()
            yield
        finally:
            self._depth = 0
            for config, implementation in zip(self._configs, implementations):
                config._attn_implementation_internal = implementation
            for module in training:
                module.training = True  # the flag itself: train() would also set the children

    def check_loaded(self) -> None:
        """Refuse a model whose weights are on the meta device (laid out, never loaded): nothing can run it."""
        if not any(parameter.device.type == "meta" for parameter in self.model.parameters()):
            return
        if offloaded(self.model):
            return  # accelerate's hooks load the offloaded weights for each forward
        raise UnsupportedModelError(
            f"the weights of {self.name} are on the meta device (a model laid out but not loaded): load them "
            "first (from_pretrained without init_empty_weights, or model.to_empty(device=...) then "
            "load_state_dict), then call attnviz again"
        )

    def forward(self, batch: EncodedBatch, context: AttentionContext | None = None, *, logits: bool = False):
        with self.running():
            return super().forward(batch, context, logits=logits)  # type: ignore[misc]  # the loaded-model class


class WrappedModel(_OnCoreWhileRunning, HFModel):
    """A user's transformers model; attnviz's core is switched in only inside :meth:`running`."""

    def __init__(self, model: nn.Module, tokenizer: Any, *, name: str, configs: list[Any]):
        super().__init__(model, tokenizer, name=name, fallback=False)
        self._configs = configs

    def with_model(self, model: nn.Module) -> WrappedModel:
        """A copy made by attnviz (a pruned model) keeps the user's attention implementation, wrapped the same way."""
        return WrappedModel(model, self.tokenizer, name=self.name, configs=_attention_configs(model))


class WrappedVisionLanguageModel(_OnCoreWhileRunning, VisionLanguageModel):
    """A user's vision-language model with its processor; attnviz's core is switched in only inside :meth:`running`."""

    def __init__(self, model: nn.Module, processor: Any, family: Any, *, name: str, configs: list[Any]):
        super().__init__(model, processor, family, name=name)
        self._configs = configs

    def vision_tower(self):
        raise InputError(
            f"{self.name} is a vision-language model you hold: give a text with the image; for its vision tower's "
            "attention, wrap the tower itself (attnviz.wrap is for the whole model) or load the saved directory"
        )

    def with_model(self, model: nn.Module) -> WrappedVisionLanguageModel:
        return WrappedVisionLanguageModel(
            model, self.processor, self.family, name=self.name, configs=_attention_configs(model)
        )


class WrappedAudioModel(_OnCoreWhileRunning, AudioModel):
    """A user's Whisper with its processor; attnviz's core is switched in only inside :meth:`running`."""

    def __init__(self, model: nn.Module, processor: Any, *, name: str, configs: list[Any]):
        super().__init__(model, processor, name=name)
        self._configs = configs

    def with_model(self, model: nn.Module) -> WrappedAudioModel:
        return WrappedAudioModel(model, self.processor, name=self.name, configs=_attention_configs(model))


def wrap(model: nn.Module, tokenizer: Any = None, *, name: str | None = None) -> HFModel:
    """Make a transformers model the user loaded usable by every attnviz function that takes a loaded model.

    ``tokenizer``: the model's tokenizer, or a vision-language model's processor (tokenizer and image processor:
    then it reads pictures inside its texts; with a tokenizer alone it reads text only), or Whisper's processor
    (feature extractor and tokenizer: it reads audio); when None, the one saved
    with the model (``model.name_or_path``) is loaded. ``name``: shown in titles and reports (default: the
    model's ``name_or_path``). The model is not changed: attnviz switches it onto its core only
    while one of its own calls runs (see the module docstring). Families that do not call
    transformers' attention interface raise :class:`~attnviz.common.errors.UnsupportedModelError`.
    """
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise InputError(
            f"attnviz.wrap takes a transformers model (a PreTrainedModel such as AutoModel.from_pretrained(...)), "
            f"got {type(model).__name__}; for patterns another tool computed, use "
            "AttentionCapture.from_attentions(attentions, tokens)"
        )
    register_attention()
    family = getattr(model.config, "model_type", type(model).__name__)
    name = name or _default_name(model)
    refuse_unreadable_family(model.config, type(model), name)
    configs = _attention_configs(model)
    loaded: WrappedModel | WrappedVisionLanguageModel | WrappedAudioModel
    if reads_audio(family):  # Whisper: its processor (feature extractor and tokenizer), given or saved with it
        processor = tokenizer if tokenizer is not None else _saved_processor(model, "feature_extractor")
        check_audio_processor(processor, name)
        loaded = WrappedAudioModel(model, copy.deepcopy(processor), name=name, configs=configs)
    elif _is_processor(tokenizer) and is_vision_language_type(model.config):  # reads pictures inside its texts
        kind = _wrappable_family(model.config, name)  # refuses, by name, a family attnviz cannot map
        loaded = WrappedVisionLanguageModel(model, copy.deepcopy(tokenizer), kind, name=name, configs=configs)
    elif tokenizer is None and model.config.model_type in VLM_FAMILIES and _saved_processor(model) is not None:
        kind = _wrappable_family(model.config, name)
        loaded = WrappedVisionLanguageModel(model, _saved_processor(model), kind, name=name, configs=configs)
    else:  # a language model (a vision-language model given a tokenizer reads text only)
        loaded = WrappedModel(model, _own_tokenizer(model, tokenizer), name=name, configs=configs)
    if not configs or not type(model)._can_set_attn_implementation():
        raise _unsupported(family)
    loaded.check_loaded()
    loaded.check_vocabulary()  # ids past the embedding table would fail deep inside torch
    try:
        layout = loaded.layout()  # a probe forward pass inside running(): did attention calls reach the core?
    except (ValueError, KeyError, TypeError) as exc:
        raise _unsupported(family) from exc
    if not layout:
        raise _unsupported(family)
    return loaded


def _default_name(model: nn.Module) -> str:
    """The hub id the model came from, or the last two parts of its local folder (``…/minilm/model``), or its class."""
    source = str(getattr(model, "name_or_path", "") or "")
    if not source:
        return type(model).__name__
    path = Path(source)
    return "/".join(path.parts[-2:]) if path.is_absolute() else source


def _wrappable_family(config: Any, name: str) -> Any:
    """The vision-language family of ``config``; refused, by name, where attnviz cannot map it or reads it from its
    directory only (a picture read through cross-attention layers)."""
    kind = vision_language_family(config, name)
    if kind.cross_attention:
        raise UnsupportedModelError(
            f"{name} reads its picture through cross-attention layers: attnviz reads such a model from its saved "
            "directory (model.save_pretrained(directory); processor.save_pretrained(directory))"
        )
    return kind


def _unsupported(family: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{family} models do not call transformers' attention interface, so attnviz cannot run them through its "
        f"core: load the checkpoint with attnviz.load_model(path) instead (eager attention, slower), or capture "
        "outputs.attentions yourself and use AttentionCapture.from_attentions"
    )


def _attention_configs(model: nn.Module) -> list[Any]:
    """Every config whose ``_attn_implementation`` the model's attention modules read: the top-level one,
    its sub-configs at any depth, and those of sub-models (deduplicated by identity; configs are not hashable)."""
    found: dict[int, Any] = {}
    pending = [model.config] + [getattr(m, "config", None) for m in model.modules() if hasattr(m, "config")]
    while pending:
        config = pending.pop()
        if config is None or id(config) in found or not hasattr(config, "_attn_implementation_internal"):
            continue
        found[id(config)] = config
        pending.extend(getattr(config, key, None) for key in getattr(config, "sub_configs", {}) or {})
    return list(found.values())


def _is_processor(value: Any) -> bool:
    """Whether ``value`` is a multimodal processor: a tokenizer and an image processor together."""
    return getattr(value, "image_processor", None) is not None and getattr(value, "tokenizer", None) is not None


def _saved_processor(model: nn.Module, part: str = "image_processor") -> Any:
    """The processor saved with ``model`` (``model.name_or_path``) when it has ``part`` (an image processor, a
    feature extractor) and a tokenizer, else None."""
    source = getattr(model, "name_or_path", "") or ""
    if not source:
        return None
    try:
        from transformers import AutoProcessor

        with quiet_third_party():
            processor = AutoProcessor.from_pretrained(source, trust_remote_code=False, local_files_only=True)
    except Exception:  # noqa: BLE001 - no processor: the model reads text only
        return None
    return processor if getattr(processor, part, None) is not None and hasattr(processor, "tokenizer") else None


def _own_tokenizer(model: nn.Module, tokenizer: Any) -> Any:
    """A copy of ``tokenizer`` (or of the one saved with the model) that attnviz may set padding on."""
    if tokenizer is None:
        source = getattr(model, "name_or_path", "") or ""
        try:
            from transformers import AutoTokenizer

            with quiet_third_party():
                tokenizer = (
                    AutoTokenizer.from_pretrained(source, trust_remote_code=False, local_files_only=True)
                    if source
                    else None
                )
        except Exception:  # noqa: BLE001 - any failure means the same thing to the user
            tokenizer = None
        if tokenizer is None:
            raise InputError(
                f"no tokenizer was given and none could be loaded from {source or 'the model'!r}: "
                "call attnviz.wrap(model, tokenizer)"
            )
    if not callable(tokenizer) or not hasattr(tokenizer, "convert_ids_to_tokens"):
        raise InputError(f"attnviz.wrap needs the model's transformers tokenizer, got {type(tokenizer).__name__}")
    return copy.deepcopy(tokenizer)


__all__ = ["WrappedAudioModel", "WrappedModel", "WrappedVisionLanguageModel", "wrap"]
