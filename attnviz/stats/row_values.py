"""Per-query statistics of one block of patterns, or of the fused kernel's row summaries.

:class:`~attnviz.stats.accumulator.StatisticsAccumulator` turns each block the core hands it into
``[S, b, h, blk]`` values with :func:`block_statistics` (from the pattern) or :func:`summary_statistics`
(from the kernel's :class:`~attnviz.core.kernel_calls.RowSummary`, which needs no pass over the block).
"""

from __future__ import annotations

import bisect
import math

import torch
from torch import Tensor

from attnviz.core.kernel_calls import RowSummary
from attnviz.stats.geometry import BlockLayout, StackGeometry


def block_statistics(
    pattern: Tensor,
    layout: BlockLayout,
    geometry: StackGeometry,
    scratch: Tensor | None = None,
    scores: Tensor | None = None,
    summary: RowSummary | None = None,
    sink_share: Tensor | None = None,
) -> Tensor:
    """Per-query statistics of one block of patterns.

    Args:
        pattern: float32 ``[b, h, blk, k']``: rows are the block's queries, columns the first
            ``k' ≥ layout.width`` keys (any later key has weight 0).
        layout: the block's positions and which queries count (:meth:`BlockLayout.build`).
        geometry: lengths, key positions and special tokens of the batch on this stack.
        scratch: optional float32 buffer of at least ``b·h·blk·c`` elements for the one
            elementwise temporary (reusing it avoids writing fresh memory every block).
        scores: optional float32 ``[b, h, blk, k']``, the softmax input ``pattern`` came from;
            with it the entropy needs no logarithm over the block.
        summary: optional row summary from the core's fused kernel (:class:`~attnviz.core.kernel_calls.RowSummary`);
            when its band reaches the local window (:func:`summary_covers`) no statistic needs a pass.
        sink_share: ``[b, h, blk]`` each row's weight on its head's attention sink, or None (no sinks): the
            pattern's rows then sum to ``1 − sink_share`` and the entropy counts the sink as one more outcome.
            ``scores`` are not used with it (they lack the sink's logit).

    Returns:
        ``[S, b, h, blk]`` float32 in :data:`STATISTIC_NAMES` order; meaningful where
        ``layout.counted`` is true.
    """
    pattern = pattern[..., : layout.width]  # [b, h, blk, c]
    batch, heads, rows, width = pattern.shape

    if summary is not None and summary_covers(summary, layout.local_window):
        return summary_statistics(summary, pattern[..., 0], special_mass(pattern, geometry), layout, sink_share)
    # no usable summary: every statistic from the pattern
    temporary = torch.empty_like(pattern) if scratch is None else scratch[: pattern.numel()].view(pattern.shape)
    max_weight = pattern.amax(-1)  # [b, h, blk]
    if scores is not None and sink_share is None:
        # A = softmax(s), so ln Aᵢⱼ = sᵢⱼ − lseᵢ and the entropy is lseᵢ − Σⱼ Aᵢⱼ sᵢⱼ, where
        # lseᵢ = maxⱼ sᵢⱼ − ln maxⱼ Aᵢⱼ (the largest score gives the largest weight). Two cheap
        # passes instead of a logarithm over the block, the costliest step of the statistics.
        scores = scores[..., :width]  # [b, h, blk, c]
        weighted = torch.mul(pattern, scores, out=temporary).sum(-1)  # [b, h, blk]
        if weighted.isnan().any():  # a −inf mask: 0·(−inf) = NaN, where the term is 0 (rare: redo)
            weighted = torch.mul(pattern, scores, out=temporary).nan_to_num_(nan=0.0).sum(-1)
        entropy = (scores.amax(-1) - max_weight.log()) - weighted  # [b, h, blk] nats
        entropy.clamp_(min=0.0)  # rounding can give −1e-7 for a one-hot row
    else:
        # −Σ A log A with A log A = 0 at A = 0 (log of A + tiny), via log2, the fastest log.
        log_pattern = torch.add(pattern, torch.finfo(torch.float32).tiny, out=temporary).log2_()  # [b, h, blk, c]
        entropy = log_pattern.mul_(pattern).sum(-1).mul_(-math.log(2))  # [b, h, blk] nats
        if sink_share is not None:  # the sink is one more outcome of the softmax
            entropy = entropy - torch.xlogy(sink_share, sink_share)
    if layout.distances is None:
        # causal: every visible j ≤ i, so Σ Aᵢⱼ |i − j| = i·Σ Aᵢⱼ − Σ Aᵢⱼ·j, as one matrix-vector product
        mass = pattern.sum(-1)  # [b, h, blk] (1 up to rounding)
        flat = pattern.reshape(batch, heads * rows, width)  # [b, h·blk, c] (a view: rows stay contiguous)
        position_sum = torch.matmul(flat, geometry.key_positions[:, :width]).view(batch, heads, rows)  # [b, h, blk]
        distance = layout.query * mass - position_sum  # [b, h, blk]
    else:
        distance = torch.mul(pattern, layout.distances, out=temporary).sum(-1)  # [b, h, blk]

    special = special_mass(pattern, geometry)
    special = pattern.new_zeros(batch, heads, rows) if special is None else special
    # weights on keys i − offset (offsets −w…w, then 1): one gather for diagonal, previous and local
    w = layout.local_window
    band = pattern.gather(-1, layout.band_columns.expand(batch, heads, rows, -1)) * layout.band_valid  # [b, h, blk, o]
    previous = band[..., w + 1] if w >= 1 else band[..., -1]
    return _stack_statistics(
        layout,
        entropy,
        max_weight,
        distance,
        band[..., w],
        previous,
        band[..., : 2 * w + 1].sum(-1),
        pattern[..., 0],
        special,
        sink_share,
    )


