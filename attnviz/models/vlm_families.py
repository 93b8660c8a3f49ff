"""Which vision-language families attnviz reads (or refuses, by name), and how each one's image tokens cover the
picture.

A vision-language model (LLaVA, PaliGemma, Gemma 3, Idefics3, SmolVLM) turns a picture into a run of *image tokens* inside
its text: a vision tower reads the patches, a projection maps them into the language model's width, and they take
the places of the processor's image placeholders. Which patch each image token stands for follows from the
processor's output and the model's config, never from a guess:

* ``patch grid`` (LLaVA, VipLLaVA, Video-LLaVA, DeepSeek-VL, Janus, PaliGemma): one token per patch of the vision
  tower's grid, row-major, after the class token where the model keeps it (LLaVA's
  ``vision_feature_select_strategy="full"``): the tokens counted in the text say which;
* ``pooled grid`` (Gemma 3): the tower's patches are average-pooled onto a ``√n × √n`` grid of ``n`` tokens
  (``mm_tokens_per_image``), so each token covers a square of the picture; Idefics3 and SmolVLM merge each
  ``s × s`` block of patches into one token (pixel shuffle), row-major, which makes the same kind of grid. Their
  processors may cut a large picture into tiles plus a thumbnail (several runs of image tokens): that is refused
  with one line (a picture within ``max_image_size`` stays whole);
* ``merged grid`` (Qwen2-VL, Qwen2.5-VL): the processor resizes the picture to multiples of ``p·m`` pixels (a
  size of its own choosing between its minimum and maximum pixels), the tower reads ``p × p`` patches, and a
  merger turns each ``m × m`` block of patches into one token, row-major. The processor hands the patches over
  flattened; attnviz puts them back into the picture the model saw;
* ``tiled`` (Mllama): the text holds one placeholder token and reads the picture through cross-attention layers
  between its self-attention layers. The processor cuts the picture into the tiles of the aspect ratio closest to
  it (``aspect_ratio_ids``), each read as a ``p × p`` patch grid after its class token; the tiles' patches make
  one grid over the whole canvas. The keys are the tokens of every tile the model has room for
  (``max_num_tiles``), the empty ones padding it masks.

The count of image tokens in the text is checked against the grid; anything else is refused with one line.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnviz.common.errors import UnsupportedModelError


@dataclass(frozen=True)
class VisionLanguageFamily:
    """How one family's image tokens map onto the processed picture."""

    label: str  # the family's name in messages
    #: the tokens of an image (and the text before them, PaliGemma's prefix) attend to each other both ways, so the
    #: language model's patterns are not causal everywhere
    bidirectional_image: bool
    #: ``(rows, cols, (patch height, patch width), extra kinds)`` of an image of ``height × width`` processed pixels
    #: that became ``tokens`` image tokens; raises UnsupportedModelError when they do not fit
    grid: Callable[[Any, int, int, int], tuple[int, int, tuple[int, int], tuple[str, ...]]]
    #: what follows the image placeholder that a prompt naming no image gets before it
    separator: str = ""
    #: the text reads the picture through cross-attention layers (Mllama), not as image tokens in it
    cross_attention: bool = False
    #: ``[b, 3, H, W]`` processed pixels of a batch from the processor's outputs and the config, where its
    #: ``pixel_values`` are not pictures (Qwen2-VL: flattened patches); None: ``pixel_values`` themselves
    pictures: Callable[[dict[str, Tensor], Any], Tensor] | None = None
    #: the tokens that enclose the image placeholder in the family's prompts (Qwen2-VL's vision start and end)
    around_image: tuple[str, str] = ("", "")


def _patch_grid(config: Any, height: int, width: int, tokens: int):
    """One token per patch of the vision tower, after its class token where the model keeps it."""
    size = config.vision_config.patch_size
    patch = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    rows, cols = height // patch[0], width // patch[1]
    extra = tokens - rows * cols
    if extra not in (0, 1):
        raise UnsupportedModelError(
            f"its image became {tokens} tokens, but a {height}×{width} picture in {patch[0]}×{patch[1]} patches makes "
            f"{rows}×{cols} = {rows * cols}; attnviz cannot map them onto the picture"
        )
    return rows, cols, patch, ("cls",) * extra


