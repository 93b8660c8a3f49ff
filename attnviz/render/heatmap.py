"""Attention heatmaps. Rendering takes tensors and labels; it never loads a model.

Rows are queries ("attending from"), columns are keys ("attended to"). Cells a
query may not see (the future, in causal attention) are drawn as masked, not
as zeros.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnviz.io import atomic_path, check_output_path

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")

#: Inches per token on a single heatmap, and the bounds of the figure's side.
_INCHES_PER_TOKEN = 0.38
_MIN_SIDE, _MAX_SIDE = 5.0, 28.0
#: Above this many tokens, only every n-th tick label is drawn so labels stay legible.
_MAX_LABELS = 60
#: Default for annotation: print weights in cells when a single heatmap has at most this many tokens.
ANNOTATE_MAX_TOKENS = 20

_MASKED_COLOR = "#d9d9d9"
_CMAP = "viridis"


@dataclass
class HeatmapPanel:
    """One heatmap: a ``[query, key]`` pattern, its title, and which cells are visible."""

    pattern: Tensor  # [query, key], float
    title: str
    visible: Tensor | None = None  # [query, key] bool; False cells are drawn as masked
    #: a line is drawn before this row / column: where generated tokens start (None: no line)
    query_boundary: int | None = None
    key_boundary: int | None = None


def causal_visibility(query_len: int, key_len: int) -> Tensor:
    """``[q, k]`` bool: query ``i`` sees keys ``0..i`` (aligned at the end when lengths differ)."""
    offset = key_len - query_len
    return torch.ones(query_len, key_len, dtype=torch.bool).tril(diagonal=offset)


#: Tick labels longer than this are shortened with an ellipsis.
_MAX_LABEL_CHARS = 16


def _short(label: str) -> str:
    return label if len(label) <= _MAX_LABEL_CHARS else label[: _MAX_LABEL_CHARS - 1] + "…"


def _tick_step(count: int) -> int:
    return max(1, math.ceil(count / _MAX_LABELS))


def _side(tokens: int) -> float:
    return min(_MAX_SIDE, max(_MIN_SIDE, tokens * _INCHES_PER_TOKEN + 2.0))


def _draw(ax, panel: HeatmapPanel, query_labels, key_labels, *, vmax, annotate, colorbar, cbar_ax=None, small=False):
    import numpy as np

    data = panel.pattern.detach().float().cpu().numpy()  # [query, key]
    mask = None if panel.visible is None else ~panel.visible.cpu().numpy().astype(bool)  # [query, key]
    ax.set_facecolor(_MASKED_COLOR)  # masked cells show the background
    if small:
        _draw_grid_cell(ax, data, mask, vmax=vmax, annotate=annotate)
    else:
        _draw_seaborn(ax, data, mask, vmax=vmax, annotate=annotate, colorbar=colorbar, cbar_ax=cbar_ax)
    _draw_boundaries(ax, panel)
    q_step, k_step = _tick_step(len(query_labels)), _tick_step(len(key_labels))
    fontsize = 5 if small else (7 if max(len(query_labels), len(key_labels)) > 30 else 9)
    ax.set_xticks(np.arange(0, len(key_labels), k_step) + 0.5)
    ax.set_xticklabels(
        [_short(key_labels[i]) for i in range(0, len(key_labels), k_step)], rotation=90, fontsize=fontsize
    )
    ax.set_yticks(np.arange(0, len(query_labels), q_step) + 0.5)
    ax.set_yticklabels(
        [_short(query_labels[i]) for i in range(0, len(query_labels), q_step)], rotation=0, fontsize=fontsize
    )
    if small:  # a single heatmap's title is the figure's
        ax.set_title(panel.title, fontsize=8)


_BOUNDARY_COLOR = "#e8384f"


def _draw_boundaries(ax, panel: HeatmapPanel) -> None:
    """Dashed lines between the prompt and the generated tokens (cell edges sit at integer coordinates)."""
    if panel.query_boundary is not None:
        ax.axhline(panel.query_boundary, color=_BOUNDARY_COLOR, linestyle="--", linewidth=1.2)
    if panel.key_boundary is not None:
        ax.axvline(panel.key_boundary, color=_BOUNDARY_COLOR, linestyle="--", linewidth=1.2)


def _draw_seaborn(ax, data, mask, *, vmax, annotate, colorbar, cbar_ax):
    import seaborn as sns

    sns.heatmap(
        data,
        mask=mask,
        ax=ax,
        vmin=0.0,
        vmax=vmax,
        cmap=_CMAP,
        square=False,
        annot=annotate,
        fmt=".2f",
        annot_kws={"fontsize": 7},
        cbar=colorbar,
        cbar_ax=cbar_ax,
        cbar_kws={"label": "attention weight"} if colorbar else None,
        xticklabels=False,
        yticklabels=False,
        linewidths=0.0,
    )


def _draw_grid_cell(ax, data, mask, *, vmax, annotate):
    """One small heatmap of a grid, drawn like seaborn's but with matplotlib alone.

    ``seaborn.heatmap`` renders the whole figure once per call (to check tick-label
    overlap), so a grid of n of them costs O(n²) renders: 30 panels took 19 s.
    """
    import numpy as np

    values = np.ma.masked_array(data, mask=mask) if mask is not None else data
    mesh = ax.pcolormesh(values, cmap=_CMAP, vmin=0.0, vmax=vmax)  # masked cells stay transparent
    ax.set_xlim(0, data.shape[1])
    ax.set_ylim(0, data.shape[0])
    ax.invert_yaxis()  # row 0 at the top, as in a matrix
    for spine in ax.spines.values():
        spine.set_visible(False)
    if annotate:
        colors = mesh.cmap(mesh.norm(data))  # [query, key, rgba]
        luminance = 0.2126 * colors[..., 0] + 0.7152 * colors[..., 1] + 0.0722 * colors[..., 2]
        for (row, column), value in np.ndenumerate(data):
            if mask is not None and mask[row, column]:
                continue
            ax.text(
                column + 0.5,
                row + 0.5,
                f"{value:.2f}",
                ha="center",
                va="center",
                fontsize=5,
                color="black" if luminance[row, column] > 0.408 else "white",
            )
    return mesh


def render_heatmaps(
    panels: Sequence[HeatmapPanel],
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    *,
    title: str,
    annotate: bool | None = None,
    columns: int | None = None,
):
    """A matplotlib figure: one large heatmap, or a grid of small ones with a shared colour scale.

    ``annotate=None`` prints weights in the cells of a single heatmap of at most
    :data:`ANNOTATE_MAX_TOKENS` tokens.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not panels:
        raise ValueError("no heatmap panels to render")
    vmax = max(float(panel.pattern.max()) for panel in panels) or 1.0
    tokens = max(len(query_labels), len(key_labels))
    if len(panels) == 1:
        if annotate is None:
            annotate = tokens <= ANNOTATE_MAX_TOKENS
        side = _side(tokens)
        fig, ax = plt.subplots(figsize=(side * 1.15, side))
        _draw(ax, panels[0], query_labels, key_labels, vmax=vmax, annotate=annotate, colorbar=True)
        ax.set_xlabel("attended to (keys)")
        ax.set_ylabel("attending from (queries)")
        fig.suptitle(title, fontsize=12)
        fig.tight_layout()
        return fig
    columns = columns or min(len(panels), math.ceil(math.sqrt(len(panels) * 1.3)))
    rows = math.ceil(len(panels) / columns)
    cell = min(_MAX_SIDE / columns, max(2.6, _side(tokens) / 2.2))
    fig, axes = plt.subplots(rows, columns, figsize=(cell * columns + 1.2, cell * rows + 0.8), squeeze=False)
    cbar_ax = fig.add_axes((0.93, 0.15, 0.015, 0.7))
    for index, ax in enumerate(axes.flat):
        if index >= len(panels):
            ax.axis("off")
            continue
        _draw(
            ax,
            panels[index],
            query_labels,
            key_labels,
            vmax=vmax,
            annotate=bool(annotate),
            colorbar=False,
            small=True,
        )
    shared_scale = matplotlib.cm.ScalarMappable(norm=matplotlib.colors.Normalize(0.0, vmax), cmap=_CMAP)
    colorbar = fig.colorbar(shared_scale, cax=cbar_ax)
    colorbar.outline.set_linewidth(0)
    cbar_ax.set_ylabel("attention weight")
    fig.suptitle(f"{title}\nrows: attending from (queries) · columns: attended to (keys)", fontsize=11)
    fig.subplots_adjust(left=0.06, right=0.91, bottom=0.08, top=0.9, wspace=0.45, hspace=0.55)
    return fig


def save_figure(fig, path: str | Path) -> Path:
    """Save a figure atomically; the format follows the suffix (.png, .svg or .pdf)."""
    import matplotlib.pyplot as plt

    path = check_output_path(path, FIGURE_SUFFIXES)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=path.suffix.lstrip(".").lower(), dpi=150, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path
