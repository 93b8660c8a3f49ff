"""Hugging Face models running on attnviz's attention core."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnviz.common.errors import AttnvizError, ModelSpecError, UnsupportedModelError
from attnviz.common.parallel import SINGLE_PROCESS, DataParallel
from attnviz.common.progress import quiet_third_party, warn
from attnviz.core import ATTENTION_NAME, CONTEXT_KWARG, AttentionContext, AttentionSite, register_attention
from attnviz.models.base import EncodedBatch, LoadedModel, PrunedCopy
from attnviz.models.caption import is_captioner_type, load_caption_model
from attnviz.models.head_output_edits import replay_fallback, run_editing
from attnviz.models.head_outputs import OutputProjection, find_output_projections
from attnviz.models.hf_checks import (
    check_config_against_weights,
    check_loading_info,
    first_line,
    refuse_custom_code,
    refuse_unreadable_family,
    running_on_text,
)
from attnviz.models.hf_encoding import encode_texts
from attnviz.models.hf_inputs import text_probe_batches, text_timing_batch
from attnviz.models.hf_loading import load_hf_weights, model_class_for, switch_to_eager
from attnviz.models.hf_patching import (
    check_hf_patching,
    hf_answer_position,
    hf_head_output_weights,
    hf_readout,
    hf_vocabulary_tokens,
)
from attnviz.models.objective import LanguageModelObjective, Objective, RepresentationObjective, has_lm_head
from attnviz.models.physical import find_attention_blocks, prune_heads_physically
from attnviz.models.placement import Loading, Placement
from attnviz.models.probing import ProbeBatch
from attnviz.models.pruned_format import save_pruned_copy
from attnviz.models.readers import ResidualReaders
from attnviz.models.readout import Readout
from attnviz.models.repeats import find_repeated_stacks
from attnviz.models.vision import load_vision_model
from attnviz.models.vision_families import is_vision_type

# Module-name fragments that mark a cross-attention module (BERT decoder, BART/Marian/Whisper, T5, NLLB-MoE).
_CROSS_NAMES = ("crossattention", "encoder_attn", "encdecattention", "cross_attn", "cross_attention")


@quiet_third_party()  # transformers' loading bars and tqdm's widget warning off for this call only
def load_hf_model(
    source: str | os.PathLike,
    *,
    name: str | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    gguf_file: str | None = None,
    device_map: Placement | None = None,
    kind: type[HFModel] | None = None,
    load_tokenizer: Callable[[str], Any] | None = None,
) -> HFModel:
    """Load a Hugging Face model (directory or hub id) onto attnviz's attention core.

    ``kind``: the class that wraps it (default :class:`HFModel`), and ``load_tokenizer`` what reads its tokenizer
    (default: transformers' ``AutoTokenizer``): an audio model's loader gives its own class and its processor.

    Families that do not call transformers' attention interface (gpt_neo, bloom, …)
    fall back to ``eager`` attention with ``output_attentions``, with a warning;
    head masks are not available on them. ``device_map`` (e.g. ``"auto"``) is handed to
    ``from_pretrained`` (accelerate's big-model placement) instead of moving the model to ``device``.
    """
    import transformers

    source = str(source)
    register_attention()
    refuse_custom_code(source)
    # Never run code shipped with a model, and never ask on stdin whether to; a hub id is read from the local
    # cache only (attnviz never downloads: no network retries before an error).
    extra: dict[str, Any] = {"trust_remote_code": False, "local_files_only": True}
    if gguf_file:
        extra["gguf_file"] = gguf_file
    placement = device_map.from_pretrained_arguments() if device_map else {}
    loading = Loading(name=name, device=device, dtype=dtype, device_map=device_map)
    try:
        config = transformers.AutoConfig.from_pretrained(source, **extra)
        if not gguf_file and is_vision_type(getattr(config, "model_type", "")):  # images, not text
            return load_vision_model(source, config, loading)  # type: ignore[return-value]
        if not gguf_file and is_captioner_type(getattr(config, "model_type", "")):  # images in, text out
            return load_caption_model(source, config, loading)  # type: ignore[return-value]
        refuse_unreadable_family(config, model_class_for(config), source)  # before its tokenizer is looked for
        if load_tokenizer is not None:
            tokenizer = load_tokenizer(source)
        else:
            tokenizer = transformers.AutoTokenizer.from_pretrained(source, **extra)
    except AttnvizError:
        raise
    except Exception as exc:  # OSError, ValueError, tokenizers' own exceptions on a damaged tokenizer.json, …
        raise ModelSpecError(
            f"cannot load model {source!r}: {first_line(exc)} "
            "(give a local model directory, a .gguf file, a hub id in the local cache, or 'minilm'/'smollm2')"
        ) from exc
    check_config_against_weights(config, source)
    cls = model_class_for(config)
    model, info, fallback = load_hf_weights(cls, source, dtype=dtype, extra=extra, placement=placement)
    check_loading_info(info, source, buffers=(name for name, _ in model.named_buffers()))
    if not device_map:  # accelerate has placed the layers itself
        model.to(device)
    model.eval()
    make = kind or HFModel
    loaded = make(model, tokenizer, name=name or source, fallback=fallback)
    loaded.check_weights()  # before the first forward pass (the layout below) reads them
    with running_on_text(config.model_type, source):  # the probe passes below: a model that needs more than text
        if not fallback and (model.config._attn_implementation != ATTENTION_NAME or _misses_stacks(loaded)):
            # The name was accepted but no attention call (or none of a whole stack: BigBird-Pegasus' encoder)
            # reached the core: the family, or that stack, does not use the interface.
            switch_to_eager(model)
            loaded = make(model, tokenizer, name=name or source, fallback=True)
        loaded.layout()
    if not loaded.layout():
        kinds = sorted({str(kind) for kind in getattr(config, "layer_types", None) or ()})
        raise UnsupportedModelError(
            f"{name or source} has no softmax attention in any layer"
            + (f" (its layers are {', '.join(kinds)})" if kinds else "")
            + ": no attention pattern to show; attnviz shows models with at least one attention layer"
        )
    if loaded.fallback:
        warn(
            f"{config.model_type} models do not route through transformers' attention interface: "
            "using eager attention with output_attentions (slower; head masks unavailable)"
        )
    return loaded


class HFModel(LoadedModel):
    """A transformers model whose attention runs through attnviz's core."""

    #: the pruned checkpoint directory this model was read from (set by :mod:`attnviz.models.pruned`)
    checkpoint_path: str | None = None
    #: a transformers ``PreTrainedModel``: its config and submodules differ by family, so it is typed Any
    model: Any

    def __init__(self, model: nn.Module, tokenizer: Any, *, name: str, fallback: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.fallback = fallback
        config: Any = model.config
        self.encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        self.causal = not self.encoder_decoder and _is_causal(model)
        limit = getattr(config, "max_position_embeddings", None)
        if not isinstance(limit, int) and hasattr(config, "get_text_config"):  # a vision-language model's LM's
            limit = getattr(config.get_text_config(), "max_position_embeddings", None)
        if not isinstance(limit, int) or limit <= 0:
            limit = getattr(tokenizer, "model_max_length", None)
        self.max_length = limit if isinstance(limit, int) and 0 < limit < 1_000_000 else None
        if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert") and self.max_length:
            self.max_length -= 2  # RoBERTa-style position ids start after the padding index
        if tokenizer.pad_token is None:
            # Decoder-only tokenizers often have no pad token; padding is masked out anyway.
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        tokenizer.padding_side = "right"
        self._sites: dict[nn.Module, AttentionSite | None] = {}
        self._output_projections: dict[AttentionSite, OutputProjection] | None = None
        self._module_names = {module: name for name, module in model.named_modules()}
        #: stacks whose attention modules run more than once per forward pass (ALBERT's shared layer, a looped
        #: block): their sites are numbered by call order, as eager's ``output_attentions`` numbers them.
        #: None until the first forward pass finds them.
        self._repeated_stacks: frozenset[str] | None = None
        self._calls: dict[str, int] = {}  # stack -> attention calls so far in the current forward pass

    # -- naming attention sites -------------------------------------------------------------

    def check_weights(self) -> None:
        """Also refuse a tokenizer whose ids run past the embedding table (they would index outside it)."""
        super().check_weights()
        self.check_vocabulary()

    def check_vocabulary(self) -> None:
        """Refuse a tokenizer whose ids run past the embedding table (they would index outside it)."""
        embeddings = self.model.get_input_embeddings()
        rows = getattr(embeddings, "num_embeddings", None)
        if isinstance(rows, int) and len(self.tokenizer) > rows:
            raise ModelSpecError(
                f"the tokenizer of model {self.name!r} has {len(self.tokenizer):,} tokens but its embedding table "
                f"only {rows:,} rows: ids past the table cannot be read; give the tokenizer that came with the weights"
            )

    def with_model(self, model: nn.Module) -> HFModel:
        return HFModel(model, self.tokenizer, name=self.name, fallback=self.fallback)

    def head_output_projections(self) -> dict[AttentionSite, Tensor]:
        from attnviz.models.head_weights import hf_head_output_projections

        return hf_head_output_projections(self)

    def rotary_frequencies(self) -> Tensor | None:
        from attnviz.models.head_weights import hf_rotary_frequencies

        return hf_rotary_frequencies(self.model)

    def check_head_removal(self) -> None:
        if self.repeated_stacks():
            raise UnsupportedModelError(
                f"{self.name} applies the same attention weights at several layers ({self.model.config.model_type}: "
                "shared or looped layers), so a head cannot be removed from one layer without removing it from all"
            )
        find_attention_blocks(self)  # raises UnsupportedModelError for a family without slicing rules

    def remove_heads(self, removed: Mapping[AttentionSite, Sequence[int]]) -> tuple[LoadedModel, dict]:
        return prune_heads_physically(self, removed)

    def check_generation(self) -> None:
        if self.fallback:
            raise UnsupportedModelError(
                f"{self.model.config.model_type} models do not route through attnviz's attention core, "
                "so their generation cannot be captured step by step"
            )
        if not (self.causal or self.encoder_decoder) or not has_lm_head(self):
            raise UnsupportedModelError(
                f"{self.name} has no language-model head (an encoder such as BERT cannot write text): "
                "use a causal LM such as smollm2 or an encoder-decoder model"
            )

    # -- causal analysis (attnviz.models.hf_patching) ------------------------------------------

    def check_patching(self) -> None:
        check_hf_patching(self)

    def vocabulary_tokens(self, text: str) -> tuple[list[int], list[str]]:
        return hf_vocabulary_tokens(self, text)

    def answer_position(self, batch: EncodedBatch, index: int) -> int:
        return hf_answer_position(self, batch, index)

    def head_output_weights(self) -> dict[AttentionSite, tuple[torch.Tensor, torch.Tensor | None]]:
        return hf_head_output_weights(self)

    def readout(self) -> Readout | None:
        return hf_readout(self)

    def residual_readers(self) -> ResidualReaders:
        from attnviz.models.hf_readers import hf_residual_readers

        return hf_residual_readers(self)

    def check_objective(self) -> None:
        if self.encoder_decoder:
            raise UnsupportedModelError(
                f"{self.name} is an encoder-decoder model: attnviz prune supports encoder-only and decoder-only "
                "Hugging Face models and attnviz toy models"
            )
        if self.fallback:
            raise UnsupportedModelError(
                f"{self.name} does not route through transformers' attention interface, so attnviz cannot "
                "mask or prune its heads"
            )

    def objective(
        self, batches: list[EncodedBatch], *, probes: int = 8, seed: int = 0, parallel: DataParallel = SINGLE_PROCESS
    ) -> Objective:
        """Next-token loss for a causal LM with its LM head, else the label-free representation distortion."""
        self.check_objective()
        if self.causal and has_lm_head(self):
            return LanguageModelObjective(self, batches, parallel=parallel)
        return RepresentationObjective(self, batches, probes=probes, seed=seed, parallel=parallel)

    def timing_batch(self, tokens: int, *, texts: Sequence[str], seed: int = 0) -> EncodedBatch:
        return text_timing_batch(self, texts, tokens)

    def probe_batches(self, length: int, sequences: int, *, seed: int, batch_size: int) -> list[ProbeBatch]:
        return text_probe_batches(self, length, sequences, seed=seed, batch_size=batch_size)

    def save_pruned(
        self, directory: str | os.PathLike, pruned: PrunedCopy, *, source: str, transformers_copy: bool = False
    ) -> tuple[Path, Path | None]:
        """The pruned-checkpoint format of :mod:`attnviz.models.pruned_format` (with the masked-weights copy)."""
        return save_pruned_copy(directory, pruned, source=source, original=self, transformers_copy=transformers_copy)

    def source_paths(self) -> list[Path]:
        sources = [getattr(self.model.config, "_name_or_path", None) or getattr(self.model, "name_or_path", None)]
        sources.append(self.checkpoint_path)
        return [Path(source).resolve() for source in sources if source and Path(source).exists()]

    def site_of(self, module: nn.Module) -> AttentionSite | None:
        """The module's site: its layer number from its name, or, in a stack whose modules run several times per
        forward pass, the call's place in the pass (each application is a layer of its own)."""
        if module not in self._sites:
            self._sites[module] = self._site_from_name(self._module_names.get(module, ""), module)
        site = self._sites[module]
        if site is None or not self._repeated_stacks or site.stack not in self._repeated_stacks:
            return site
        layer = self._calls.get(site.stack, 0)
        self._calls[site.stack] = layer + 1
        return AttentionSite(site.stack, layer)

    def repeated_stacks(self) -> frozenset[str]:
        """The stacks whose attention modules run more than once per forward pass (:mod:`attnviz.models.repeats`)."""
        if self._repeated_stacks is None:
            self._repeated_stacks = frozenset()  # the probe pass below must not look for them again
            if not self.fallback:
                self._repeated_stacks = find_repeated_stacks(self)
        return self._repeated_stacks

    def _site_from_name(self, qualified_name: str, module: nn.Module) -> AttentionSite | None:
        """``model.layers.12.self_attn`` -> self.12; ``decoder.block.3.layer.1.EncDecAttention`` -> cross.3."""
        numbers = re.findall(r"(?:^|\.)(\d+)(?:\.|$)", qualified_name)
        if not numbers:
            return None
        layer = int(numbers[0])
        if not self.encoder_decoder:
            return AttentionSite("self", layer)
        lowered = qualified_name.lower()
        if getattr(module, "is_cross_attention", False) or any(part in lowered for part in _CROSS_NAMES):
            return AttentionSite("cross", layer)
        parts = lowered.split(".")  # "decoder", or a named one: SeamlessM4T's "text_decoder"
        return AttentionSite("decoder" if any("decoder" in part for part in parts) else "encoder", layer)

    # -- encoding (attnviz.models.hf_encoding) ----------------------------------------------------

    def token_counts(self, texts: Sequence[str], *, max_length: int | None = None) -> list[int]:
        encoded = self.tokenizer(
            list(texts), add_special_tokens=True, verbose=False
        )  # lengths past the limit are ours to report
        return [len(ids) for ids in encoded["input_ids"]]

    encode = encode_texts  # (texts, *, targets, max_length, truncate): attnviz.models.hf_encoding

    # -- running --------------------------------------------------------------------------------

    def forward(self, batch: EncodedBatch, context: AttentionContext | None = None, *, logits: bool = False):
        """Run the model. Without ``logits`` the base model runs (no vocabulary projection)."""
        self.repeated_stacks()  # found once, before the first pass that names sites
        self._calls = {}  # a repeated module's applications are counted from the start of each pass
        module = self.model if logits else self.model.base_model
        if self.encoder_decoder and not hasattr(module, "decoder") and not hasattr(module, "get_decoder"):
            module = self.model
        kwargs: dict[str, Any] = dict(batch.inputs)
        if "use_cache" in _forward_parameters(module):
            kwargs["use_cache"] = False
        if context is not None and context.head_mask is not None and self.fallback:
            raise UnsupportedModelError(
                f"{self.model.config.model_type} models do not route through transformers' attention "
                "interface, so attnviz cannot mask their heads"
            )

        def run(context: AttentionContext | None, values: dict[AttentionSite, Tensor]) -> Any:
            if not self.fallback:
                # always a context: the core names each call's site, which tells a decoder's causal self-attention
                kwargs[CONTEXT_KWARG] = context if context is not None else self.context()
                return module(**kwargs)
            outputs = module(**kwargs, output_attentions=context is not None)
            if context is not None:
                replay_fallback(outputs, context, self.encoder_decoder, values)
            return outputs

        return run_editing(self.name, self.output_projections, context, fallback=self.fallback, run=run)

    def output_projections(self) -> dict[AttentionSite, OutputProjection]:
        """Every site's output projection and how its input holds the heads (found once, on a probe)."""
        if self._output_projections is None:
            self._output_projections = find_output_projections(self, fallback=self.fallback)
        return self._output_projections


def _misses_stacks(loaded: HFModel) -> bool:
    """Whether the probe pass found no attention site at all, or, in an encoder-decoder model, none of one stack."""
    found = {site.stack for site in loaded.layout()}
    return not found or (loaded.encoder_decoder and not {"encoder", "decoder", "cross"} <= found)


def _forward_parameters(module: nn.Module) -> set[str]:
    import inspect

    return set(inspect.signature(module.forward).parameters)


def _is_causal(model: nn.Module) -> bool:
    """Decoder-only models: the class is a causal LM, the config says decoder, or attention modules are causal."""
    if type(model).__name__.endswith("ForCausalLM") or getattr(model.config, "is_decoder", False):
        return True
    return any(getattr(m, "is_causal", False) is True for m in model.modules())
