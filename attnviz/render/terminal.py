"""One attention pattern drawn in a terminal with rich: coloured cells, token labels, a scale legend.

Each cell is two character columns wide; the view fits the given width by keeping the
first keys and queries and says how many were left out.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.render.capture_view import capture_panels
from attnviz.render.heatmap import MASKED_LABEL, FigureStyle
from attnviz.render.selection import MeanOfHeads

_LABEL_CHARS = 12
_CELL = 2  # characters per cell
_HEADER_CHARS = 8  # key labels are written vertically, at most this many characters
_MASKED = "grey23"


def _colour(value: float, norm, cmap) -> str:
    r, g, b, _ = cmap(float(norm(value)))
    return f"rgb({int(r * 255)},{int(g * 255)},{int(b * 255)})"


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
) -> Group:
    """A rich renderable of one head (or :data:`~attnviz.render.selection.MEAN_OF_HEADS`) that fits ``width`` columns."""
    import numpy as np

    style = style or FigureStyle()
    style.check()
    heads = head if isinstance(head, MeanOfHeads) else [head]
    rows, query_labels, key_labels, title = capture_panels(
        capture, layers=[layer], heads=heads, stack=stack, words=words
    )
    panel = rows[0][0]
    data = panel.pattern.detach().float().cpu().numpy()  # [query, key]
    visible = None if panel.visible is None else panel.visible.cpu().numpy().astype(bool)  # [query, key]
    label_width = min(_LABEL_CHARS, max(len(label) for label in query_labels)) + 1
    room = max(1, (width - label_width - 1) // _CELL)
    n_queries, n_keys = data.shape
    shown_keys, shown_queries = min(n_keys, room), min(n_queries, max_rows)
    vmax = style.vmax or float(data[visible].max() if visible is not None else data.max()) or 1.0
    norm, cmap = style.norm(vmax), style.colour_map()

    lines: list[Text] = [Text(title, style="bold"), Text("rows: attending from · columns: attended to", style="dim")]
    for character in range(_HEADER_CHARS):  # key labels, vertical
        line = Text(" " * label_width)
        for key in range(shown_keys):
            label = key_labels[key][:_HEADER_CHARS]
            line.append((label[character] if character < len(label) else " ").ljust(_CELL))
        if line.plain.strip():
            lines.append(line)
    for query in range(shown_queries):
        label = query_labels[query]
        label = label if len(label) < label_width else label[: label_width - 2] + "…"
        line = Text(label.rjust(label_width - 1) + " ")
        for key in range(shown_keys):
            masked = visible is not None and not visible[query, key]
            line.append(" " * _CELL, style=f"on {_MASKED if masked else _colour(data[query, key], norm, cmap)}")
        lines.append(line)

    legend = Text("  0 " if style.scale != "log" else f"  {vmax / 1000:.4f} ")
    for step in np.linspace(0, 1, 24):
        legend.append(" ", style=f"on {_colour(norm.inverse(step), norm, cmap)}")
    legend.append(f" {vmax:.3f} ({style.scale} scale)")
    lines.append(legend)
    if visible is not None and not visible.all():
        masked_line = Text("  ")
        masked_line.append("  ", style=f"on {_MASKED}")
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
