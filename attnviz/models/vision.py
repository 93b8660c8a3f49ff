"""Vision transformers (ViT, DeiT, DINOv2, the vision towers of CLIP and SigLIP) on attnviz's attention core.

They load like any Hugging Face model (a directory or a hub id in the local cache) but read images
through their image processor (``preprocessor_config.json``) instead of text through a tokenizer.
Each image becomes the family's extra tokens followed by a row-major grid of patches
(:class:`~attnviz.common.images.ImageGrid`); the grid is read from the model (its patch size and the
size of the processed image), never guessed, and checked against the patterns the model produces.

Families whose attention is not one pattern over all patches (Swin's shifted windows, …) are
refused by name before any weight is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from attnviz.common.errors import InputError, UnsupportedModelError, reason
from attnviz.common.images import ImageGrid
from attnviz.common.parallel import SINGLE_PROCESS
from attnviz.core import CONTEXT_KWARG, AttentionContext, AttentionSite
from attnviz.models.base import EncodedBatch, LoadedModel, PrunedCopy
from attnviz.models.head_output_edits import replay_fallback, run_editing
from attnviz.models.head_outputs import OutputProjection, find_output_projections
from attnviz.models.hf_checks import VISION_FAMILY_NAMES
from attnviz.models.physical import find_attention_blocks, prune_heads_physically
from attnviz.models.placement import Loading
from attnviz.models.probing import ProbeBatch
from attnviz.models.vision_families import (
    IMAGE_TASK_EXAMPLES,
    VISION_FAMILIES,
    VISION_TOWERS,
    check_vision_family,
    image_task_of,
    load_image_processor,
    load_weights_on_core,
)

if TYPE_CHECKING:
    from PIL.Image import Image


def load_vision_model(source: str, config: Any, loading: Loading) -> VisionModel:
    """Load a vision transformer and its image processor onto the attention core (see the module docstring), put in
    place as ``loading`` says."""
    import transformers

    from attnviz.models.hf_checks import check_loading_info, drop_missing_poolers

    model_type = config.model_type
    check_vision_family(model_type, source)
    processor = load_image_processor(source)
    tower = VISION_TOWERS.get(model_type)
    # the class named by the config (a classifier loads with its head), else the bare model
    named = [getattr(transformers, arch, None) for arch in getattr(config, "architectures", None) or []]
    cls = (
        getattr(transformers, tower[0]) if tower else next((c for c in named if c is not None), transformers.AutoModel)
    )
    # a hub id comes from the local cache: never the network
    model, info = load_weights_on_core(
        cls, source, dtype=loading.dtype, device_map=loading.device_map, local_files_only=True
    )
    if tower:  # the text tower's weights are in the file but not in the vision model: not an error here
        info["unexpected_keys"] = [key for key in info.get("unexpected_keys") or () if key.startswith(tower[1])]
    drop_missing_poolers(model, info)  # a checkpoint saved without its pooler (DINO v1) loads as it was saved
    check_loading_info(info, source)
    loaded = VisionModel(loading.place(model), processor, name=loading.name or source,
                         extra_kinds=VISION_FAMILIES[model_type](config))  # fmt: skip
    loaded.image_task = image_task_of(source)
    loaded.layout()  # a probe forward pass: checks the grid against the patterns now, not in the middle of a command
    return loaded


class VisionModel(LoadedModel):
    #: a transformers vision model (or vision tower): its config and submodules differ by family
    model: Any

    """A transformers vision transformer whose attention runs through attnviz's core; reads images, not text."""

    modality: Literal["text", "image", "audio"] = "image"
    #: the toy image task the model was trained on (``odd-patch``), whose examples it can draw; None otherwise
    image_task: str | None = None
    #: the pruned checkpoint directory this model was read from (see :mod:`attnviz.models.vision_pruning`)
    checkpoint_path: str | None = None

    def __init__(self, model: nn.Module, processor: Any, *, name: str, extra_kinds: tuple[str, ...]):
        self.model = model
        self.processor = processor
        self.name = name
        self.extra_kinds = tuple(extra_kinds)
        self._module_names = {module: module_name for module_name, module in model.named_modules()}
        self._sites: dict[nn.Module, AttentionSite | None] = {}
        self._output_projections: dict[AttentionSite, OutputProjection] | None = None
        #: eager attention read back through ``output_attentions`` (families whose attention calls the
        #: interface without the forward's keyword arguments, e.g. SigLIP)
        self.fallback = False

    # -- the patch grid -----------------------------------------------------------------------

    @property
    def patch_size(self) -> tuple[int, int]:
        """Pixels per patch (height, width), from the model's config."""
        config = self.model.config
        size = getattr(config, "patch_size", None) or getattr(getattr(config, "vision_config", None), "patch_size", 0)
        height, width = (size, size) if isinstance(size, int) else tuple(size or (0, 0))
        return int(height), int(width)

    def grid_for(self, height: int, width: int) -> ImageGrid:
        """The grid of a processed image of ``height × width`` pixels (its patch size from the config)."""
        patch_height, patch_width = self.patch_size
        if patch_height < 1 or height < patch_height or width < patch_width:
            raise UnsupportedModelError(
                f"{self.name}: the processed image is {height}×{width} pixels, smaller than one "
                f"{patch_height}×{patch_width} patch"
            )
        return ImageGrid(height // patch_height, width // patch_width, self.extra_kinds, (patch_height, patch_width))

    # -- encoding -----------------------------------------------------------------------------

    def encode_images(self, images: Sequence[Image]) -> EncodedBatch:
        """Resize and normalise ``images`` with the model's image processor into one batch.

        Every image of a batch gets the same size, hence one grid (``batch.image_grid``);
        ``batch.images`` holds what the model saw, ``[b, H, W, 3]`` float32 in 0–1.
        """
        images = list(images)
        if not images:
            raise InputError("no image given")
        try:
            pixels = self.processor(images=images, return_tensors="pt")["pixel_values"]  # [b, 3, H, W]
        except Exception as exc:  # an image the processor cannot resize
            raise InputError(f"{self.name}'s image processor cannot read this image: {reason(exc)}") from exc
        grid = self.grid_for(pixels.shape[-2], pixels.shape[-1])
        labels = grid.token_labels()
        special = [index < grid.num_extra for index in range(grid.num_tokens)]
        word_ids = [None] * grid.num_extra + list(range(grid.num_patches))
        dtype = next(self.model.parameters()).dtype
        count = len(images)
        return EncodedBatch(
            inputs={"pixel_values": pixels.to(self.device, dtype)},
            tokens=[list(labels) for _ in range(count)],
            special=[list(special) for _ in range(count)],
            word_ids=[list(word_ids) for _ in range(count)],
            truncated=[False] * count,
            image_grid=grid,
            images=self.displayed(pixels),
        )

    def displayed(self, pixels: Tensor) -> Tensor:
        """``[b, H, W, 3]`` float32 in 0–1: the processed images as the model saw them (normalisation undone)."""
        return displayed_pixels(self.processor, pixels)

    def encode(self, texts: Sequence[str], **options: Any) -> EncodedBatch:
        raise InputError(f"{self.name} is a vision model: give it an image (--image PATH), not text")

    def token_counts(self, texts: Sequence[str], *, max_length: int | None = None) -> list[int]:
        self.encode(texts)  # refuses text
        return []

    # -- running ------------------------------------------------------------------------------

    def forward(self, batch: EncodedBatch, context: AttentionContext | None = None, *, logits: bool = False):
        """Run the model on ``batch.inputs['pixel_values']``; without ``logits`` the base model (no classifier)."""
        if "pixel_values" not in batch.inputs:
            raise InputError(f"{self.name} is a vision model: give it an image (--image PATH), not text")
        module = self.model if logits else self.model.base_model
        kwargs: dict[str, Any] = {"pixel_values": batch.inputs["pixel_values"]}
        if context is not None and context.head_mask is not None and self.fallback:
            raise UnsupportedModelError(f"{self.name}: attnviz cannot mask the heads of this model")

        def run(context: AttentionContext | None, values: dict[AttentionSite, Tensor]) -> Any:
            if not self.fallback:
                if context is not None:
                    kwargs[CONTEXT_KWARG] = context
                return module(**kwargs)
            outputs = module(**kwargs, output_attentions=context is not None)
            if context is not None:
                replay_fallback(outputs, context, False, values)  # each [b, h, q, k]
            return outputs

        return run_editing(self.name, self.output_projections, context, fallback=self.fallback, run=run)

    def output_projections(self) -> dict[AttentionSite, OutputProjection]:
        """Every site's output projection (:mod:`attnviz.models.head_outputs`), found once on a grey image."""
        if self._output_projections is None:
            self.layout()  # settles whether the model runs on the core or on eager attention
            self._output_projections = find_output_projections(self, fallback=self.fallback)
        return self._output_projections

    def head_output_projections(self) -> dict[AttentionSite, Tensor]:
        from attnviz.models.head_weights import hf_head_output_projections

        return hf_head_output_projections(self)

    def check_patching(self) -> None:
        raise UnsupportedModelError(
            f"{self.name} is a vision model: patching compares the logits of two answer tokens, and it has no "
            "vocabulary (its heads' outputs can still be weighed by norm)"
        )

    def layout(self) -> dict[AttentionSite, int]:
        """Heads per site, from a probe forward pass on a grey image; checks the grid against the patterns."""
        if self._layout is None:
            batch = self.probe_batch()
            patterns = self.probe_patterns(batch)
            if not patterns and not self.fallback:
                # SigLIP's attention calls the interface without the forward's keyword arguments, so the
                # context cannot travel with it: read its eager attention weights instead (the same numbers).
                self.model.set_attn_implementation("eager")
                self.fallback = True
                patterns = self.probe_patterns(batch)
            if not patterns:
                raise UnsupportedModelError(f"{self.name}: attnviz cannot read this model's attention")
            self.check_grid_covers(batch, next(iter(patterns.values())).shape[-1], "attention")
            self._layout = {site: pattern.shape[1] for site, pattern in sorted(patterns.items())}
        return self._layout

    def probe_patterns(self, batch: EncodedBatch) -> dict[AttentionSite, Tensor]:
        """The attention patterns of one forward pass on ``batch`` (a probe: no gradients), by site."""
        from attnviz.core.recorder import PatternRecorder

        recorder = PatternRecorder()
        with torch.no_grad():
            self.forward(batch, self.context([recorder]))
        return recorder.patterns

    def check_grid_covers(self, batch: EncodedBatch, tokens: int, what: str) -> None:
        """UnsupportedModelError unless ``tokens`` (the keys of the model's ``what``) are the batch's extra tokens
        and patches."""
        grid = batch.image_grid
        assert grid is not None
        if tokens != grid.num_tokens:
            raise UnsupportedModelError(
                f"{self.name}: its {what} covers {tokens} tokens, but {grid.num_extra} extra token(s) and a "
                f"{grid.rows}×{grid.cols} patch grid make {grid.num_tokens}; attnviz cannot map it onto the image"
            )

    def probe_batch(self) -> EncodedBatch:
        """One grey image, resized by the model's image processor."""
        from PIL import Image as PILImage

        return self.encode_images([PILImage.new("RGB", (224, 224), (128, 128, 128))])

    def site_of(self, module: nn.Module) -> AttentionSite | None:
        """``vit.encoder.layer.3.attention.attention`` -> self.3 (the first number in the module's name)."""
        if module not in self._sites:
            import re

            numbers = re.findall(r"(?:^|\.)(\d+)(?:\.|$)", self._module_names.get(module, ""))
            self._sites[module] = AttentionSite("self", int(numbers[0])) if numbers else None
        return self._sites[module]

    def source_paths(self) -> list[Path]:
        source = getattr(self.model.config, "_name_or_path", None)
        return [Path(source).resolve()] if source and Path(source).exists() else []

    def own_images(self, count: int, seed: int) -> list[Image] | None:
        """``count`` fresh examples of the model's own toy task (``toy-odd-patch``, ``toy-caption``), or None for
        other models."""
        if self.image_task is None:
            return None
        import importlib

        # the toy package sits above this one: the task's own module draws them (named, imported when needed)
        module, _, function = IMAGE_TASK_EXAMPLES[self.image_task].partition(":")
        return getattr(importlib.import_module(module), function)(count, seed)

    # -- text tools refuse ------------------------------------------------------------------------

    def default_probe_length(self, longest: int) -> int:
        """Asked before any probing starts: a vision model refuses here, before a "probing …" line."""
        self.probe_batches(longest, 0, seed=0, batch_size=1)
        return longest

    def probe_batches(self, length: int, sequences: int, *, seed: int, batch_size: int) -> list[ProbeBatch]:
        raise UnsupportedModelError(
            f"{self.name} is a vision model: the head probes (previous-token, induction, duplicate-token) are "
            "text tools, defined on token sequences; measure its heads on images with the image statistics instead"
        )

    def check_generation(self) -> None:
        raise UnsupportedModelError(f"{self.name} is a vision model: it does not write text")

    # -- pruning: image classifiers, judged by their own predictions (attnviz.models.vision_pruning) ----

    def with_model(self, model: nn.Module) -> VisionModel:
        copy = VisionModel(model, self.processor, name=self.name, extra_kinds=self.extra_kinds)
        copy.image_task, copy.fallback, copy.source = self.image_task, self.fallback, self.source
        return copy

    def check_objective(self) -> None:
        from attnviz.models.vision_pruning import check_classifier

        check_classifier(self)

    def objective(self, batches, *, probes: int = 8, seed: int = 0, parallel=SINGLE_PROCESS):
        """The KL divergence from the unpruned model's own class distribution (``PredictionObjective``)."""
        from attnviz.models.vision_pruning import PredictionObjective

        self.check_objective()
        return PredictionObjective(self, batches, probes=probes, seed=seed, parallel=parallel)

    def check_head_removal(self) -> None:
        find_attention_blocks(self)  # raises UnsupportedModelError for a layout without slicing rules

    def remove_heads(self, removed: Mapping[AttentionSite, Sequence[int]]):
        return prune_heads_physically(self, removed)

    def timing_batch(self, tokens: int, *, texts: Sequence[str], seed: int = 0) -> EncodedBatch:
        """One image of seeded random pixels at the size the image processor gives (``tokens`` does not apply)."""
        from attnviz.models.vision_pruning import random_image_batch

        return random_image_batch(self, seed)

    def save_pruned(self, directory, pruned: PrunedCopy, *, source: str, transformers_copy: bool = False):
        """The pruned-checkpoint format of :mod:`attnviz.models.pruned_format`, with the image processor."""
        from attnviz.models.vision_pruning import save_pruned_vision_model

        return save_pruned_vision_model(self, directory, pruned, source=source, transformers_copy=transformers_copy)


def displayed_pixels(image_processor: Any, pixels: Tensor) -> Tensor:
    """``[b, H, W, 3]`` float32 in 0–1: processed ``pixels`` (``[b, 3, H, W]``) as the model saw them, the image
    processor's normalisation and rescaling undone."""
    values = pixels.float().cpu()  # [b, 3, H, W]
    if getattr(image_processor, "do_normalize", False):
        mean = torch.tensor(_per_channel(image_processor.image_mean)).view(1, 3, 1, 1)  # [1, 3, 1, 1]
        std = torch.tensor(_per_channel(image_processor.image_std)).view(1, 3, 1, 1)  # [1, 3, 1, 1]
        values = values * std + mean
    if getattr(image_processor, "do_rescale", False):
        values = values / (float(image_processor.rescale_factor) * 255.0)
    return values.clamp(0.0, 1.0).permute(0, 2, 3, 1).contiguous()  # [b, H, W, 3]


def _per_channel(values: Any) -> list[float]:
    """An image mean or std as three floats (processors store a float or a list)."""
    if isinstance(values, (int, float)):
        return [float(values)] * 3
    return [float(value) for value in values]


def vision_model_of(loaded: LoadedModel) -> VisionModel:
    """``loaded`` itself when it reads images; a one-line error naming the vision families otherwise."""
    if isinstance(loaded, VisionModel):
        return loaded
    if loaded.reads_pictures_in_text:  # a picture alone: the vision tower's attention over it
        return loaded.vision_tower()  # type: ignore[attr-defined]  # a VisionLanguageModel (attnviz.models.vlm)
    raise InputError(
        f"{loaded.name} is a text model: an image needs a vision model ({VISION_FAMILY_NAMES}, or toy-odd-patch) "
        "or an image captioner (a VisionEncoderDecoderModel, or toy-caption)"
    )
