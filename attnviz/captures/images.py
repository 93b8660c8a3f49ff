"""Capturing a vision transformer's attention on images (see :mod:`attnviz.models.vision`)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Union

from attnviz.captures.recording import capture_encoded
from attnviz.captures.result import AttentionCapture
from attnviz.common.images import MIN_SIDE, open_image
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.caption import captioner_of
from attnviz.models.vision import VisionModel, vision_model_of

if TYPE_CHECKING:
    from PIL.Image import Image

#: an image as attnviz accepts it: a file path, the file's bytes, a PIL image, or an [H, W, 3] array
ImageSource = Union[str, "os.PathLike[str]", bytes, "Image", Any]


def as_pil_image(source: ImageSource) -> Image:
    """A PIL image from a path, bytes, a PIL image or an array (RGB; damaged or 1×1 images refused with one clear
    error). An array is ``[H, W, 3]`` (or ``[3, H, W]``, ``[H, W]`` grey, 4 channels with alpha): uint8, or floats
    in 0–1, as numpy or torch."""
    from PIL import Image as PILImageModule
    from PIL.Image import Image as PILImage

    if isinstance(source, PILImage):
        return source.convert("RGB")
    if isinstance(source, (str, bytes, os.PathLike)):
        return open_image(source)
    if hasattr(source, "__array__"):
        return PILImageModule.fromarray(_pixels(source)).convert("RGB")
    raise TypeError(
        f"got a {type(source).__name__} as an image: give a file path, the file's bytes, a PIL image or an "
        "[H, W, 3] array"
    )


def _pixels(array: object):
    """``[H, W, C]`` uint8 pixels of an image array (see :func:`as_pil_image`); ValueError on anything else."""
    import numpy as np

    if hasattr(array, "detach"):  # a torch tensor, maybe on a GPU or requiring grad
        array = array.detach().cpu().numpy()
    pixels = np.asarray(array)
    if pixels.ndim == 3 and pixels.shape[0] in (1, 3, 4) and pixels.shape[-1] not in (1, 3, 4):
        pixels = pixels.transpose(1, 2, 0)  # [C, H, W] -> [H, W, C]
    if pixels.ndim == 3 and pixels.shape[-1] == 1:
        pixels = pixels[..., 0]
    if pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[-1] not in (3, 4)):
        raise ValueError(f"an image array has shape {list(pixels.shape)}: give [H, W, 3] (or [3, H, W], [H, W])")
    if min(pixels.shape[:2]) < MIN_SIDE:
        raise ValueError(f"the image array is {pixels.shape[1]}×{pixels.shape[0]} pixels: give at least {MIN_SIDE}")
    if pixels.dtype == np.uint8:
        return np.ascontiguousarray(pixels)
    if pixels.dtype == np.bool_ or not np.issubdtype(pixels.dtype, np.number):
        raise ValueError(f"an image array holds {pixels.dtype} values: give uint8 (0–255) or floats in 0–1")
    values = pixels.astype(np.float64)
    if not np.isfinite(values).all():
        raise ValueError("the image array holds NaN or infinite values: give uint8 (0–255) or floats in 0–1")
    if np.issubdtype(pixels.dtype, np.floating):
        if values.min() < 0 or values.max() > 1:
            raise ValueError(
                f"the image array's floats run {values.min():.3g}–{values.max():.3g}: give floats in 0–1 "
                "(divide by 255) or uint8"
            )
        values = values * 255
    elif values.min() < 0 or values.max() > 255:
        raise ValueError(f"the image array's values run {values.min():.0f}–{values.max():.0f}: give 0–255")
    return np.ascontiguousarray(np.round(values).astype(np.uint8))


def image_batches(vision: VisionModel, images: Sequence[ImageSource], batch_size: int) -> Iterator[EncodedBatch]:
    """``vision``'s batches of at most ``batch_size`` of ``images``, each read when its batch comes (memory: one
    batch of pictures); a file that is not a readable image stops it with one clear InputError."""
    for start in range(0, len(images), batch_size):
        pictures = [as_pil_image(source) for source in images[start : start + batch_size]]
        yield vision.encode_images(pictures)


def capture_images(
    loaded: LoadedModel, images: Sequence[ImageSource], *, targets: Sequence[str] | None = None, **recording: Any
) -> list[AttentionCapture]:
    """Capture every attention pattern of a vision model on ``images`` (one capture each); with ``targets``, a
    captioner's on each image with its caption (teacher-forced). ``recording``: ``layers``, ``heads``, ``stacks``,
    ``max_bytes``, ``weighting``, as :func:`~attnviz.captures.recording.capture_encoded` takes them.

    Each capture's tokens are the model's extra tokens (``[CLS]``, ``[DIST]``, ``[REG0]``…) then the
    patches ``r{row}c{col}`` row-major; ``capture.image_grid`` says how, and ``capture.extras["image"]``
    holds the resized picture (``[H, W, 3]`` float32 in 0–1). A captioner's caption is on the target side.
    """
    if targets is None:
        vision = vision_model_of(loaded)
        batch = vision.encode_images([as_pil_image(source) for source in images])
        return capture_encoded(vision, batch, **recording)
    captioner = captioner_of(loaded)  # refused before any image is read, as a model that is not one
    batch = captioner.encode_images([as_pil_image(source) for source in images], targets=targets)
    return capture_encoded(captioner, batch, **recording)


def capture_image(loaded: LoadedModel, image: ImageSource) -> AttentionCapture:
    """:func:`capture_images` of one image."""
    return capture_images(loaded, [image])[0]