def band_reach_needed(local_window: int) -> int:
    """How far either side of the diagonal a row summary must hold weights: the local window and the previous key."""
    return max(local_window, 1)


def summary_covers(summary: RowSummary | None, local_window: int) -> bool:
    """Whether the kernel's ``summary`` holds every statistic (its band reaches :func:`band_reach_needed`)."""
    return summary is not None and summary.band_reach >= band_reach_needed(local_window)


def special_mass(pattern: Tensor, geometry: StackGeometry) -> Tensor | None:
    """``[b, h, blk]``: each query's weight on special tokens, from ``pattern`` ``[b, h, blk, c]``;
    None where no special token is among the ``c`` keys (the weight is 0).

    Special tokens are few ([CLS], [SEP], BOS, EOS): their columns are gathered, no pass is made.
    """
    columns = geometry.special_columns[: bisect.bisect_left(geometry.special_columns, pattern.shape[-1])]
    if not columns:
        return None
    return (pattern[..., columns] * geometry.special_weights[..., : len(columns)]).sum(-1)


def summary_columns_mass(summary: RowSummary, geometry: StackGeometry) -> tuple[Tensor, Tensor | None]:
    """``(first, special)`` ``[b, h, blk]`` as :func:`special_mass` gives them, from a summary's ``columns``."""
    first = summary.column(0)
    if first is None:
        raise ValueError("the summary does not hold key 0")
    indices, found = [], []
    for index, column in enumerate(geometry.special_columns):
        weights = summary.column(column)
        if weights is not None:
            indices.append(index)
            found.append(weights)
    if not found:
        return first, None
    columns = torch.stack(found)  # [u, b, h, blk]
    flags = geometry.special_flags(tuple(indices))  # [u, b, 1, 1]
    return first, (columns * flags).sum(0)


def summary_statistics(
    summary: RowSummary,
    first: Tensor,
    special: Tensor | None,
    layout: BlockLayout,
    sink_share: Tensor | None = None,
) -> Tensor:
    """``[S, b, h, q]`` statistics from the kernel's row summary, whose band reaches the local window.

    ``first``, ``special``: ``[b, h, q]`` weights on key 0 and on special tokens (None: 0);
    ``layout``: the same queries' positions (:meth:`BlockLayout.rows` suffices); ``sink_share``: ``[b, h, q]``
    each row's weight on its head's sink (None: no sinks; the kernel's entropy then already counts the sink).
    """
    special = torch.zeros_like(first) if special is None else special
    reach, w = summary.band_reach, layout.local_window
    band = summary.band  # [2·reach + 1, b, h, q]: weights on keys i − o, o = −reach … reach
    local = band[reach - w : reach + w + 1].sum(0)  # [b, h, q]
    return _stack_statistics(
        layout,
        summary.entropy,
        summary.max_weight,
        summary.distance,
        band[reach],
        band[reach + 1],
        local,
        first,
        special,
        sink_share,
    )


def _stack_statistics(
    layout, entropy, max_weight, distance, diagonal, previous, local, first, special, sink_share
) -> Tensor:
    """The per-query values (each ``[b, h, q]``) as ``[S, b, h, q]`` in :data:`STATISTIC_NAMES` order.

    ``sink_share`` ``[b, h, q]`` or None (no sinks: 0, and the entropy is normalised by the keys alone)."""
    outcomes = layout.log_visible if sink_share is None else layout.log_visible_and_sink
    return torch.stack(
        [
            entropy,
            entropy / outcomes,
            max_weight,
            distance,
            distance / layout.reach,
            diagonal,  # offset 0
            previous,  # offset 1
            local,  # |i − j| ≤ w
            first,
            special,
            torch.zeros_like(entropy) if sink_share is None else sink_share,
        ]
    )
