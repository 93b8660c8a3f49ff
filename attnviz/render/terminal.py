"""One attention pattern drawn in a terminal with rich: coloured cells, token labels, a scale legend.

Each cell is two character columns wide; the view fits the given width by keeping the
first keys and queries and says how many were left out. Labels are laid out by display width
(:mod:`attnviz.common.cells`: a CJK character or an emoji takes two columns). Without colour (a view
redirected to a file or a pager, ``NO_COLOR``) each cell carries its weight as a shade character,
``░▒▓█``, with a legend of the weights each shade stands for.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.common.cells import characters, display_width, fit, pad_left, pad_right
from attnviz.render.capture_view import capture_panels
from attnviz.render.heatmap import MASKED_LABEL, FigureStyle
from attnviz.render.selection import MeanOfHeads

_LABEL_CHARS = 12
_CELL = 2  # characters per cell
_HEADER_CHARS = 8  # key labels are written vertically, at most this many characters
_MASKED = "grey23"
#: a cell's weight without colour: the shade of its level, from nothing (blank) to the top of the scale
SHADES = " ░▒▓█"
#: a masked cell without colour (a causal model's future keys)
MASKED_GLYPH = "·"


def _colour(value: float, norm, cmap) -> str:
    r, g, b, _ = cmap(float(norm(value)))
    return f"rgb({int(r * 255)},{int(g * 255)},{int(b * 255)})"


def shade(value: float, norm) -> str:
    """The shade character of ``value`` on ``norm``'s scale (:data:`SHADES`, rounded to the nearest level)."""
    import math

    fraction = norm(value)
    fraction = 0.0 if fraction is None or _is_masked(fraction) or math.isnan(float(fraction)) else float(fraction)
    return SHADES[round(min(max(fraction, 0.0), 1.0) * (len(SHADES) - 1))]


def _is_masked(value) -> bool:
    import numpy as np

    return bool(np.ma.is_masked(value))


def shade_legend(norm, vmax: float, scale: str) -> Text:
    """Which weights each shade stands for: ``blank <0.11 ░ <0.34 ▒ <0.56 ▓ <0.79 █ ≤0.899 (linear scale)``."""
    steps = len(SHADES) - 1
    bounds = [float(norm.inverse((level + 0.5) / steps)) for level in range(steps)]  # between two shades
    parts = [f"blank <{bounds[0]:.2g}"]
    parts += [f"{SHADES[level]} <{bounds[level]:.2g}" for level in range(1, steps)]
    parts.append(f"{SHADES[-1]} ≤{vmax:.3g}")
    return Text("  " + " ".join(parts) + f" ({scale} scale)")


def scale_legend(norm, vmax: float, scale: str, cmap, *, colour: bool, note: str = "") -> Text:
    """The line under a terminal view that says which weight each colour stands for (``note`` after it), or without
    colour each shade (:func:`shade_legend`)."""
    if not colour:
        return shade_legend(norm, vmax, scale)
    import numpy as np

    legend = Text("  0 " if scale != "log" else f"  {vmax / 1000:.4f} ")
    for step in np.linspace(0, 1, 24):
        legend.append(" ", style=f"on {_colour(norm.inverse(step), norm, cmap)}")
    legend.append(f" {vmax:.3f} ({scale} scale){note}")
    return legend


def vertical_labels(labels: list[str], *, cell: int, rows: int, indent: int) -> list[Text]:
    """Labels written downwards, one column of ``cell`` display columns each, at most ``rows`` characters deep
    (a wide character fills its column; a combining mark stays on its letter)."""
    pieces = [characters(label)[:rows] for label in labels]
    lines = []
    for row in range(rows):
        line = " " * indent + "".join(pad_right(p[row] if row < len(p) else "", cell) for p in pieces)
        if line.strip():
            lines.append(Text(line))
    return lines


def terminal_heatmap(
    capture: AttentionCapture,
    *,
    layer: int = -1,
    head: int | MeanOfHeads = 0,
    stack: str | None = None,
    words: bool = False,
    width: int = 100,
    max_rows: int = 80,
    style: FigureStyle | None = None,
    colour: bool = True,
) -> Group:
    """A rich renderable of one head (or :data:`~attnviz.render.selection.MEAN_OF_HEADS`) that fits ``width`` columns.

    ``colour=False``: cells are :data:`SHADES` characters (the view must read without colour: a file, a pager).
    """

    style = style or FigureStyle()
    style.check()
    heads = head if isinstance(head, MeanOfHeads) else [head]
    rows, query_labels, key_labels, title = capture_panels(
        capture, layers=[layer], heads=heads, stack=stack, words=words
    )
    panel = rows[0][0]
    data = panel.pattern.detach().float().cpu().numpy()  # [query, key]
    visible = None if panel.visible is None else panel.visible.cpu().numpy().astype(bool)  # [query, key]
    label_width = min(_LABEL_CHARS, max(display_width(label) for label in query_labels)) + 1
    room = max(1, (width - label_width - 1) // _CELL)
    n_queries, n_keys = data.shape
    shown_keys, shown_queries = min(n_keys, room), min(n_queries, max_rows)
    vmax = style.vmax or float(data[visible].max() if visible is not None else data.max()) or 1.0
    norm, cmap = style.norm(vmax), style.colour_map()

    lines: list[Text] = [Text(title, style="bold"), Text("rows: attending from · columns: attended to", style="dim")]
    lines.extend(vertical_labels(key_labels[:shown_keys], cell=_CELL, rows=_HEADER_CHARS, indent=label_width))
    for query in range(shown_queries):
        line = Text(pad_left(fit(query_labels[query], label_width - 1), label_width - 1) + " ")
        for key in range(shown_keys):
            masked = visible is not None and not visible[query, key]
            if not colour:
                line.append(pad_left(MASKED_GLYPH if masked else shade(data[query, key], norm) * _CELL, _CELL))
            else:
                line.append(" " * _CELL, style=f"on {_MASKED if masked else _colour(data[query, key], norm, cmap)}")
        lines.append(line)

    lines.append(scale_legend(norm, vmax, style.scale, cmap, colour=colour))
    if visible is not None and not visible.all():
        masked_line = Text("  ")
        masked_line.append(" " + MASKED_GLYPH if not colour else "  ", style=f"on {_MASKED}" if colour else "")
        masked_line.append(f" {MASKED_LABEL}")
        lines.append(masked_line)
    left_out = []
    if shown_keys < n_keys:
        left_out.append(f"keys {shown_keys}–{n_keys - 1} ({n_keys - shown_keys} of {n_keys})")
    if shown_queries < n_queries:
        left_out.append(f"queries {shown_queries}–{n_queries - 1} ({n_queries - shown_queries} of {n_queries})")
    if left_out:
        lines.append(
            Text(
                "left out to fit: "
                + "; ".join(left_out)
                + (". Widen the terminal, " if words else ". Widen the terminal, merge pieces into words, ")
                + "or write a figure or an .html page to see all of it.",
                style="yellow",
            )
        )
    return Group(*lines)
