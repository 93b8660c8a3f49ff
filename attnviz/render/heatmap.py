"""Attention heatmaps. Rendering takes tensors and labels; it never loads a model.

Rows are queries ("attending from"), columns are keys ("attended to"). Cells a
query may not see (the future, in causal attention) are drawn as masked, not
as zeros, and a legend says so. Several heatmaps are laid out one row per layer,
heads across, on one shared colour scale; the figure is scaled to the grid rather
than the grid capped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from attnviz.common.errors import InputError
from attnviz.outputs.files import atomic_path, check_output_path
from attnviz.render.choices import SCALES
from attnviz.render.panels import HeatmapPanel

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")

#: Inches per token on a single heatmap, and the bounds of the figure's side.
_INCHES_PER_TOKEN = 0.38
_MIN_SIDE, _MAX_SIDE = 5.0, 32.0
#: Side of a single pooled heatmap (inches): 512 cells at 150 dpi are about four pixels each.
_POOLED_SIDE = 14.0
#: Bounds of a grid figure (inches): wide enough for 16 heads, tall enough for 30 layers.
_GRID_MAX_WIDTH, _GRID_MAX_HEIGHT = 26.0, 64.0
#: Default for annotation: print weights in cells when a single heatmap has at most this many tokens.
ANNOTATE_MAX_TOKENS = 20
#: The log scale spans this many decades below the top of the scale.
_LOG_DECADES = 3

_MASKED_COLOR = "#d9d9d9"
MASKED_LABEL = "masked: the query cannot see this key"


@dataclass
class FigureStyle:
    """How weights become colours: ``scale`` linear/sqrt/log, the top of the scale (None: the largest weight), the map."""

    scale: str = "linear"
    vmax: float | None = None
    cmap: str = "viridis"
    #: what the colours stand for (the colour bar's label)
    label: str = "attention weight"

    def check(self) -> None:
        """Raise :class:`InputError` for an unknown scale or colour map, or a non-positive ``vmax``."""
        import matplotlib

        if self.scale not in SCALES:
            raise InputError(f"unknown colour scale {self.scale!r}: use {', '.join(SCALES)}")
        if self.vmax is not None and not self.vmax > 0:
            raise InputError(f"the top of the colour scale must be positive, not {self.vmax}")
        if self.cmap not in matplotlib.colormaps:
            raise InputError(f"unknown colour map {self.cmap!r}: use a matplotlib colour map such as viridis or magma")

    def norm(self, vmax: float):
        from matplotlib import colors

        if self.scale == "sqrt":
            return colors.PowerNorm(0.5, vmin=0.0, vmax=vmax, clip=True)
        if self.scale == "log":
            return colors.LogNorm(vmin=vmax / 10**_LOG_DECADES, vmax=vmax, clip=True)
        return colors.Normalize(0.0, vmax, clip=True)

    def colour_map(self):
        import matplotlib

        # masked cells stay transparent: the grey background shows
        return matplotlib.colormaps[self.cmap].with_extremes(bad=(0, 0, 0, 0))


_BOUNDARY_COLOR = "#e8384f"


def _draw_boundaries(ax, panel: HeatmapPanel) -> None:
    """Dashed lines between the prompt and the generated tokens (cell edges sit at integer coordinates)."""
    if panel.query_boundary is not None:
        ax.axhline(panel.query_boundary, color=_BOUNDARY_COLOR, linestyle="--", linewidth=1.2)
    if panel.key_boundary is not None:
        ax.axvline(panel.key_boundary, color=_BOUNDARY_COLOR, linestyle="--", linewidth=1.2)


def causal_visibility(query_len: int, key_len: int) -> Tensor:
    """``[q, k]`` bool: query ``i`` sees keys ``0..i`` (aligned at the end when lengths differ)."""
    offset = key_len - query_len
    return torch.ones(query_len, key_len, dtype=torch.bool).tril(diagonal=offset)


#: Most tick labels per axis: laying out hundreds of labels is what made long figures slow, and more
#: than this many cannot be read anyway.
MAX_TICK_LABELS = 48
#: Tick labels longer than this are shortened with an ellipsis.
_MAX_LABEL_CHARS = 16


def _short(label: str) -> str:
    return label if len(label) <= _MAX_LABEL_CHARS else label[: _MAX_LABEL_CHARS - 1] + "…"


def label_positions(count: int, room: int) -> list[int]:
    """Which of ``count`` tick labels to draw when only ``room`` fit: evenly thinned, first and last always kept."""
    if count <= max(room, 2):
        return list(range(count))
    step = math.ceil((count - 1) / max(room - 1, 1))
    positions = list(range(0, count, step))
    if count - 1 - positions[-1] < step / 2 and len(positions) > 1:
        positions.pop()  # too close to the last label: keep the last one instead
    if positions[-1] != count - 1:
        positions.append(count - 1)
    return positions


def _font_and_room(inches: float, count: int, small: bool) -> tuple[float, int]:
    """Font size (pt) for ``count`` labels along ``inches``, and how many labels fit at that size."""
    largest, smallest = (6.0, 4.0) if small else (9.0, 5.0)
    per_label = inches * 72 / max(count, 1)  # points per token along the axis
    font = min(largest, max(smallest, per_label / 1.25))
    return font, max(2, int(inches * 72 / (font * 1.25)))


def _side(tokens: int) -> float:
    return min(_MAX_SIDE, max(_MIN_SIDE, tokens * _INCHES_PER_TOKEN + 2.0))


def draw_weights(ax, data, mask, style: FigureStyle, norm, *, extent: tuple[float, float, float, float]):
    """Draw ``data`` [rows, columns] on ``ax`` as one image spanning ``extent`` (left, right, bottom, top), without a
    frame: cells where ``mask`` is True (None: none) show the background, and zeros sit at the bottom of a log scale.
    Returns (the image, the values drawn before masking)."""
    import numpy as np

    ax.set_facecolor(_MASKED_COLOR)  # masked cells show the background
    shown = np.maximum(data, norm.vmin) if style.scale == "log" else data
    values = np.ma.masked_array(shown, mask=mask) if mask is not None else shown
    # one image rather than a mesh of n² quads: ten times faster at 350 tokens, and a single image in SVG/PDF
    image = ax.imshow(values, cmap=style.colour_map(), norm=norm, interpolation="nearest", aspect="auto", extent=extent)
    for spine in ax.spines.values():
        spine.set_visible(False)
    return image, shown


def _draw(
    ax,
    panel: HeatmapPanel,
    query_labels,
    key_labels,
    *,
    style,
    norm,
    annotate,
    side,
    small,
    key_ticks=True,
    query_ticks=True,
):
    """Draw one heatmap with matplotlib alone (seaborn re-renders the whole figure per call: O(n²) in a grid)."""
    import numpy as np

    data = panel.pattern.detach().float().cpu().numpy()  # [query, key]
    mask = None if panel.visible is None else ~panel.visible.cpu().numpy().astype(bool)  # [query, key]
    # row 0 at the top, as in a matrix
    mesh, shown = draw_weights(ax, data, mask, style, norm, extent=(0, data.shape[1], data.shape[0], 0))
    if annotate:
        colours = mesh.cmap(norm(shown))  # [query, key, rgba]
        luminance = 0.2126 * colours[..., 0] + 0.7152 * colours[..., 1] + 0.0722 * colours[..., 2]
        for (row, column), value in np.ndenumerate(data):
            if mask is not None and mask[row, column]:
                continue
            ax.text(
                column + 0.5,
                row + 0.5,
                f"{value:.2f}",
                ha="center",
                va="center",
                fontsize=5 if small else 7,
                color="black" if luminance[row, column] > 0.408 else "white",
            )
    for labels, set_ticks, set_labels, rotation, wanted in (
        (key_labels, ax.set_xticks, ax.set_xticklabels, 90, key_ticks),
        (query_labels, ax.set_yticks, ax.set_yticklabels, 0, query_ticks),
    ):
        if not wanted:  # inner panels of a grid: the outer panels carry the labels
            set_ticks([])
            continue
        # sized for the labels that will be drawn (at most MAX_TICK_LABELS; a third of that on a grid's small
        # panels), not for every token
        most = MAX_TICK_LABELS // 3 if small else MAX_TICK_LABELS
        font, room = _font_and_room(side, min(len(labels), most), small)
        positions = label_positions(len(labels), min(room, most))
        set_ticks([p + 0.5 for p in positions])
        set_labels([_short(labels[p]) for p in positions], rotation=rotation, fontsize=font)
    _draw_boundaries(ax, panel)
    ax.tick_params(length=2, pad=1)
    if small:
        ax.set_title(panel.title, fontsize=7, pad=2)
    return mesh


def render_heatmaps(
    panels: Sequence[HeatmapPanel] | Sequence[Sequence[HeatmapPanel]],
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    *,
    title: str,
    annotate: bool | None = None,
    style: FigureStyle | None = None,
):
    """A matplotlib figure: one large heatmap, or a grid of small ones with a shared colour scale.

    ``panels`` is a flat list (laid out in one row) or a list of rows (one per layer,
    heads across). ``annotate=None`` prints weights in the cells of a single heatmap
    of at most :data:`ANNOTATE_MAX_TOKENS` tokens. Past 512 tokens a side, panels are max-pooled
    (:mod:`attnviz.render.pooling`) and the figure says by how much.
    """
    from matplotlib.patches import Patch

    from attnviz.render.figures import subplots
    from attnviz.render.pooling import pool_panels

    style = style or FigureStyle()
    style.check()
    if panels and not isinstance(panels[0], HeatmapPanel):
        grid = cast("Sequence[Sequence[HeatmapPanel]]", panels)
        rows = [list(row) for row in grid]
    else:
        rows = [list(cast("Sequence[HeatmapPanel]", panels))]
    rows = [row for row in rows if row]
    flat = [panel for row in rows for panel in row]
    if len(flat) > 1 and (len(rows) == 1 or all(len(row) == 1 for row in rows)):
        # one layer's heads, or one panel per layer: wrap into a near-square grid instead of a long strip
        columns = min(len(flat), math.ceil(math.sqrt(len(flat) * 1.3)))
        rows = [flat[i : i + columns] for i in range(0, len(flat), columns)]
    if not flat:
        raise ValueError("no heatmap panels to render")
    # long inputs: each panel max-pooled to a few hundred cells a side (rows keep their lengths)
    pooled, query_labels, key_labels, pooling = pool_panels(flat, query_labels, key_labels, grid=len(flat) > 1)
    if pooling is not None:
        lengths = [len(row) for row in rows]
        starts = [sum(lengths[:i]) for i in range(len(rows))]
        rows = [pooled[start : start + length] for start, length in zip(starts, lengths)]
        flat = pooled
        annotate = False  # a pooled cell is a block's maximum, not one weight
    vmax = style.vmax or _largest_visible(flat) or 1.0
    norm = style.norm(vmax)
    tokens = max(len(query_labels), len(key_labels))
    masked = any(panel.visible is not None and not bool(panel.visible.all()) for panel in flat)
    if len(flat) == 1:
        if annotate is None:
            annotate = tokens <= ANNOTATE_MAX_TOKENS
        side = _side(tokens) if pooling is None else _POOLED_SIDE
        fig, ax = subplots(figsize=(side * 1.18, side + 0.6), layout="constrained")
        mesh = _draw(
            ax, flat[0], query_labels, key_labels, style=style, norm=norm, annotate=annotate, side=side, small=False
        )
        ax.set_xlabel("attended to (keys)")
        ax.set_ylabel("attending from (queries)")
        axes_for_bar = ax
    else:
        columns = max(len(row) for row in rows)
        cell = min(3.2, max(1.2, _side(tokens) / 2.5), _GRID_MAX_WIDTH / columns, _GRID_MAX_HEIGHT / len(rows))
        fig, axes = subplots(
            len(rows),
            columns,
            figsize=(cell * columns + 1.4, cell * len(rows) + 1.2),
            squeeze=False,
            layout="constrained",
        )
        for row_index, row in enumerate(rows):
            for column in range(columns):
                ax = axes[row_index][column]
                if column >= len(row):
                    ax.axis("off")
                    continue
                below = row_index + 1 < len(rows) and column < len(rows[row_index + 1])
                mesh = _draw(
                    ax,
                    row[column],
                    query_labels,
                    key_labels,
                    style=style,
                    norm=norm,
                    annotate=bool(annotate),
                    side=cell * 0.8,
                    small=True,
                    key_ticks=not below,
                    query_ticks=column == 0,
                )
        axes_for_bar = axes
    extend = "max" if style.vmax is not None and _largest_visible(flat) > style.vmax else "neither"
    colorbar = fig.colorbar(mesh, ax=axes_for_bar, shrink=0.5, extend=extend, aspect=40, fraction=0.04)
    colorbar.outline.set_linewidth(0)
    colorbar.set_label(f"{style.label} ({style.scale} scale)")
    subtitle = "" if len(flat) == 1 else "\nrows of each panel: attending from (queries) · columns: attended to (keys)"
    if pooling is not None:
        subtitle += "\n" + pooling.note
    fig.suptitle(title + subtitle, fontsize=11)
    if masked:
        fig.legend(
            handles=[Patch(facecolor=_MASKED_COLOR, edgecolor="#999999", label=MASKED_LABEL)],
            loc="outside lower center",
            fontsize=8,
            frameon=False,
        )
    return fig


def _largest_visible(panels: Sequence[HeatmapPanel]) -> float:
    largest = 0.0
    for panel in panels:
        values = panel.pattern if panel.visible is None else panel.pattern[panel.visible.to(panel.pattern.device)]
        if values.numel():
            largest = max(largest, float(values.max()))
    return largest


def save_figure(fig, path: str | Path, *, dpi: int = 150) -> Path:
    """Save a figure atomically; the format follows the suffix (.png, .svg or .pdf).

    PDF text is embedded as TrueType (Type 42) and SVG text stays text, so both can be
    searched and edited.
    """
    import matplotlib

    path = check_output_path(path, FIGURE_SUFFIXES)
    fonts: dict[str, Any] = {"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"}
    # rc_context puts every rcParam back on the way out; the figure was made without pyplot (render/figures.py),
    # so nothing is left to close
    with matplotlib.rc_context(fonts), atomic_path(path) as tmp:  # type: ignore[arg-type]
        fig.savefig(tmp, format=path.suffix.lstrip(".").lower(), dpi=dpi)
    return path
