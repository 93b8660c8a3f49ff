"""Vision-language models (LLaVA, PaliGemma, Gemma 3, Idefics3, the Qwen-VL families) on attnviz's attention core.

A vision-language model reads a text in which a picture stands as a run of *image tokens*
(:mod:`attnviz.models.vlm_families` says how each family's tokens cover the picture). attnviz reads the language
model's self-attention over that whole sequence: stack ``self``, one layer per language-model layer, its tokens the
text's tokens with the image tokens named ``r{row}c{col}`` (``[CLS]`` where the model keeps the class token), and
``image_grid.start`` the position of the first. Each written token's attention over the image tokens is the
captioning view (:mod:`attnviz.captures.vision_language`). The vision tower's own attention runs through the core
too, unrecorded.

Without an image the model is a plain language model: text commands (statistics, probes, patching) work on it
as on any causal LM. The model directory holds the model and its processor (``processor.save_pretrained``: the
tokenizer and the image processor).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from attnviz.common.errors import AttnvizError, InputError, UnsupportedModelError, reason
from attnviz.common.images import ImageGrid
from attnviz.common.tokens import token_strings, word_ids_from_markers
from attnviz.common.wording import plural
from attnviz.core import AttentionSite
from attnviz.models.base import EncodedBatch
from attnviz.models.hf import HFModel
from attnviz.models.vision import VisionModel, displayed_pixels
from attnviz.models.vision_families import VISION_FAMILIES
from attnviz.models.vlm_families import (
    VisionLanguageFamily,
    image_marker,
    image_placeholder,
    vision_language_family,
)

if TYPE_CHECKING:
    from PIL.Image import Image

#: the module names under which vision-language models keep their language model (Idefics3, SmolVLM: text_model)
_LANGUAGE_MODELS = ("language_model", "text_model")
#: processor outputs that are not model inputs (PaliGemma's training labels)
_NOT_INPUTS = ("labels",)


class VisionLanguageModel(HFModel):
    """A transformers vision-language model: a text with a picture in it, read by the language model's attention."""

    reads_pictures_in_text = True

    def __init__(self, model: nn.Module, processor: Any, family: VisionLanguageFamily, *, name: str):
        super().__init__(model, processor.tokenizer, name=name)
        self.processor = processor
        self.family = family
        if family.bidirectional_image:  # the image's tokens see each other both ways: not causal everywhere
            self.causal = False
        self.image_token_id = int(self.model.config.image_token_id)
        self._tower: VisionModel | None = None  # the vision tower read on its own (vision_tower)

    def with_model(self, model: nn.Module) -> VisionLanguageModel:
        return VisionLanguageModel(model, self.processor, self.family, name=self.name)

    # -- sites: the language model's layers ----------------------------------------------------------

    def _site_from_name(self, qualified_name: str, module: nn.Module) -> AttentionSite | None:
        """``model.language_model.layers.3.self_attn`` (Idefics3: ``model.text_model…``) -> self.3; the vision tower's
        layers are not recorded."""
        parts = qualified_name.split(".")
        inside = next((parts.index(name) for name in _LANGUAGE_MODELS if name in parts), None)
        layers = [int(part) for part in parts[inside + 1 :] if part.isdigit()] if inside is not None else []
        return AttentionSite("self", layers[0]) if layers else None

    def vision_tower(self) -> VisionModel:
        """The model's vision tower as a vision model of its own, with the model's image processor: its attention
        over the picture's patches (a picture given without a text), read as :mod:`attnviz.models.vision` reads a
        CLIP or SigLIP tower. Refused, with the reason, for a tower of another kind."""
        if self._tower is None:
            tower = getattr(self.model.base_model, "vision_tower", None)
            config = getattr(tower, "config", None)
            kinds = VISION_FAMILIES.get(getattr(config, "model_type", ""))
            pixels_per_image = getattr(self.processor.image_processor, "do_image_splitting", None) is None
            if tower is None or kinds is None or not pixels_per_image:
                raise InputError(
                    f"{self.name} is a vision-language model whose vision tower attnviz does not read on its own: "
                    'give a text with the image (attnviz heatmap --model MODEL "Describe the picture." --image FILE)'
                )
            vision = VisionModel(tower, self.processor.image_processor, name=f"{self.name} · vision tower",
                                 extra_kinds=kinds(config))  # fmt: skip
            vision.layout()  # a probe pass: checks the grid against the tower's patterns
            self._tower = vision
        return self._tower

    def check_layout(self) -> None:
        """Refuse a model whose language model does not reach the core, or whose image tokens do not fit its grid
        (a probe pass on a grey picture)."""
        self._layout = None
        try:
            found = self.layout()
        except (AttnvizError, KeyboardInterrupt):
            raise
        except Exception as exc:  # the family's own code stops on the probe (a config its weights do not fit)
            raise UnsupportedModelError(
                f"{self.name}: its code stops on a grey picture and a short text, as attnviz runs it: "
                f"{type(exc).__name__}: {reason(exc)}"
            ) from exc
        if not found:
            raise UnsupportedModelError(
                f"{self.name}: its language model's attention does not go through transformers' attention "
                "interface, so attnviz cannot read it"
            )

    def probe_batch(self) -> EncodedBatch:
        """A grey picture and a short text: finds the language model's sites and checks the image's grid."""
        from PIL import Image as PILImage

        return self.encode_images([PILImage.new("RGB", (224, 224), (128, 128, 128))], texts=["attention probe"])

    # -- encoding ------------------------------------------------------------------------------------

    def encode_images(self, images: Sequence[Image], *, texts: Sequence[str]) -> EncodedBatch:
        """One batch of ``texts``, each with its picture from ``images`` (a prompt that names no image gets the
        processor's image placeholder before it). Every example of a batch has the same image grid (one batch per
        example where the texts before the pictures differ)."""
        inputs = self.processed(images, texts)
        if self.family.pictures is not None:  # Qwen2-VL: flattened patches, put back into pictures
            pixels = self.family.pictures(inputs, self.model.config)  # [b, 3, H, W]
        else:
            pixels = inputs["pixel_values"]  # [b, 3, H, W]; Idefics3, SmolVLM: [b, tiles, 3, H, W]
        if pixels.dim() == 5:
            pixels = pixels[:, -1]  # one tile (more are refused below): the picture as the model saw it
        grids, tokens, special, word_ids = [], [], [], []
        for index in range(len(texts)):
            ids = self.text_ids(inputs, index)
            grid = self.grid_of(ids, pixels.shape[-2], pixels.shape[-1])
            labels, flags, _ = self.text_tokens(ids)
            labels[grid.start : grid.start + grid.num_tokens] = grid.token_labels()
            # words of the text only: an image token is no piece of a word
            pictured = [flag or position in grid.positions for position, flag in enumerate(flags)]
            words = word_ids_from_markers(labels, pictured)
            grids.append(grid)
            tokens.append(labels)
            special.append(flags)
            word_ids.append(words)
        return EncodedBatch(
            inputs=self.on_device(inputs),
            tokens=tokens,
            special=special,
            word_ids=word_ids,
            truncated=[False] * len(texts),
            image_grid=same_grid(grids),
            images=displayed_pixels(self.processor.image_processor, pixels),
        )

    def processed(self, images: Sequence[Image], texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """The processor's model inputs for ``texts``, each with its picture (one placeholder per text, the
        processor's own before a text that names none); one InputError for anything it cannot read."""
        images, texts = list(images), list(texts)
        if len(images) != len(texts) or not texts:
            raise InputError(f"give one text per image ({plural(len(images), 'image')}, {plural(len(texts), 'text')})")
        for text in texts:
            if not text.strip():
                raise InputError("the text is empty: give at least one word")
        placeholder, token = image_placeholder(self.processor, self.family), image_marker(self.processor)
        prompts = [text if token in text else placeholder + text for text in texts]
        if any(prompt.count(token) != 1 for prompt in prompts):
            raise InputError(f"write the image placeholder {token} at most once per text: one picture per text")
        try:
            import warnings

            from attnviz.models.hf_checks import quiet_image_processors

            # numpy warns inside some processors (PaliGemma's copies its tensors into training labels)
            with quiet_image_processors(), warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                # one list of pictures per text: a flat list is one text's pictures to some processors (Gemma 3's)
                pictures = [[image] for image in images]
                encoded = self.processor(text=prompts, images=pictures, padding=True, return_tensors="pt")
        except Exception as exc:  # a picture the image processor cannot resize, a text it cannot tokenise
            raise InputError(f"{self.name}'s processor cannot read this input: {reason(exc)}") from exc
        return {key: value for key, value in encoded.items() if key not in _NOT_INPUTS}

    def repeated_inputs(self, batch: EncodedBatch, index: int, count: int) -> dict[str, Any]:
        """As for any model; a family whose processor flattens every picture's patches into one tensor (Qwen2-VL:
        ``pixel_values`` ``[Σ patches, dim]``, ``image_grid_thw`` ``[b, 3]``) repeats example ``index``'s patches."""
        inputs = super().repeated_inputs(batch, index, count)
        if "image_grid_thw" in batch.inputs:  # the patches of every picture in one tensor, each picture's grid
            grids = batch.inputs["image_grid_thw"]  # [b, 3]: frames, patch rows, patch columns of each picture
            patches = batch.inputs["pixel_values"].split(grids.prod(-1).tolist())[index]  # [t·h·w, dim]
            inputs["pixel_values"] = patches.repeat(count, 1)  # [count·t·h·w, dim]
            inputs["image_grid_thw"] = grids[index : index + 1].repeat(count, 1)  # [count, 3]
        return inputs

    def text_ids(self, inputs: dict[str, torch.Tensor], index: int) -> list[int]:
        """The token ids of example ``index`` of processed ``inputs``, without its padding."""
        length = int(inputs["attention_mask"][index].sum())
        return inputs["input_ids"][index, :length].tolist()

    def text_tokens(self, ids: Sequence[int]) -> tuple[list[str], list[bool], list[int | None]]:
        """Token strings, special flags (the image token is not special) and word ids of a text's ``ids``."""
        labels = token_strings(self.tokenizer, ids)
        special_ids = set(self.tokenizer.all_special_ids) - {self.image_token_id}
        flags = [token_id in special_ids for token_id in ids]
        return labels, flags, word_ids_from_markers(labels, flags)

    def on_device(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``inputs`` on the model's device, the pixels in its dtype."""
        dtype = next(self.model.parameters()).dtype
        return {
            key: value.to(self.device, dtype) if key.startswith("pixel_values") else value.to(self.device)
            for key, value in inputs.items()
        }

    def grid_of(self, ids: Sequence[int], height: int, width: int) -> ImageGrid:
        """Where the image tokens of one encoded text sit, and how they cover a ``height × width`` picture."""
        positions = [position for position, token_id in enumerate(ids) if token_id == self.image_token_id]
        if not positions:
            raise UnsupportedModelError(f"{self.name}: its processor put no image token into the text")
        runs = 1 + sum(1 for before, after in itertools.pairwise(positions) if after != before + 1)
        if runs > 1:
            raise UnsupportedModelError(
                f"{self.name}: its processor cut the picture into {runs} runs of image tokens (tiles and a thumbnail), "
                "which attnviz does not map onto the picture yet: give a picture within the image processor's "
                "max_image_size, or save the processor with do_image_splitting=False"
            )
        try:
            rows, cols, patch, extra = self.family.grid(self.model.config, height, width, len(positions))
        except UnsupportedModelError as exc:
            raise UnsupportedModelError(f"{self.name}: {exc}") from exc
        return ImageGrid(rows, cols, extra, patch, start=positions[0])

    # -- what a vision-language model does ------------------------------------------------------------

    def check_generation(self) -> None:
        """It writes text (with its language-model head)."""
        from attnviz.models.objective import has_lm_head

        if not has_lm_head(self):
            raise UnsupportedModelError(f"{self.name} has no language-model head: it cannot write text")

    def readout(self):
        """The language model's final norm and the unembedding (checked on a probe, as for any causal LM)."""
        from attnviz.models.hf_patching import hf_readout

        base = self.model.base_model
        return hf_readout(
            self, base=next((getattr(base, name) for name in _LANGUAGE_MODELS if hasattr(base, name)), None)
        )

    def answer_position(self, batch: EncodedBatch, index: int) -> int:
        """The last token: the language model's next-token prediction is read there."""
        return batch.lengths[index] - 1


def same_grid(grids: list[ImageGrid]) -> ImageGrid:
    """The one image grid of a batch's examples; refused where their pictures sit or are cut differently."""
    if any(grid != grids[0] for grid in grids):
        raise InputError(
            "the pictures of one batch sit at different places in their texts or are cut into different tiles: "
            "encode them one by one"
        )
    return grids[0]


def vision_language_model_of(loaded: Any) -> VisionLanguageModel:
    """``loaded`` itself when it reads a text with a picture in it; a one-line error otherwise."""
    if isinstance(loaded, VisionLanguageModel):
        return loaded
    from attnviz.models.vlm_families import SUPPORTED_VLM_NAMES, VLM_FAMILIES, is_vision_language_type

    config = getattr(loaded.model, "config", None)
    if config is not None and is_vision_language_type(config):  # read as its language model: text only
        if config.model_type in VLM_FAMILIES:
            raise InputError(
                f"{loaded.name} was loaded without its image processor, so it reads text only: save the model's "
                "processor into its directory (processor.save_pretrained(directory)), or give "
                "attnviz.wrap(model, processor)"
            )
        vision_language_family(config, loaded.name)  # refuses the family by name, with the reason
    kind = "a vision model" if getattr(loaded, "modality", "text") == "image" else "a text model"
    raise InputError(
        f"{loaded.name} is {kind}: a text with a picture in it needs a vision-language model ({SUPPORTED_VLM_NAMES})"
        + (", or give the image alone (no text)" if kind == "a vision model" else "")
    )
