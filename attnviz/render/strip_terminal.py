"""One query's attention strips in a terminal with rich: one line of coloured cells per layer and head.

Each strip is max-pooled to the terminal's width (each cell holds the largest weight of the keys it
covers, and a closing line says how many), and under each strip its strongest keys are listed with
their positions, tokens and weights: at 4,096 keys no token label could be written along the strip.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from attnviz.captures.query_rows import QueryRows
from attnviz.common.cells import display_width, fit, pad_left
from attnviz.common.tokens import display_token
from attnviz.render.heatmap import MASKED_LABEL, FigureStyle
from attnviz.render.query_strip import TOP_KEYS, pool_max
from attnviz.render.terminal import _MASKED, MASKED_GLYPH, SHADES, _colour, scale_legend

__all__ = ["terminal_strip"]

_TOKEN_CHARS = 12
_MAX_CELL = 3  # characters per cell at most


def _unchanged(value: float) -> float:
    return value


def _token(label: str) -> str:
    return fit(label, _TOKEN_CHARS)


def terminal_strip(
    rows: QueryRows,
    *,
    width: int = 100,
    style: FigureStyle | None = None,
    top_k: int = TOP_KEYS,
    colour: bool = True,
) -> Group:
    """A rich renderable of ``rows``' strips that fits ``width`` columns, each strip followed by its top keys.

    ``colour=False``: cells are shade characters (:data:`~attnviz.render.terminal.SHADES`), for a view read
    without colour (a file, a pager)."""
    import numpy as np

    style = style or FigureStyle()
    style.check()
    matrix = rows.matrix()  # [strip, key]
    strips, keys = matrix.shape
    labels = rows.labels()
    label_width = max(display_width(label) for label in labels) + 1
    room = max(1, width - label_width - 1)
    cell = max(1, min(_MAX_CELL, room // keys))  # characters per cell: short texts get wider cells
    pooled, covered, block = pool_max(matrix, rows.visible, room // cell)  # [strip, column], [column]
    visible_values = matrix if rows.visible is None else matrix[:, rows.visible]
    vmax = style.vmax or float(visible_values.max()) or 1.0
    norm, cmap = style.norm(vmax), style.colour_map()
    tokens = [display_token(token) for token in rows.key_tokens]
    top = rows.top_keys(top_k) if top_k else [[] for _ in range(strips)]

    query = display_token(rows.query_token)
    lines: list[Text] = [
        Text(f"{rows.model} · attention of query {rows.query} ('{query}') over {keys:,} keys", style="bold"),
        Text("one line per head: attended-to keys from left (first) to right (last)", style="dim"),
    ]
    # The colour map has cmap.N colours: name each once (with render/terminal.py's helper on values
    # already normalised), then give every cell the colour of its level, as the map itself would.
    palette = [_colour((level + 0.5) / cmap.N, _unchanged, cmap) for level in range(cmap.N)]
    shown = pooled.numpy()
    shown = np.maximum(shown, norm.vmin) if style.scale == "log" else shown  # zeros sit at the bottom of a log scale
    levels = np.clip((np.asarray(norm(shown)) * cmap.N).astype(int), 0, cmap.N - 1)  # [strip, column]
    for index in range(strips):
        line = Text(pad_left(labels[index], label_width - 1) + " ")
        if not colour:
            glyphs = (SHADES[round(level / (cmap.N - 1) * (len(SHADES) - 1))] for level in levels[index])
            line.append("".join(g * cell if seen else MASKED_GLYPH * cell for g, seen in zip(glyphs, covered.tolist())))
        else:
            colours = [palette[level] if seen else _MASKED for level, seen in zip(levels[index], covered.tolist())]
            run = 0
            for column, shown_colour in enumerate(colours):  # one segment per run of cells of the same colour
                run += 1
                if column + 1 == len(colours) or colours[column + 1] != shown_colour:
                    line.append(" " * (cell * run), style=f"on {shown_colour}")
                    run = 0
        lines.append(line)
        listed = "  ".join(f"{key}:{_token(tokens[key])} {float(matrix[index, key]):.2f}" for key in top[index])
        lines.append(Text(" " * label_width + "top: " + listed, style="dim", no_wrap=True, overflow="ellipsis"))

    span = pooled.shape[1] * cell
    axis = [" "] * span
    axis[min(rows.query // block, pooled.shape[1] - 1) * cell] = "▲"
    lines.append(Text(" " * label_width + "".join(axis)))
    lines.append(Text(" " * label_width + "0" + f"{keys - 1}".rjust(max(1, span - 1)), style="dim"))

    lines.append(scale_legend(norm, vmax, style.scale, cmap, colour=colour, note=" · ▲ the query's position"))
    if not colour:
        lines.append(Text("  ▲ the query's position"))
    if rows.visible is not None and not bool(rows.visible.all()):
        masked_line = Text("  ")
        masked_line.append("  " if colour else MASKED_GLYPH * 2, style=f"on {_MASKED}" if colour else "")
        masked_line.append(f" {MASKED_LABEL}")
        lines.append(masked_line)
    if block > 1:
        lines.append(
            Text(
                f"each cell is the largest weight of {block} neighbouring keys ({keys:,} keys in "
                f"{pooled.shape[1]} cells); widen the terminal or write a figure to see more",
                style="yellow",
            )
        )
    return Group(*lines)
