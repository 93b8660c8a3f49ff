"""Image captioners (transformers' ``VisionEncoderDecoderModel``) on attnviz's attention core.

A captioner is a vision transformer (ViT, DeiT, DINOv2, …: :mod:`attnviz.models.vision`) whose image
tokens a text decoder with cross-attention (GPT-2, BERT, …) reads while it writes. attnviz sees it as
an encoder-decoder model whose source side is the image: stack ``encoder`` is the image's
self-attention over the extra tokens and the patches ``r{row}c{col}``, ``decoder`` the caption's causal
self-attention, ``cross`` each caption token's attention over the image tokens.

The directory holds the model, its image processor (``preprocessor_config.json``) and the decoder's
tokenizer. A caption given as text is fed after the decoder start token (teacher forcing): its token
``t`` is the query whose output predicts token ``t + 1``, so the word at position ``t`` was *written* by
the query at ``t - 1``. Other image-to-text families (BLIP, GIT, …) are refused by name before
anything is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from attnviz.common.errors import InputError, ModelSpecError, UnsupportedModelError
from attnviz.core import CONTEXT_KWARG, AttentionContext, AttentionSite
from attnviz.models.base import EncodedBatch
from attnviz.models.placement import Placement
from attnviz.models.vision import VisionModel
from attnviz.models.vision_families import (
    VISION_FAMILIES,
    check_vision_family,
    image_task_of,
    load_image_processor,
    load_weights_on_core,
)

if TYPE_CHECKING:
    from PIL.Image import Image

#: the model_type of transformers' captioner
CAPTIONER_TYPE = "vision-encoder-decoder"
#: image-to-text families attnviz refuses, by model_type, with the reason
REFUSED_CAPTIONERS = {
    "blip": "BLIP's text decoder keeps its own attention classes, outside transformers' attention interface",
    "blip-2": "BLIP-2 passes the image through a Q-Former into a language model: no image token reaches its decoder",
    "instructblip": "InstructBLIP passes the image through a Q-Former: no image token reaches its decoder",
    "git": "GIT concatenates image and text tokens in one self-attention, with no cross-attention to show",
    "pix2struct": "Pix2Struct reads variable-resolution patch sequences that attnviz cannot map onto a grid",
    "kosmos-2": "Kosmos-2 feeds resampled image embeddings to a language model, not a patch grid",
    "idefics": "IDEFICS resamples the image (Perceiver) before its language model reads it",
    "florence2": "Florence-2's DaViT encoder attends within windows, not over the whole image",
    "vision-text-dual-encoder": "a dual encoder writes no text: load its vision tower on its own",
}
#: module-name fragments that mark a cross-attention module (GPT-2, BERT, TrOCR, BART-style decoders)
_CROSS_NAMES = ("crossattention", "encoder_attn", "encdecattention", "cross_attn")


def is_captioner_type(model_type: str) -> bool:
    """Whether ``model_type`` is an image-to-text family attnviz reads or refuses by name."""
    return model_type == CAPTIONER_TYPE or model_type in REFUSED_CAPTIONERS


def load_caption_model(
    source: str,
    config: Any,
    *,
    name: str | None,
    device: torch.device | str,
    dtype: torch.dtype,
    device_map: Placement | None = None,
) -> CaptionModel:
    """Load a ``VisionEncoderDecoderModel`` with its image processor and tokenizer (see the module docstring)."""
    import transformers

    from attnviz.models.hf_checks import check_loading_info, drop_missing_poolers, first_line

    model_type = config.model_type
    reason = REFUSED_CAPTIONERS.get(model_type)
    if reason is not None:
        raise UnsupportedModelError(
            f"model {source!r} is a {model_type} model, which attnviz cannot show: {reason}. attnviz reads "
            "image captioners built as VisionEncoderDecoderModel (a ViT-style encoder and a decoder with cross-attention)"
        )
    encoder_type = getattr(getattr(config, "encoder", None), "model_type", "")
    check_vision_family(encoder_type, source)
    if encoder_type not in VISION_FAMILIES:
        raise UnsupportedModelError(
            f"model {source!r} is a captioner whose image encoder is a {encoder_type or 'unknown'} model, which attnviz "
            "cannot map onto a patch grid: it reads ViT, DeiT, DINOv2 and CLIP/SigLIP vision encoders"
        )
    processor = load_image_processor(source)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except Exception as exc:
        raise ModelSpecError(
            f"cannot load the tokenizer of captioner {source!r}: {first_line(exc)} (save the decoder's tokenizer "
            "into the model directory with tokenizer.save_pretrained(directory))"
        ) from exc
    model, info = load_weights_on_core(
        transformers.VisionEncoderDecoderModel, source, dtype=dtype, device_map=device_map
    )
    drop_missing_poolers(model, info)  # an encoder saved without its pooler (it plays no part in attention)
    check_loading_info(info, source, buffers=(buffer for buffer, _ in model.named_buffers()))
    if not device_map:
        model.to(device)
    model.eval()
    extra_kinds = VISION_FAMILIES[encoder_type](config.encoder)
    loaded = CaptionModel(model, processor, tokenizer, name=name or source, extra_kinds=extra_kinds)
    loaded.check_weights()
    loaded.image_task = image_task_of(source)
    loaded.layout()  # a probe pass: refuses a decoder whose attention does not reach the core, checks the grid
    return loaded


class CaptionModel(VisionModel):
    """A ``VisionEncoderDecoderModel``: reads an image, writes (or is given) a caption; stacks encoder, decoder, cross."""

    encoder_decoder = True

    def __init__(self, model: nn.Module, processor: Any, tokenizer: Any, *, name: str, extra_kinds: tuple[str, ...]):
        super().__init__(model, processor, name=name, extra_kinds=extra_kinds)
        self.tokenizer = tokenizer
        decoder_config = self.model.config.decoder
        limit = next(
            (
                getattr(decoder_config, field)
                for field in ("max_position_embeddings", "n_positions", "max_target_positions")
                if isinstance(getattr(decoder_config, field, None), int)
            ),
            None,
        )
        #: decoder positions (start token + caption tokens); None when the decoder has no limit
        self.max_length = limit if isinstance(limit, int) and 0 < limit < 1_000_000 else None

    def check_patching(self) -> None:
        raise UnsupportedModelError(
            f"{self.name} is a captioner: patching runs two text prompts through the model, and a captioner reads "
            "an image (its heads' outputs can still be weighed by norm)"
        )

    @property
    def patch_size(self) -> tuple[int, int]:
        size = getattr(self.model.config.encoder, "patch_size", 0)
        height, width = (size, size) if isinstance(size, int) else tuple(size or (0, 0))
        return int(height), int(width)

    @property
    def start_id(self) -> int:
        """The decoder start token (the config's ``decoder_start_token_id``, else the tokenizer's BOS)."""
        for source in (self.model.config, getattr(self.model, "generation_config", None)):
            value = getattr(source, "decoder_start_token_id", None)
            if value is not None:
                return int(value)
        value = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.tokenizer.cls_token_id
        if value is None:
            raise UnsupportedModelError(
                f"{self.name}: its config names no decoder_start_token_id and its tokenizer no BOS token, so the "
                "caption cannot start"
            )
        return int(value)

    # -- encoding -----------------------------------------------------------------------------

    def encode_images(
        self,
        images: Sequence[Image],
        *,
        targets: Sequence[str] | None = None,
        token_ids: Sequence[Sequence[int]] | None = None,
    ) -> EncodedBatch:
        """The images (as :meth:`VisionModel.encode_images`) and the decoder's side: the start token, then each
        caption's tokens (teacher forcing), from ``targets`` (texts) or ``token_ids``; else the start token alone."""
        batch = super().encode_images(images)
        start = self.start_id
        if token_ids is not None:
            rows = [[start, *ids] for ids in token_ids]
        elif targets is None:
            rows = [[start] for _ in range(len(batch))]
        else:
            targets = list(targets)
            if len(targets) != len(batch):
                raise InputError(f"give one caption per image ({len(batch)} images, {len(targets)} captions)")
            rows = []
            for target in targets:
                if not target.strip():
                    raise InputError("the caption is empty: give at least one word")
                rows.append([start, *self.caption_ids(target)])
        if len(rows) != len(batch):
            raise InputError(f"give one caption per image ({len(batch)} images, {len(rows)} captions)")
        self.check_caption_length(max(len(row) for row in rows), "the caption")
        width = max(len(row) for row in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else start
        ids = torch.full((len(rows), width), pad, dtype=torch.long)  # [b, t], padded on the right
        mask = torch.zeros((len(rows), width), dtype=torch.long)  # [b, t]
        for index, row in enumerate(rows):
            ids[index, : len(row)] = torch.tensor(row)
            mask[index, : len(row)] = 1
        batch.inputs["decoder_input_ids"] = ids.to(self.device)
        batch.inputs["decoder_attention_mask"] = mask.to(self.device)
        labelled = [self.caption_tokens(row) for row in rows]
        batch.target_tokens = [tokens for tokens, _, _ in labelled]
        batch.target_special = [special for _, special, _ in labelled]
        batch.target_word_ids = [words for _, _, words in labelled]
        return batch

    def caption_ids(self, target: str) -> list[int]:
        """The token ids of caption ``target``; :class:`InputError` naming the words the tokenizer does not know
        (each would be its unknown token: the overlays of ``<unk>`` say nothing of the word)."""
        ids = list(self.tokenizer(target, add_special_tokens=False)["input_ids"])
        unknown_id = getattr(self.tokenizer, "unk_token_id", None)
        if unknown_id is None or unknown_id not in ids:
            return ids
        unknown = [
            word for word in target.split() if unknown_id in self.tokenizer(word, add_special_tokens=False)["input_ids"]
        ]
        vocabulary = sorted(
            token
            for token in self.tokenizer.get_vocab()
            if token not in set(getattr(self.tokenizer, "all_special_tokens", ()))
        )
        known = f": it knows {', '.join(vocabulary)}" if len(vocabulary) <= 40 else ""
        raise InputError(
            f"{self.name} does not know the word{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(word) for word in unknown or [target])} of the caption (each would be read as "
            f"{self.tokenizer.unk_token}){known}"
        )

    def caption_tokens(self, ids: Sequence[int]) -> tuple[list[str], list[bool], list[int | None]]:
        """(token strings, special flags, word ids) of decoder token ``ids``."""
        from attnviz.common.tokens import token_strings, word_ids_from_markers

        tokens = token_strings(self.tokenizer, ids)  # byte-level tokens decoded, as every model encodes
        special_ids = set(self.tokenizer.all_special_ids) | {self.start_id}
        special = [token_id in special_ids for token_id in ids]
        return tokens, special, word_ids_from_markers(tokens, special)

    def check_caption_length(self, positions: int, what: str) -> None:
        """Refuse ``positions`` decoder positions (start token included) beyond what the decoder allows."""
        if self.max_length is not None and positions > self.max_length:
            raise InputError(
                f"{what} needs {positions} decoder positions (the start token included), but {self.name}'s decoder "
                f"allows {self.max_length}: give a shorter caption"
            )

    # -- running ------------------------------------------------------------------------------

    def forward(self, batch: EncodedBatch, context: AttentionContext | None = None, *, logits: bool = False):
        """Encode the image and run the decoder over the caption; the context reaches encoder and decoder."""
        if "pixel_values" not in batch.inputs:
            raise InputError(f"{self.name} is a captioner: give it an image (--image PATH), not text")
        kwargs: dict[str, Any] = dict(batch.inputs)
        kwargs["use_cache"] = False
        if context is not None:
            kwargs.update(self.context_arguments(context))
        with self.cross_context(context):
            return self.model(**kwargs)

    def context_arguments(self, context: AttentionContext) -> dict[str, AttentionContext]:
        """The forward's arguments that carry ``context``: VisionEncoderDecoderModel hands ``decoder_*`` arguments
        to the decoder and the rest to the encoder."""
        return {CONTEXT_KWARG: context, "decoder_" + CONTEXT_KWARG: context}

    def cross_context(self, context: AttentionContext | None):
        """``context`` on the cross-attention modules for the duration of a call: some decoders (GPT-2) run their
        cross-attention without the forward's keyword arguments."""
        from attnviz.core.hf import context_on_modules

        modules = [module for module in self.model.modules() if getattr(self.site_of(module), "stack", "") == "cross"]
        return context_on_modules(modules, context)

    def layout(self) -> dict[AttentionSite, int]:
        """Heads per site, from a probe pass on a grey image; refuses a decoder whose attention misses the core."""
        if self._layout is None:
            batch = self.probe_batch()
            patterns = self.probe_patterns(batch)
            stacks = {site.stack for site in patterns}
            for stack, what in (("encoder", "image encoder"), ("decoder", "decoder"), ("cross", "cross-attention")):
                if stack not in stacks:
                    raise UnsupportedModelError(
                        f"{self.name}: its {what}'s attention does not go through transformers' attention interface, "
                        "so attnviz cannot read it"
                    )
            self.check_grid_covers(batch, patterns[AttentionSite("encoder", 0)].shape[-1], "image attention")
            self._layout = {site: pattern.shape[1] for site, pattern in sorted(patterns.items())}
        return self._layout

    def site_of(self, module: nn.Module) -> AttentionSite | None:
        """``encoder.encoder.layer.3.attention.attention`` -> encoder.3; ``decoder.transformer.h.1.crossattention``
        -> cross.1; ``decoder.transformer.h.1.attn`` -> decoder.1."""
        if module not in self._sites:
            qualified = self._module_names.get(module, "")
            numbers = re.findall(r"(?:^|\.)(\d+)(?:\.|$)", qualified)
            side = qualified.split(".", 1)[0]
            site = None
            if numbers and side in ("encoder", "decoder"):
                cross = side == "decoder" and (
                    getattr(module, "is_cross_attention", False) or any(n in qualified.lower() for n in _CROSS_NAMES)
                )
                site = AttentionSite("cross" if cross else side, int(numbers[0]))
            self._sites[module] = site
        return self._sites[module]

    # -- what a captioner does and does not do ---------------------------------------------------

    def check_generation(self) -> None:
        """A captioner writes text."""

    def with_model(self, model: nn.Module) -> CaptionModel:
        copy = CaptionModel(model, self.processor, self.tokenizer, name=self.name, extra_kinds=self.extra_kinds)
        copy.image_task, copy.source = self.image_task, self.source
        return copy

    def check_objective(self) -> None:
        raise UnsupportedModelError(
            f"{self.name} is an image captioner: attnviz prune supports encoder-only and decoder-only models and "
            "image classifiers"
        )

    def check_head_removal(self) -> None:
        self.check_objective()

    def remove_heads(self, removed):
        self.check_objective()
        raise AssertionError("unreachable")


def captioner_of(loaded) -> CaptionModel:
    """``loaded`` itself when it writes captions; a one-line error otherwise."""
    if isinstance(loaded, CaptionModel):
        return loaded
    if isinstance(loaded, VisionModel):
        raise InputError(
            f"{loaded.name} is an image encoder: it writes no text, so a caption (--target, --generate) needs an "
            "image captioner (a VisionEncoderDecoderModel, or toy-caption)"
        )
    raise InputError(
        f"{loaded.name} is a text model: a captioned image needs an image captioner "
        "(a VisionEncoderDecoderModel, or toy-caption)"
    )
