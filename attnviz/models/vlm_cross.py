"""Vision-language models that read the picture through cross-attention layers (Mllama) on attnviz's core.

Mllama's text holds one placeholder token for the picture; its language model reads the picture through
*cross-attention layers* between its self-attention layers (Llama 3.2 Vision 11B: every fifth layer). attnviz reads
it as a captioner (:mod:`attnviz.models.caption`) whose source side is the picture:

* ``tokens`` are the picture's keys in the model's order, tile by tile: each tile's class token, then its patches,
  named by their place on the whole canvas ``r{row}c{col}``; then the tokens of the empty tiles the model has room
  for and masks (``[PAD]``). ``image_grid`` says how (:class:`~attnviz.common.images.ImageGrid` with ``tiles``,
  ``padding`` and ``placeholder``, the text position of the placeholder token);
* ``target_tokens`` are the text;
* stack ``decoder`` is the text's causal self-attention, stack ``cross`` each text token's attention over the
  picture's keys, both numbered by the model's own layers (the self-attention layers lack the cross-attention
  layers' numbers and the other way round). The vision tower runs through the core too, unrecorded.

A text token before the placeholder reads no tile: the model leaves its row unmasked, so its cross-attention
spreads over every key, the empty tiles' too (what eager attention computes); the model then drops that row's
feed-forward output. Each cross-attention layer scales its output by ``tanh`` of a learned gate: the direct logit
attribution of its heads includes that gate; norm weighting is ``α_ij·‖W_O^h v_j‖`` as for every head.

A text without a picture skips the cross-attention layers: attnviz reads this model with its picture only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from attnviz.common.errors import InputError, UnsupportedModelError
from attnviz.common.images import ImageGrid
from attnviz.core import AttentionSite
from attnviz.models.base import EncodedBatch
from attnviz.models.vision import displayed_pixels
from attnviz.models.vlm import VisionLanguageModel, same_grid

if TYPE_CHECKING:
    from PIL.Image import Image


class CrossAttentionVisionLanguageModel(VisionLanguageModel):
    """A vision-language model whose text reads the picture through cross-attention layers (see the module)."""

    def __init__(self, model: nn.Module, processor: Any, family: Any, *, name: str):
        super().__init__(model, processor, family, name=name)
        self.encoder_decoder = True  # the picture on the source side, the text on the target side
        self.causal = False  # its text's self-attention is the causal decoder stack

    def with_model(self, model: nn.Module) -> CrossAttentionVisionLanguageModel:
        return CrossAttentionVisionLanguageModel(model, self.processor, self.family, name=self.name)

    def stacks(self) -> tuple[str, ...]:
        return ("decoder", "cross")

    def _site_from_name(self, qualified_name: str, module: nn.Module) -> AttentionSite | None:
        """``model.language_model.layers.3.cross_attn`` -> cross.3, ``….layers.4.self_attn`` -> decoder.4; the
        vision tower's layers are not recorded."""
        site = super()._site_from_name(qualified_name, module)
        if site is None:
            return None
        stack = "cross" if qualified_name.endswith("cross_attn") else "decoder"
        return AttentionSite(stack, site.layer)

    def encode(self, texts: Sequence[str], **_: Any) -> EncodedBatch:
        raise InputError(
            f"{self.name} reads a text with its picture (its cross-attention layers read nothing without one): give "
            'an image with the text (attnviz heatmap --model MODEL "Describe the picture." --image FILE)'
        )

    def encode_images(self, images: Sequence[Image], *, texts: Sequence[str]) -> EncodedBatch:
        """One batch of ``texts``, each with its picture: the picture's keys on the source side, the text on the
        target side (see the module docstring). Every picture of a batch is cut into the same tiles."""
        inputs = self.processed(images, texts)
        pixels = inputs["pixel_values"][:, 0]  # [b, max tiles, 3, tile height, tile width]: one picture per text
        grids, texts_side = [], []
        for index in range(len(texts)):
            ids = self.text_ids(inputs, index)
            grids.append(self._grid(ids, int(inputs["aspect_ratio_ids"][index, 0]), pixels.shape))
            texts_side.append(self.text_tokens(ids))
        grid = same_grid(grids)
        count = grid.num_tiles
        tile_rows, tile_cols = grid.tiles
        batch, _, channels, height, width = pixels.shape
        canvas = pixels[:, :count].reshape(batch, tile_rows, tile_cols, channels, height, width)
        canvas = canvas.permute(0, 3, 1, 4, 2, 5).reshape(batch, channels, tile_rows * height, tile_cols * width)
        patches = dict(zip(grid.patch_indices(), range(grid.num_patches), strict=True))
        word_ids = [patches.get(index) for index in range(grid.num_tokens)]  # a patch's place on the canvas
        return EncodedBatch(
            inputs=self.on_device(inputs),
            tokens=[grid.token_labels() for _ in texts],
            special=[[word is None for word in word_ids] for _ in texts],
            word_ids=[list(word_ids) for _ in texts],
            truncated=[False] * len(texts),
            target_tokens=[labels for labels, _, _ in texts_side],
            target_special=[flags for _, flags, _ in texts_side],
            target_word_ids=[words for _, _, words in texts_side],
            image_grid=grid,
            images=displayed_pixels(self.processor.image_processor, canvas),  # [b, H, W, 3]
        )

    def _grid(self, ids: Sequence[int], aspect_ratio_id: int, shape: torch.Size) -> ImageGrid:
        """The tiles and patches of one text's picture: ``aspect_ratio_id`` names its tiles (counted from 1 in the
        vision config's ``supported_aspect_ratios``), ``shape`` is ``[b, max tiles, 3, tile height, tile width]``."""
        positions = [position for position, token_id in enumerate(ids) if token_id == self.image_token_id]
        if len(positions) != 1:
            raise UnsupportedModelError(f"{self.name}: its processor did not put one image token into the text")
        vision = self.model.config.vision_config
        tile_rows, tile_cols = (int(side) for side in vision.supported_aspect_ratios[aspect_ratio_id - 1])
        per_tile = (shape[-2] // int(vision.patch_size)) * (shape[-1] // int(vision.patch_size)) + 1
        keys = shape[1] * per_tile  # every tile the model has room for, its class token and its patches
        try:
            rows, cols, patch, extra = self.family.grid(
                self.model.config, tile_rows * shape[-2], tile_cols * shape[-1], keys
            )
        except UnsupportedModelError as exc:
            raise UnsupportedModelError(f"{self.name}: {exc}") from exc
        padding = (shape[1] - tile_rows * tile_cols) * per_tile
        return ImageGrid(rows, cols, extra, patch, tiles=(tile_rows, tile_cols), padding=padding,
                         placeholder=positions[0])  # fmt: skip

    def answer_position(self, batch: EncodedBatch, index: int) -> int:
        """The text's last token."""
        return int(batch.inputs["attention_mask"][index].sum()) - 1

    def head_output_weights(self) -> dict[AttentionSite, tuple[Tensor, Tensor | None]]:
        """Each output projection, a cross-attention layer's times ``tanh`` of its gate (what reaches the
        residual stream)."""
        weights = super().head_output_weights()
        gates = self._gates()
        return {
            site: (weight * gates[site], None if bias is None else bias * gates[site])
            if site in gates
            else (weight, bias)
            for site, (weight, bias) in weights.items()
        }

    def _gates(self) -> Mapping[AttentionSite, Tensor]:
        """cross.L -> ``tanh`` of layer L's attention gate (a one-element tensor)."""
        layers = self.model.base_model.language_model.layers
        return {
            AttentionSite("cross", index): layer.cross_attn_attn_gate.detach().tanh()
            for index, layer in enumerate(layers)
            if hasattr(layer, "cross_attn_attn_gate")
        }

    def residual_readers(self):
        raise UnsupportedModelError(
            f"{self.name} reads its picture through gated cross-attention layers, which attnviz's circuits do not "
            "trace (patching, attribution and statistics do)"
        )
