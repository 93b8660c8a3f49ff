"""Images as attnviz input: reading them safely, and how a vision transformer's tokens map onto the picture.

A ViT-style model reads an image as a few *extra tokens* (the class token, DeiT's distillation
token, DINOv2's registers; SigLIP has none) followed by one token per patch of a ``rows × cols``
grid, row-major. :class:`ImageGrid` records that layout; tokens are labelled ``[CLS]``,
``[DIST]``, ``[REG0]``… and ``r{row}c{col}``.
"""

from __future__ import annotations

import io
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from attnviz.common.errors import InputError, reason

if TYPE_CHECKING:
    from PIL.Image import Image

ExtraKind = Literal["cls", "distillation", "register"]
#: label of each kind of extra token (registers are numbered)
EXTRA_LABELS: dict[str, str] = {"cls": "[CLS]", "distillation": "[DIST]", "register": "[REG{}]"}
#: file suffixes ``--images DIR`` reads
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
#: the smallest side an image may have: a single pixel cannot be resized into patches meaningfully
MIN_SIDE = 2


@dataclass(frozen=True)
class ImageGrid:
    """How a vision transformer's tokens cover the image: extra tokens first, then ``rows × cols`` patches."""

    rows: int
    cols: int
    extra_kinds: tuple[str, ...]  # kinds of the tokens before the patches, in order ("cls", "register", …)
    patch_size: tuple[int, int] = (1, 1)  # pixels per patch (height, width) of the resized image
    #: position of the first image token in the model's token sequence: 0 for a vision model, where the image is
    #: the whole input; where the image sits inside a text (a vision-language model), the extra tokens and the
    #: patches are the positions ``start … start + num_tokens - 1``
    start: int = 0

    @property
    def num_extra(self) -> int:
        return len(self.extra_kinds)

    @property
    def num_patches(self) -> int:
        return self.rows * self.cols

    @property
    def num_tokens(self) -> int:
        return self.num_extra + self.num_patches

    @property
    def has_class_token(self) -> bool:
        return bool(self.extra_kinds) and self.extra_kinds[0] == "cls"

    def token_labels(self) -> list[str]:
        """``[CLS]`` (and the other extra tokens) then ``r{row}c{col}`` row-major."""
        labels, registers = [], 0
        for kind in self.extra_kinds:
            if kind == "register":
                labels.append(EXTRA_LABELS["register"].format(registers))
                registers += 1
            else:
                labels.append(EXTRA_LABELS[kind])
        return labels + [f"r{row}c{col}" for row in range(self.rows) for col in range(self.cols)]

    def patch_token(self, row: int, col: int) -> int:
        """Token index of patch ``(row, col)``; a clear error outside the grid."""
        if not (0 <= row < self.rows and 0 <= col < self.cols):
            raise InputError(
                f"patch ({row}, {col}) is outside the {self.rows}×{self.cols} patch grid: "
                f"use a row 0–{self.rows - 1} and a column 0–{self.cols - 1}"
            )
        return self.num_extra + row * self.cols + col

    @property
    def positions(self) -> range:
        """The sequence positions of the image's tokens (extra tokens, then the patches row-major)."""
        return range(self.start, self.start + self.num_tokens)

    def to_dict(self) -> dict:
        values = {
            "rows": self.rows,
            "cols": self.cols,
            "extra_kinds": list(self.extra_kinds),
            "patch_size": list(self.patch_size),
        }
        return values | ({"start": self.start} if self.start else {})

    @classmethod
    def from_dict(cls, values: object) -> ImageGrid:
        """The inverse of :meth:`to_dict`; ValueError on anything malformed (a damaged file)."""
        if not isinstance(values, dict):
            raise ValueError("the image grid is not an object")  # noqa: TRY004 (a damaged file, as below)
        rows, cols, kinds = values.get("rows"), values.get("cols"), values.get("extra_kinds")
        patch = values.get("patch_size", [1, 1])
        if not (isinstance(rows, int) and isinstance(cols, int) and rows >= 1 and cols >= 1):
            raise ValueError("the image grid's rows and cols are not positive integers")
        if not isinstance(kinds, list) or any(kind not in EXTRA_LABELS for kind in kinds):
            raise ValueError(f"the image grid's extra_kinds are not a list of {', '.join(EXTRA_LABELS)}")
        if not (isinstance(patch, list) and len(patch) == 2 and all(isinstance(p, int) and p >= 1 for p in patch)):
            raise ValueError("the image grid's patch_size is not two positive integers")
        start = values.get("start", 0)
        if not (isinstance(start, int) and start >= 0):
            raise ValueError("the image grid's start is not a position")
        return cls(rows, cols, tuple(kinds), (patch[0], patch[1]), start)


