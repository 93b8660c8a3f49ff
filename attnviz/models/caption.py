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

from torch import nn

from attnviz.common.errors import InputError, ModelSpecError, UnsupportedModelError
from attnviz.core import CONTEXT_KWARG, AttentionContext, AttentionSite
from attnviz.models.base import EncodedBatch
from attnviz.models.decoder_side import WritesText, decoder_positions
from attnviz.models.placement import Loading
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


def load_caption_model(source: str, config: Any, loading: Loading) -> CaptionModel:
    """Load a ``VisionEncoderDecoderModel`` with its image processor and tokenizer (see the module docstring), put
    in place as ``loading`` says."""
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
        transformers.VisionEncoderDecoderModel, source, dtype=loading.dtype, device_map=loading.device_map
    )
    drop_missing_poolers(model, info)  # an encoder saved without its pooler (it plays no part in attention)
    check_loading_info(info, source, buffers=(buffer for buffer, _ in model.named_buffers()))
    extra_kinds = VISION_FAMILIES[encoder_type](config.encoder)
    loaded = CaptionModel(loading.place(model), processor, tokenizer, name=loading.name or source,
                          extra_kinds=extra_kinds)  # fmt: skip
    loaded.check_weights()
    loaded.image_task = image_task_of(source)
    check_image_size(processor, config.encoder, source)
    loaded.layout()  # a probe pass: refuses a decoder whose attention does not reach the core, checks the grid
    return loaded


def check_image_size(processor: Any, encoder_config: Any, source: str) -> None:
    """:class:`UnsupportedModelError` when the image processor makes pictures of another size than the encoder
    takes (the model loads; every picture would be refused): which file says which size, and how to agree them."""
    size = getattr(processor, "crop_size", None) if getattr(processor, "do_center_crop", False) else None
    size = size or getattr(processor, "size", None)
    made = tuple(
        size.get(side) if isinstance(size, dict) else getattr(size, side, None) for side in ("height", "width")
    )
    side = getattr(encoder_config, "image_size", None)
    expected = (side, side) if isinstance(side, int) else tuple(side) if side else (None, None)
    if None in made or None in expected or tuple(made) == tuple(expected):
        return
    raise UnsupportedModelError(
        f"captioner {source!r}: its image processor makes {made[0]}×{made[1]} pictures (preprocessor_config.json) "
        f"but its encoder takes {expected[0]}×{expected[1]} (image_size in config.json): make the two agree"
    )


class CaptionModel(VisionModel, WritesText):
    """A ``VisionEncoderDecoderModel``: reads an image, writes (or is given) a caption; stacks encoder, decoder, cross."""

    encoder_decoder = True

    def __init__(self, model: nn.Module, processor: Any, tokenizer: Any, *, name: str, extra_kinds: tuple[str, ...]):
        super().__init__(model, processor, name=name, extra_kinds=extra_kinds)
        self.tokenizer = tokenizer
        #: decoder positions (start token + caption tokens); None when the decoder has no limit
        self.max_length = decoder_positions(self.model.config.decoder)

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

    # -- encoding (the decoder side: attnviz.models.decoder_side) ---------------------------------------

    def encode_images(
        self,
        images: Sequence[Image],
        *,
        targets: Sequence[str] | None = None,
        token_ids: Sequence[Sequence[int]] | None = None,
    ) -> EncodedBatch:
        """The images (as :meth:`VisionModel.encode_images`) and the decoder's side: the start token, then each
        caption's tokens (teacher forcing), from ``targets`` (texts) or ``token_ids``; else the start token alone."""
        return self.add_decoder_side(super().encode_images(images), targets, token_ids)

    def encode_source(self, batch: EncodedBatch, context: AttentionContext) -> Any:
        """The image encoder's output on ``batch``'s pictures."""
        return self.model.encoder(pixel_values=batch.inputs["pixel_values"], **self.context_arguments(context))

    def decoder_arguments(self, context: AttentionContext) -> dict[str, Any]:
        return {"decoder_" + CONTEXT_KWARG: context}

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
