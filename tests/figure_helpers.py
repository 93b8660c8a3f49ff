"""Reading back what a command drew: the text and images of an SVG figure, the pixels of a PNG.

matplotlib writes SVG text as ``<text>`` elements (attnviz sets ``svg.fonttype = none``) and every
``imshow`` panel and colour bar as one ``<image>``, so a test can check labels, titles and panel
counts of a figure the CLI wrote, not just that a file appeared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PANEL_TITLE = re.compile(r"^L(\d+) H(\d+)( \(masked\))?$")  # one head's panel in a grid: "L5 H0", "L1 H3 (masked)"


@dataclass
class SvgFigure:
    texts: list[str]  # every text element, in drawing order
    images: int  # raster images: heatmap panels and colour bars

    def panel_titles(self) -> list[tuple[int, int]]:
        """``(layer, head)`` of every head panel of a grid, in drawing order."""
        return [(int(m[1]), int(m[2])) for text in self.texts if (m := PANEL_TITLE.match(text))]

    def annotations(self) -> list[float]:
        """The values written into the cells, row by row (two decimals; tick labels have fewer)."""
        return [float(text) for text in self.texts if re.fullmatch(r"-?\d+\.\d\d", text)]


def read_svg(path: Path) -> SvgFigure:
    svg = Path(path).read_text()
    assert svg.lstrip().startswith(("<?xml", "<svg")), f"{path} is not an SVG file"
    texts = [_unescape(text) for text in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]
    return SvgFigure(texts=texts, images=svg.count("<image"))


def _unescape(text: str) -> str:
    return (
        text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", '"')
        .replace("&#39;", "'")
        .replace("&amp;", "&")
    )


def png_pixels(path: Path):
    """``[height, width, channels]`` float array of a PNG file (raises if it is not one)."""
    import matplotlib.image

    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG file"
    return matplotlib.image.imread(path)


def distinct_colours(pixels) -> int:
    """How many different colours a ``[height, width, channels]`` image uses (a blank figure has a handful)."""
    import numpy

    flat = (pixels[..., :3] * 255).round().astype(numpy.uint8).reshape(-1, 3)
    return len(numpy.unique(flat, axis=0))
