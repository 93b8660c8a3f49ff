"""Capturing a vision transformer's attention on images (see :mod:`attnviz.models.vision`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from attnviz.captures.recording import capture_encoded
from attnviz.captures.result import AttentionCapture
from attnviz.common.images import ImageSource, as_pil_image
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.caption import captioner_of
from attnviz.models.vision import VisionModel, vision_model_of

__all__ = ["ImageSource", "as_pil_image", "capture_image", "capture_images", "image_batches"]


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
