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
from typing import TYPE_CHECKING, Any, Literal, Union

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
    """How a vision transformer's tokens cover the image: extra tokens first, then ``rows × cols`` patches.

    A picture cut into ``tiles`` (Mllama: ``tile rows × tile cols`` tiles of the processed canvas, each read as
    a picture of its own) orders its tokens tile by tile, row-major over the tiles: each tile's extra tokens, then
    its own patches row-major; ``padding`` tokens follow (the empty tiles the model reads and masks). Patches are
    still named by their place on the whole canvas, ``r{row}c{col}``.
    """

    rows: int
    cols: int
    extra_kinds: tuple[str, ...]  # kinds of the tokens before the patches (of each tile), in order ("cls", …)
    patch_size: tuple[int, int] = (1, 1)  # pixels per patch (height, width) of the resized image
    #: position of the first image token in the model's token sequence: 0 for a vision model, where the image is
    #: the whole input; where the image sits inside a text (a vision-language model), the extra tokens and the
    #: patches are the positions ``start … start + num_tokens - 1``
    start: int = 0
    tiles: tuple[int, int] = (1, 1)  # (tile rows, tile cols) the picture was cut into, each a block of the grid
    padding: int = 0  # tokens of empty tiles after the picture's (masked by the model)
    #: where a text reads the picture through cross-attention (Mllama), the text position of its placeholder
    #: token: the text after it reads the picture
    placeholder: int | None = None

    @property
    def num_tiles(self) -> int:
        return self.tiles[0] * self.tiles[1]

    @property
    def num_extra(self) -> int:
        return len(self.extra_kinds) * self.num_tiles

    @property
    def num_patches(self) -> int:
        return self.rows * self.cols

    @property
    def num_tokens(self) -> int:
        return self.num_extra + self.num_patches + self.padding

    @property
    def has_class_token(self) -> bool:
        return bool(self.extra_kinds) and self.extra_kinds[0] == "cls"

    def _tile_shape(self) -> tuple[int, int]:
        """(patch rows, patch cols) of one tile."""
        return self.rows // self.tiles[0], self.cols // self.tiles[1]

    def _tile_tokens(self) -> int:
        """Tokens of one tile: its extra tokens and its patches."""
        rows, cols = self._tile_shape()
        return len(self.extra_kinds) + rows * cols

    def _extra_labels(self) -> list[str]:
        labels, registers = [], 0
        for kind in self.extra_kinds:
            if kind == "register":
                labels.append(EXTRA_LABELS["register"].format(registers))
                registers += 1
            else:
                labels.append(EXTRA_LABELS[kind])
        return labels

    def token_labels(self) -> list[str]:
        """``[CLS]`` (and the other extra tokens) then ``r{row}c{col}`` row-major; tile by tile where the picture
        was cut into tiles (each tile's extra tokens numbered by tile, ``[CLS]1``), then ``[PAD]`` tokens."""
        extras = self._extra_labels()
        if self.num_tiles == 1:
            patches = [f"r{row}c{col}" for row in range(self.rows) for col in range(self.cols)]
            return extras + patches + ["[PAD]"] * self.padding
        labels: list[str] = [""] * (self.num_tokens - self.padding)
        for index, label in zip(self.extra_indices(), extras * self.num_tiles, strict=True):
            labels[index] = f"{label}{index // self._tile_tokens()}"
        for index, (row, col) in zip(self.patch_indices(), self._cells(), strict=True):
            labels[index] = f"r{row}c{col}"
        return labels + ["[PAD]"] * self.padding

    def _cells(self) -> list[tuple[int, int]]:
        return [(row, col) for row in range(self.rows) for col in range(self.cols)]

    def patch_indices(self) -> list[int]:
        """Token index of every patch, row-major over the whole picture (``[rows·cols]``)."""
        return [self._patch_index(row, col) for row, col in self._cells()]

    def extra_indices(self) -> list[int]:
        """Token index of every extra token, tile by tile (``[num_extra]``)."""
        per_tile = self._tile_tokens()
        return [tile * per_tile + kind for tile in range(self.num_tiles) for kind in range(len(self.extra_kinds))]

    def _patch_index(self, row: int, col: int) -> int:
        tile_rows, tile_cols = self._tile_shape()
        tile = (row // tile_rows) * self.tiles[1] + col // tile_cols
        inside = (row % tile_rows) * tile_cols + col % tile_cols
        return tile * self._tile_tokens() + len(self.extra_kinds) + inside

    def patch_token(self, row: int, col: int) -> int:
        """Token index of patch ``(row, col)``; a clear error outside the grid."""
        if not (0 <= row < self.rows and 0 <= col < self.cols):
            raise InputError(
                f"patch ({row}, {col}) is outside the {self.rows}×{self.cols} patch grid: "
                f"use a row 0–{self.rows - 1} and a column 0–{self.cols - 1}"
            )
        return self._patch_index(row, col)

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
        optional = {"start": self.start, "tiles": list(self.tiles), "padding": self.padding}
        optional |= {"placeholder": self.placeholder}
        defaults = {"start": 0, "tiles": [1, 1], "padding": 0, "placeholder": None}
        return values | {key: value for key, value in optional.items() if value != defaults[key]}

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
        if not _positive_pair(patch):
            raise ValueError("the image grid's patch_size is not two positive integers")
        start, padding = values.get("start", 0), values.get("padding", 0)
        tiles, placeholder = values.get("tiles", [1, 1]), values.get("placeholder")
        if not all(isinstance(value, int) and value >= 0 for value in (start, padding)):
            raise ValueError("the image grid's start or padding is not a position")
        if not _positive_pair(tiles) or rows % tiles[0] or cols % tiles[1]:
            raise ValueError("the image grid's tiles are not two positive integers dividing its rows and cols")
        if placeholder is not None and not (isinstance(placeholder, int) and placeholder >= 0):
            raise ValueError("the image grid's placeholder is not a position")
        return cls(rows, cols, tuple(kinds), (patch[0], patch[1]), start, (tiles[0], tiles[1]), padding, placeholder)


def _positive_pair(values: object) -> bool:
    return isinstance(values, list) and len(values) == 2 and all(isinstance(v, int) and v >= 1 for v in values)


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