def open_image(source: str | os.PathLike | bytes, *, name: str | None = None) -> Image:
    """Read an image file (or its bytes) fully into an RGB PIL image; one clear InputError on anything else.

    Refuses a missing file, a file that is not an image, a truncated or damaged image, and an
    image smaller than :data:`MIN_SIDE` pixels on a side.
    """
    try:
        from PIL import Image as PILImage
        from PIL import UnidentifiedImageError
    except ImportError as exc:  # pragma: no cover - Pillow is a dependency
        raise InputError("reading images needs Pillow: pip install pillow") from exc

    if isinstance(source, bytes):
        label = name or "standard input"
        if not source:
            raise InputError(f"{label} is empty: give a PNG or JPEG image")
        stream: io.BytesIO | Path = io.BytesIO(source)
    else:
        stream = Path(source).expanduser()
        label = name or str(stream)
        if not stream.is_file():
            raise InputError(f"image {label} does not exist or is not a file")
    limit = PILImage.MAX_IMAGE_PIXELS  # Pillow's guard against decompression bombs (None: switched off)
    try:
        with warnings.catch_warnings():
            # Pillow warns (between the limit and twice it) or raises (beyond): either way the image is refused
            # below in one line, before its pixels are decoded
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)
            with PILImage.open(stream) as image:
                if limit and image.width * image.height > limit:
                    raise InputError(_too_many_pixels(label, image.width * image.height, limit, image.size))
                image.load()  # decode now: a truncated file fails here, not halfway through a figure
                rgb = image.convert("RGB")
    except UnidentifiedImageError as exc:
        raise InputError(f"{label} is not an image Pillow can read: give a PNG or JPEG file") from exc
    except PILImage.DecompressionBombError as exc:
        found = re.search(r"\((\d+) pixels\)", str(exc))
        raise InputError(_too_many_pixels(label, int(found.group(1)) if found else None, limit)) from None
    except (OSError, ValueError, SyntaxError) as exc:  # truncated data, a damaged header
        raise InputError(
            f"{label} is a damaged or truncated image ({reason(exc)}): give an intact PNG or JPEG file"
        ) from exc
    if min(rgb.size) < MIN_SIDE:
        raise InputError(
            f"{label} is {rgb.size[0]}×{rgb.size[1]} pixels: too small to cut into patches "
            f"(give an image at least {MIN_SIDE}×{MIN_SIDE}; a real photo is best)"
        )
    return rgb


def _too_many_pixels(label: str, pixels: int | None, limit: int | None, size: tuple[int, int] | None = None) -> str:
    shape = f"{size[0]:,}×{size[1]:,} = " if size else ""
    count = f" ({shape}{pixels:,} pixels)" if pixels else ""
    return (
        f"{label} is too large to decode safely{count}: Pillow's limit against decompression bombs is "
        f"{limit:,} pixels; shrink the image first (a vision model resizes it to a few hundred pixels a side anyway)"
    )


def image_files(folder: str | os.PathLike) -> list[Path]:
    """The image files directly in ``folder`` (by suffix), sorted; a clear error when there are none."""
    directory = Path(folder).expanduser()
    if not directory.is_dir():
        raise InputError(f"{directory} is not a directory of images")
    files = sorted(path for path in directory.iterdir() if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise InputError(f"{directory} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    return files


def image_names(sources: Sequence[str | os.PathLike | bytes]) -> list[str]:
    """A short name per image source, for titles ("standard input" for bytes)."""
    return ["standard input" if isinstance(source, bytes) else Path(source).name for source in sources]
