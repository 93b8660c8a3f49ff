"""One query's attention over every key, drawn as strips: one row of colour per layer and head.

This is how long-context attention is read: where does the last token look among 4,096 keys (the
first token, the recent ones, a retrieved passage)? The strips share one colour scale and one key
axis; token labels along it are thinned, and each strip's strongest keys are marked and listed
with their tokens beside it. Above :data:`MAX_COLUMNS` keys the strips are max-pooled (each column
holds the largest weight of the block of keys it covers, so a sharp peak never fades) and the figure
says so. All strips are one image, so drawing 270 of them takes about as long as drawing one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnviz.captures.query_rows import QueryRows
from attnviz.common.errors import ParameterError
from attnviz.common.tokens import display_token
from attnviz.models.names import full_model_name
from attnviz.render.heatmap import _MASKED_COLOR, MASKED_LABEL, FigureStyle, draw_weights, label_positions

__all__ = ["MAX_COLUMNS", "TOP_KEYS", "pool_max", "query_strip"]

#: Above this many keys a strip is max-pooled to at most this many columns.
MAX_COLUMNS = 1024
#: Keys marked and listed per strip by default.
TOP_KEYS = 5
#: Width of the strips and of the list of top keys beside them (inches).
_STRIP_INCHES, _LIST_INCHES = 8.5, 4.6
_QUERY_COLOUR, _TOP_COLOUR = "#e8384f", "#00e5ff"
#: where the mark of a top key sits, from the top of its strip (a fraction of the strip's height)
_MARK_HEIGHT = 0.22
_STACK_WORDS = {"self": "", "encoder": "encoder ", "decoder": "decoder ", "cross": "cross-"}


def pool_max(matrix: Tensor, visible: Tensor | None, columns: int) -> tuple[Tensor, Tensor, int]:
    """Max-pool ``[strip, key]`` weights to at most ``columns`` columns of ``block`` consecutive keys each.

    Returns (``[strip, column]`` maxima, ``[column]`` bool: the column covers a key the query can see,
    ``block``). Keys the query cannot see weigh 0, so they never change a column's maximum.
    """
    strips, keys = matrix.shape
    block = max(1, math.ceil(keys / max(columns, 1)))
    count = math.ceil(keys / block)
    padded = torch.zeros(strips, count * block, dtype=matrix.dtype)
    padded[:, :keys] = matrix
    seen = torch.zeros(count * block, dtype=torch.bool)
    seen[:keys] = True if visible is None else visible
    return padded.view(strips, count, block).amax(-1), seen.view(count, block).any(-1), block


def _row_inches(strips: int) -> float:
    """Height of one strip: roomy for a layer's heads, thinner for many (the strips of SmolLM2's 270 heads: 28 inches)."""
    return max(0.1, min(0.34, 28.0 / max(strips, 1)))


def _key_label(position: int, label: str, every: bool) -> str:
    short = label if len(label) <= 12 else label[:11] + "…"
    return short if every else f"{short} ·{position}"


def _listed(label: str) -> str:
    return label if len(label) <= 10 else label[:9] + "…"


def _weight(value: float) -> str:
    """``.32``, ``1.0``: two decimals in the width of three characters."""
    return "1.0" if value >= 0.995 else f"{value:.2f}".removeprefix("0")


def query_strip(
    rows: QueryRows,
    *,
    style: FigureStyle | None = None,
    top_k: int = TOP_KEYS,
    max_columns: int = MAX_COLUMNS,
    title: str | None = None,
):
    """A figure of ``rows`` (from :func:`~attnviz.captures.query_rows.capture_query_rows`): one strip per layer and head.

    ``top_k`` keys of largest weight per strip are marked (a triangle points at each) and listed with their tokens and weights;
    ``max_columns``: above this many keys the strips are max-pooled (stated in the figure); ``style``:
    colour scale, top of the scale and colour map, shared by every strip.
    """
    import numpy as np

    from attnviz.render.figures import new_figure

    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ParameterError("top_k", f"{{top_k}} must be a whole number of keys, 0 or more, not {top_k!r}", top_k)
    if isinstance(max_columns, bool) or not isinstance(max_columns, int) or max_columns < 1:
        raise ParameterError("max_columns", f"{{max_columns}} must be at least 1, not {max_columns!r}", max_columns)
    style = style or FigureStyle()
    style.check()
    matrix = rows.matrix()  # [strip, key]
    strips, keys = matrix.shape
    pooled, covered, block = pool_max(matrix, rows.visible, max_columns)  # [strip, column], [column]
    visible_values = matrix if rows.visible is None else matrix[:, rows.visible]
    vmax = style.vmax or float(visible_values.max()) or 1.0
    norm = style.norm(vmax)
    data = pooled.numpy()

    row_inches = _row_inches(strips)
    figure = new_figure(figsize=(_STRIP_INCHES + _LIST_INCHES, strips * row_inches + 2.6), layout="constrained")
    ax, listing = figure.subplots(1, 2, width_ratios=[_STRIP_INCHES, _LIST_INCHES], sharey=True)
    uncovered = np.broadcast_to(~covered.numpy(), data.shape)
    # x in key positions, strip 0 at the top
    image, _ = draw_weights(ax, data, uncovered, style, norm, extent=(0, data.shape[1] * block, strips, 0))
    ax.set_xlim(0, keys)

    # key axis: thinned token labels (with their positions when not every key is labelled)
    labels = [display_token(token) for token in rows.key_tokens]
    font = 6.0
    positions = label_positions(keys, max(2, int(_STRIP_INCHES * 72 / (font * 1.6))))
    every = len(positions) == keys
    ax.set_xticks([position + 0.5 for position in positions])
    ax.set_xticklabels([_key_label(p, labels[p], every) for p in positions], rotation=90, fontsize=font)
    ax.set_xlabel(f"keys (attended to): {keys:,} tokens" + ("" if every else f", {len(positions)} labelled"))

    # strip axis: every strip named, or only each layer when there are too many to name
    strip_labels = rows.labels()
    layer_sizes = [row.shape[0] for row in rows.rows]
    strip_font = min(7.0, max(3.5, row_inches * 72 * 0.6))
    if strips <= 80 or len(layer_sizes) == strips:
        ax.set_yticks([index + 0.5 for index in range(strips)])
        ax.set_yticklabels(strip_labels, fontsize=strip_font)
    else:
        starts = np.cumsum([0, *layer_sizes[:-1]])
        ax.set_yticks([start + size / 2 for start, size in zip(starts, layer_sizes)])
        ax.set_yticklabels([f"L{layer}" for layer in rows.layers], fontsize=7)
    if len(layer_sizes) > 1 and max(layer_sizes) > 1:
        for boundary in np.cumsum(layer_sizes)[:-1]:
            ax.axhline(boundary, color="white", linewidth=0.8)
    ax.tick_params(length=2, pad=1)
    ax.axvline(rows.query + 0.5, color=_QUERY_COLOUR, linestyle="--", linewidth=1.0, label="the query's position")

    # the strongest keys of each strip: a triangle in the top part of the strip points down at each (the
    # cell itself stays visible: a peak one key wide is a thin line), and they are listed beside the strip
    top = rows.top_keys(top_k) if top_k else [[] for _ in range(strips)]
    marks = [(key + 0.5, index + _MARK_HEIGHT) for index, keys_of_strip in enumerate(top) for key in keys_of_strip]
    if marks:
        ax.scatter(
            [x for x, _ in marks],
            [y for _, y in marks],
            s=max(4.0, (row_inches * 72 * 0.32) ** 2),
            marker="v",
            facecolors=_TOP_COLOUR,
            edgecolors="black",
            linewidths=0.3,
            label=f"the {top_k} keys of largest weight (listed right)",
        )
    listing.axis("off")
    for index, keys_of_strip in enumerate(top):
        text = "  ".join(f"{key}:{_listed(labels[key])} {_weight(float(matrix[index, key]))}" for key in keys_of_strip)
        listing.text(0.0, index + 0.5, text, va="center", ha="left", fontsize=strip_font, gid=f"top-keys-{index}")
    listing.set_xlim(0, 1)
    listing.set_ylim(strips, 0)

    pooling = (
        "one column per key"
        if block == 1
        else f"max-pooled: each column is the largest weight of {block} neighbouring keys "
        f"({keys:,} keys in {data.shape[1]:,} columns)"
    )
    colorbar = figure.colorbar(image, ax=[ax, listing], location="bottom", shrink=0.45, aspect=50, fraction=0.05)
    colorbar.outline.set_linewidth(0)
    colorbar.set_label(f"attention weight ({style.scale} scale) · {pooling}", fontsize=8)
    handles = [*ax.get_legend_handles_labels()[0]]
    if rows.visible is not None and not bool(rows.visible.all()):
        from matplotlib.patches import Patch

        handles.append(Patch(facecolor=_MASKED_COLOR, edgecolor="#999999", label=MASKED_LABEL))
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=7, frameon=False)
    if title is None:
        full = full_model_name(rows.model)
        name = full if full == rows.model else f"{full} ({rows.model})"
        token = display_token(rows.query_token)
        title = (
            f"{name} · {_STACK_WORDS.get(rows.stack, '')}attention of query {rows.query} ('{token}') "
            f"over {keys:,} keys\n{strips} strip{'s' if strips != 1 else ''}, {pooling}"
        )
    figure.suptitle(title, fontsize=10)
    # Lay the figure out once, now, and keep that layout: with a layout engine still set, every savefig
    # renders the whole figure twice (once to lay it out), which doubles the time of a tall figure.
    figure.draw_without_rendering()
    figure.set_layout_engine("none")
    return figure
