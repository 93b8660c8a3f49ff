"""Static figures of long inputs: patterns max-pooled into at most a few hundred cells per side.

A 4,096-token pattern has 16.8 million cells, more than a figure has pixels, and drawing (and saving
as SVG or PDF) every one is slow for nothing. Past :data:`POOL_ABOVE` cells per side a panel is
max-pooled into blocks of ``w_q × w_k`` tokens (the widths of :func:`attnviz.render.html_rows.bin_width`,
the pooled overview of the HTML page): each cell holds the *largest* weight of its block, so a sharp
weight on one key stays visible instead of being averaged away. The figure says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from attnviz.common.audio import is_time_label
from attnviz.render.html_rows import bin_starts, bin_width
from attnviz.render.panels import HeatmapPanel

#: panels with more cells than this along a side are pooled
POOL_ABOVE = 512
#: most cells per side of a pooled single heatmap, and of each panel of a grid of several
SINGLE_BINS, GRID_BINS = 512, 256


@dataclass(frozen=True)
class Pooling:
    """How a figure's panels were pooled: ``query_width × key_width`` tokens per cell."""

    query_width: int
    key_width: int

    @property
    def note(self) -> str:
        """The line the figure carries: ``max-pooled: 8×8 tokens per cell (the largest weight of each block)``."""
        return (
            f"max-pooled: {self.query_width}×{self.key_width} tokens per cell (each cell: the largest weight "
            "of its block; rows queries, columns keys)"
        )


def max_pool(pattern: Tensor, query_width: int, key_width: int) -> Tensor:
    """``[q, k]`` -> ``[⌈q/w_q⌉, ⌈k/w_k⌉]``: the maximum of each ``w_q × w_k`` block (the last ones may be smaller)."""
    pooled = torch.nn.functional.max_pool2d(
        pattern.detach().float()[None, None],  # [1, 1, q, k]
        kernel_size=(query_width, key_width),
        stride=(query_width, key_width),
        ceil_mode=True,  # a shorter last block is pooled too
    )
    return pooled[0, 0]


def pool_labels(labels: Sequence[str], width: int) -> list[str]:
    """One label per block of ``width`` tokens: the first token's position and label (a time frame's label, which
    says where it stands already, alone)."""
    if width == 1:
        return list(labels)
    starts = bin_starts(len(labels), width)
    if all(is_time_label(labels[start]) for start in starts):
        return [labels[start] for start in starts]
    return [f"{start} {labels[start]}" for start in starts]


def pool_panels(
    panels: Sequence[HeatmapPanel], query_labels: Sequence[str], key_labels: Sequence[str], *, grid: bool
) -> tuple[list[HeatmapPanel], list[str], list[str], Pooling | None]:
    """The panels (and axis labels) max-pooled when a side exceeds :data:`POOL_ABOVE`; else unchanged, None.

    A pooled cell is visible when any cell of its block is (weights are ≥ 0 and masked cells hold 0,
    so the block's maximum is the largest weight the query block gives the key block).
    """
    queries, keys = len(query_labels), len(key_labels)
    if max(queries, keys) <= POOL_ABOVE:
        return list(panels), list(query_labels), list(key_labels), None
    bins = GRID_BINS if grid else SINGLE_BINS
    query_width, key_width = bin_width(queries, bins), bin_width(keys, bins)
    pooled = []
    for panel in panels:
        visible = None
        if panel.visible is not None:
            visible = max_pool(panel.visible.float(), query_width, key_width) > 0
        pooled.append(
            replace(
                panel,
                pattern=max_pool(panel.pattern, query_width, key_width),
                visible=visible,
                query_boundary=None if panel.query_boundary is None else panel.query_boundary / query_width,
                key_boundary=None if panel.key_boundary is None else panel.key_boundary / key_width,
            )
        )
    pooling = Pooling(query_width, key_width)
    return pooled, pool_labels(query_labels, query_width), pool_labels(key_labels, key_width), pooling