def _pooled_grid(config: Any, height: int, width: int, tokens: int):
    """The tower's patches average-pooled onto a square grid of ``tokens`` tokens."""
    side = math.isqrt(tokens)
    if side * side != tokens or height % side or width % side:
        raise UnsupportedModelError(
            f"its image became {tokens} tokens, which do not pool a {height}×{width} picture onto a square grid; "
            "attnviz cannot map them onto the picture"
        )
    return side, side, (height // side, width // side), ()


def _merged_grid(config: Any, height: int, width: int, tokens: int):
    """Each ``m × m`` block of the tower's patches merged into one token, row-major (Qwen2-VL's patch merger)."""
    vision = config.vision_config
    side = int(vision.patch_size) * int(vision.spatial_merge_size)  # pixels per token, each way
    rows, cols = height // side, width // side
    if height % side or width % side or rows * cols != tokens:
        raise UnsupportedModelError(
            f"its image became {tokens} tokens, but a {height}×{width} picture in merged patches of {side} pixels "
            f"makes {rows}×{cols} = {rows * cols}; attnviz cannot map them onto the picture"
        )
    return rows, cols, (side, side), ()


def _unpatchified(inputs: dict[str, Tensor], config: Any) -> Tensor:
    """The pictures a Qwen2-VL processor flattened into patches, back as ``[b, 3, H, W]`` (its first frame).

    ``pixel_values`` is ``[Σ t·h·w, 3·T·p·p]``: each picture's ``h × w`` patches of ``p`` pixels, ordered merge
    block by merge block (``m × m`` patches each, row-major), each patch repeated over ``T`` frames."""
    vision = config.vision_config
    p, m, frames = int(vision.patch_size), int(vision.spatial_merge_size), int(vision.temporal_patch_size)
    pictures = []
    for patches, (_, h, w) in zip(
        inputs["pixel_values"].split(inputs["image_grid_thw"].prod(-1).tolist()),
        inputs["image_grid_thw"].tolist(),
        strict=True,
    ):
        blocks = patches.reshape(h // m, w // m, m, m, 3, frames, p, p)[:, :, :, :, :, 0]  # [h/m, w/m, m, m, 3, p, p]
        picture = blocks.permute(4, 0, 2, 5, 1, 3, 6)  # [3, h/m, m, p, w/m, m, p]
        pictures.append(picture.reshape(3, h * p, w * p))
    return torch.stack(pictures)  # [b, 3, H, W]; the batch's pictures share their size (one grid per batch)


def _tiled_grid(config: Any, height: int, width: int, tokens: int):
    """The patches of every tile of a ``height × width`` canvas of tiles, each tile's class token before them;
    ``tokens``: the keys of every tile the model has room for."""
    vision = config.vision_config
    tile, patch = int(vision.image_size), int(vision.patch_size)
    per_tile = (tile // patch) ** 2 + 1
    if height % tile or width % tile or tokens != int(vision.max_num_tiles) * per_tile:
        raise UnsupportedModelError(
            f"its picture became {tokens} keys on a {height}×{width} canvas, which do not make tiles of {tile} "
            f"pixels in {patch}×{patch} patches; attnviz cannot map them onto the picture"
        )
    return height // patch, width // patch, (patch, patch), ("cls",)


#: the tokens that enclose a picture's placeholder in the Qwen-VL and GLM-4V families' prompts
_QWEN_MARKERS, _GLM_MARKERS = ("<|vision_start|>", "<|vision_end|>"), ("<|begin_of_image|>", "<|end_of_image|>")
#: model_type -> how attnviz reads it
VLM_FAMILIES: dict[str, VisionLanguageFamily] = {
    "llava": VisionLanguageFamily("LLaVA", False, _patch_grid, separator="\n"),
    # LLaVA with the tower's features of several layers side by side per patch: the same tokens
    "vipllava": VisionLanguageFamily("VipLLaVA", False, _patch_grid, separator="\n"),
    # a SigLIP-style tower (no class token) whose tokens an aligner maps one by one: one token per patch
    "deepseek_vl": VisionLanguageFamily("DeepSeek-VL", False, _patch_grid),
    "janus": VisionLanguageFamily("Janus", False, _patch_grid),
    # LLaVA's tokens; its processor names a picture's pixels apart from a video's
    "video_llava": VisionLanguageFamily(
        "Video-LLaVA", False, _patch_grid, separator="\n", pictures=lambda inputs, _: inputs["pixel_values_images"]
    ),
    "paligemma": VisionLanguageFamily("PaliGemma", True, _patch_grid),
    "gemma3": VisionLanguageFamily("Gemma 3", True, _pooled_grid),
    # pixel shuffle merges each s × s block of the tower's patches into one token, row-major: a square grid too
    "idefics3": VisionLanguageFamily("Idefics3", False, _pooled_grid),
    "smolvlm": VisionLanguageFamily("SmolVLM", False, _pooled_grid),
    "mllama": VisionLanguageFamily("Mllama", False, _tiled_grid, cross_attention=True),
    # the processor resizes each picture to multiples of the merged patch (its own choice within min/max pixels)
    **{
        model_type: VisionLanguageFamily(label, False, _merged_grid, pictures=_unpatchified, around_image=around)
        for model_type, label, around in (
            ("qwen2_vl", "Qwen2-VL", _QWEN_MARKERS),
            ("qwen2_5_vl", "Qwen2.5-VL", _QWEN_MARKERS),
            ("qwen3_vl", "Qwen3-VL", _QWEN_MARKERS),
            ("qwen3_vl_moe", "Qwen3-VL-MoE", _QWEN_MARKERS),
            ("qwen3_5", "Qwen3.5", _QWEN_MARKERS),
            ("qwen3_5_moe", "Qwen3.5-MoE", _QWEN_MARKERS),
            ("glm4v", "GLM-4V", _GLM_MARKERS),
            ("glm46v", "GLM-4.6V", _GLM_MARKERS),
        )
    },
}
#: vision-language families attnviz refuses, by model_type, with the reason
REFUSED_VLMS = {
    "llava_next": "LLaVA-NeXT cuts the image into tiles of several resolutions, which attnviz does not map onto the "
    "picture yet",
    "llava_onevision": "LLaVA-OneVision cuts the image into tiles of several resolutions, which attnviz does not map "
    "onto the picture yet",
}
#: the families attnviz reads, as messages name them
SUPPORTED_VLM_NAMES = (
    ", ".join(family.label for family in VLM_FAMILIES.values())
    + " (Idefics3 and SmolVLM with a picture kept whole, not cut into tiles)"
)


def is_vision_language_type(config: Any) -> bool:
    """Whether ``config`` is of a vision-language family attnviz reads or refuses by name, or any other model
    that puts image tokens into a language model's text (refused: its image tokens cannot be mapped)."""
    model_type = getattr(config, "model_type", "")
    if model_type in VLM_FAMILIES or model_type in REFUSED_VLMS:
        return True
    has_towers = getattr(config, "vision_config", None) is not None and getattr(config, "text_config", None) is not None
    return has_towers and any(
        getattr(config, field, None) is not None for field in ("image_token_id", "image_token_index")
    )


def is_vision_language_folder(path: Path) -> bool:
    """Whether the model directory ``path`` holds a vision-language family attnviz reads, saved with its image
    processor (read from the JSON files alone: nothing is imported or loaded). Without an image processor the
    model loads as the language model it also is (text only)."""
    config = json_object(path / "config.json")
    if config.get("model_type") not in VLM_FAMILIES:
        return False
    return (path / "preprocessor_config.json").is_file() or "image_processor" in json_object(
        path / "processor_config.json"
    )


def json_object(path: Path) -> dict:
    """The JSON object in ``path``; empty when there is none (no file, not JSON, not an object)."""
    import json

    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def vision_language_family(config: Any, source: str) -> VisionLanguageFamily:
    """The family of ``config``; refuses, by name and before any weight is read, one attnviz cannot map."""
    model_type = getattr(config, "model_type", "")
    family = VLM_FAMILIES.get(model_type)
    if family is not None:
        return family
    reason = REFUSED_VLMS.get(
        model_type,
        "it joins a vision tower and a language model in a way attnviz does not map onto the picture yet",
    )
    raise UnsupportedModelError(
        f"model {source!r} is a vision-language model of the {model_type} family, which attnviz cannot show: "
        f"{reason}. attnviz reads {SUPPORTED_VLM_NAMES}"
    )


def image_placeholder(processor: Any, family: VisionLanguageFamily) -> str:
    """The text a prompt that names no image gets before it: the processor's image token (Gemma 3: its
    begin-of-image token, which the processor expands) between the family's enclosing tokens where its tokenizer
    knows them, then the family's separator."""
    token = image_marker(processor)
    before, after = family.around_image
    vocabulary = processor.tokenizer.get_vocab() if before else {}
    if before in vocabulary and after in vocabulary:
        token = f"{before}{token}{after}"
    return f"{token}{family.separator}"


def image_marker(processor: Any) -> str:
    """The token that marks where a text's picture goes (the one a prompt names once per picture)."""
    return getattr(processor, "boi_token", None) or getattr(processor, "image_token", None) or "<image>"
