"""The attention core's no-gradient path: blocks of queries in reused buffers.

:func:`attnviz.core.attention.attend` sends the standard softmax pattern here when no gradient
is needed. Per block of queries, ``Q Kᵀ`` goes into a reused buffer, keys the mask hides from
the whole block are skipped (:func:`key_stops`), grouped-query heads share their key/value head
without repeating it, and scale, mask and softmax run either as torch operations or, when it is
loaded, as the fused kernel of :mod:`attnviz.core.kernel`, which can also summarise each row
for observers that accept it (``accepts_summary``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from attnviz.core import kernel_calls
from attnviz.core.kernel_calls import (
    ROWS_PER_TASK,
    RowSummary,
    attend_block_,
    attend_rows_,
    block_kernel_applies,
    fused_softmax_,
    kernel_applies,
    sink_logits,
)
from attnviz.core.key_range import KeyLayout, key_stops
from attnviz.core.triton_rows import attend_rows_triton, triton_applies

if TYPE_CHECKING:
    from attnviz.core.attention import AttentionObserver, AttentionSite, SoftmaxPattern

#: Key widths of a block are rounded up to a multiple of this (within the key length): matrix
#: products with a width of 16·n keep their fast paths, where e.g. 2034 keys cost 40% more than 2032.
WIDTH_MULTIPLE = 16


class _Workspace(threading.local):
    """Flat buffers reused across blocks and layers, one set per thread.

    Writing freshly allocated memory costs a page fault per page (about 4× slower than
    writing memory already in use), and an n×n score tensor is written four times per
    layer; reusing the same buffers removes that cost. They keep the largest size asked for.
    """

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, torch.device, torch.dtype], Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        numel = math.prod(shape)
        buffer = self.buffers.get((name, device, dtype))
        if buffer is None or buffer.numel() < numel:
            buffer = torch.empty(numel, dtype=dtype, device=device)
            self.buffers[(name, device, dtype)] = buffer
        return buffer[:numel].view(shape)


_workspace = _Workspace()


def attend_in_buffers(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | KeyLayout | None,
    pattern_fn: SoftmaxPattern,
    block: int,
    observers: Sequence[AttentionObserver],
    site: AttentionSite | None,
    head_mask: Tensor | None,
    dropout: float,
    training: bool,
    fused: bool = False,
) -> Tensor:
    """The softmax path of :func:`attend` without gradients: in place, in reused buffers.

    A :class:`KeyLayout` ``mask`` (a causal mask said in words) is applied by the tile kernels themselves or
    through a mask of one block's rows at a time, never a ``[q, k]`` tensor."""
    layout = mask if isinstance(mask, KeyLayout) else None
    mask = mask if isinstance(mask, Tensor) else None
    batch, heads, query_len, head_dim = query.shape
    kv_heads, key_len, value_dim = key.shape[1], key.shape[2], value.shape[3]
    n_rep = heads // kv_heads
    output = value.new_empty(batch, query_len, heads, value_dim)  # [b, q, h, dv]
    output_groups = output.view(batch, query_len, kv_heads, n_rep, value_dim)  # [b, q, kvh, n_rep, dv]
    # The fused kernel (attnviz.core.kernel) replaces scale, mask and softmax when the caller asks for
    # it (``fused``), it is loaded and the inputs suit it; never because of who observes.
    use_kernel = (
        fused
        and pattern_fn.bias is None
        and pattern_fn.softcap is None
        and kernel_applies(query.dtype, query.device, mask)
    )
    # Without a head mask or dropout, scores, softmax and pattern·V of a block run as one parallel region of
    # b·h·⌈blk/ROWS_PER_TASK⌉ tasks (kernel.attend_block_): a batched product over 3 grouped key/value heads keeps
    # only 3 threads busy. Observers then read the pattern after the output is made, which they cannot change.
    whole_block = (
        use_kernel and head_mask is None and not (dropout and training) and block_kernel_applies(query, value, mask)
    )
    # per-head sink logits [h] as the kernels read them (float32), or None: the model has no attention sinks
    sinks = sink_logits(pattern_fn.sinks)
    summary_only = all(getattr(observer, "accepts_summary_only", False) for observer in observers)
    tiles = (mask, layout, pattern_fn.scaling, sinks, observers, site, output)  # what the tile passes read
    if whole_block and summary_only:
        return _attend_in_tiles(query, key.contiguous(), value.contiguous(), *tiles)
    if (
        fused
        and summary_only
        and query.device.type == "cuda"
        and pattern_fn.bias is None
        and pattern_fn.softcap is None
        and head_mask is None
        and not (dropout and training)
        and triton_applies(query)
    ):  # the GPU's tile kernel (attnviz.core.triton_rows): the same pass in Triton
        # the kernel reads keys and values through their strides: no copy
        return _attend_in_tiles(query, key, value, *tiles)
    key = key.contiguous()  # [b, kvh, k, d]
    value = value.contiguous()  # [b, kvh, k, dv]
    if whole_block:
        # at long lengths the cache-sized block holds few rows (28 at 8,192 keys for 9 heads); a task's two
        # products repack all of its keys per call, so each head gets two tasks of ROWS_PER_TASK rows at least
        block = min(query_len, max(block, 2 * ROWS_PER_TASK))
    stops = layout.key_spans(block, query_len, key_len)[1] if layout else key_stops(mask, block, query_len, key_len)
    prefix_observers = [observer for observer in observers if getattr(observer, "accepts_key_prefix", False)]
    # scores stand for the pattern's logarithm only without a sink (whose weight they lack)
    keep_scores = (
        not use_kernel
        and sinks is None
        and any(getattr(observer, "accepts_scores", False) for observer in prefix_observers)
    )
    summarised = [
        observer for observer in prefix_observers if use_kernel and getattr(observer, "accepts_summary", False)
    ]
    # the band of weights around the diagonal the summary carries: as wide as the widest request
    band_reach = max((getattr(observer, "summary_band_reach", 1) for observer in summarised), default=0)
    weigher, key_weights = (
        _weigher(prefix_observers, site, batch, heads, key_len, query.device) if whole_block else (None, None)
    )
    for start, stop_width in zip(range(0, query_len, block), stops):
        stop = min(start + block, query_len)
        rows = stop - start
        width = _rounded_width(stop_width, key_len)
        # Grouped-query attention without repeating keys: the n_rep query heads that share a
        # key/value head become extra rows of one matmul against it (head h = g·n_rep + r).
        scores = _workspace.get("scores", (batch, kv_heads, n_rep * rows, width), query.dtype, query.device)
        mask_block = None if mask is None else mask[:, :, start:stop] if mask.shape[2] > 1 else mask
        if layout is not None:  # [b|1, 1, blk, c]: the layout's rows of this block only
            mask_block = layout.additive_rows(start, rows, width, query.dtype, query.device)
        if not whole_block:
            query_block = query[:, :, start:stop].reshape(
                batch, kv_heads, n_rep * rows, head_dim
            )  # [b, kvh, n_rep·blk, d]
            torch.matmul(query_block, key[:, :, :width].transpose(2, 3), out=scores)  # [b, kvh, n_rep·blk, c]
        scores = scores.view(batch, heads, rows, width)  # [b, h, blk, c]
        summary = None
        weighted: Tensor | None = None  # [b, h, blk] weighted sums for ``weigher``
        sink_share: Tensor | None = None  # [b, h, blk]: each row's weight on its head's sink (with sinks only)
        if sinks is not None and use_kernel:
            sink_share = _workspace.get("sink_share", (batch, heads, rows), torch.float32, query.device)
        if use_kernel:
            summary_buffer = None
            if summarised:
                shape = RowSummary.buffer_shape(batch, heads, rows, band_reach)  # [4 + 2r, b, h, blk]
                summary_buffer = _workspace.get("summary", shape, torch.float32, query.device)
            if whole_block:  # scores, pattern, summary and output of the block's rows, in place
                if weigher is not None:
                    weighted = _workspace.get("weighted", (batch, heads, rows), torch.float32, query.device)
                attend_block_(
                    query,
                    key,
                    value,
                    scores,
                    mask_block,
                    pattern_fn.scaling,
                    start,
                    summary_buffer,
                    output,
                    key_weights,
                    weighted,
                    sinks,
                    sink_share,
                )
            elif not fused_softmax_(
                scores, mask_block, pattern_fn.scaling, start, summary_buffer, sinks, sink_share
            ):  # in place
                raise RuntimeError("the fused kernel refused inputs that kernel_applies accepted")  # a bug, not input
            pattern = scores
            if summary_buffer is not None:
                summary = RowSummary(summary_buffer)
        elif sinks is not None:
            pattern_fn.adjust_scores_(scores, mask_block, start)
            pattern, sink_share = _softmax_with_sinks(scores, sinks)
        else:
            pattern_fn.adjust_scores_(scores, mask_block, start)
            # Softmax into a reused float32 buffer (torch.softmax has no out=; aten's _softmax.out equals
            # it bit for bit). On the CPU, float32 scores are overwritten in place: the CPU kernel reads
            # each row before writing it, and one buffer instead of two halves the memory of a block.
            # Observers that want the scores keep them: the softmax then writes a second buffer,
            # which gives the same numbers.
            if scores.dtype == torch.float32 and scores.device.type == "cpu" and not keep_scores:
                pattern = scores
            else:
                pattern = _workspace.get("pattern", (batch, heads, rows, width), torch.float32, query.device)
                scores = scores.float()
            torch.ops.aten._softmax.out(scores, -1, False, out=pattern)  # [b, h, blk, c]

        full_width = None  # [b, h, blk, k] copy for observers that need every key and may keep it
        for observer in observers:
            assert site is not None  # attend() passes observers only for a known site
            if getattr(observer, "accepts_key_prefix", False):
                kept = scores if keep_scores else None
                extras = _observer_extras(observer, weigher, weighted, summary, sink_share, scores=kept)
                observer.observe(site, pattern, start, **extras)
                continue
            if full_width is None:
                full_width = pattern.new_zeros(batch, heads, rows, key_len)
                full_width[..., :width] = pattern
            observer.observe(site, full_width, start)

        if whole_block:
            continue  # the output rows are written
        weights = pattern if value.dtype == torch.float32 else pattern.to(value.dtype)
        if dropout and training:
            weights = nn.functional.dropout(weights, p=dropout, training=True)
        if head_mask is not None:
            weights.mul_(head_mask)  # observers are done with the pattern
        weights = weights.view(batch, kv_heads, n_rep * rows, width)  # [b, kvh, n_rep·blk, c]
        block_output = torch.matmul(weights, value[:, :, :width])  # [b, kvh, n_rep·blk, dv]
        block_output = block_output.view(batch, kv_heads, n_rep, rows, value_dim)  # [b, kvh, n_rep, blk, dv]
        output_groups[:, start:stop] = block_output.permute(0, 3, 1, 2, 4)  # [b, blk, kvh, n_rep, dv]
    return output


def _softmax_with_sinks(scores: Tensor, sinks: Tensor) -> tuple[Tensor, Tensor]:
    """The pattern ``[b, h, blk, c]`` of scaled, masked ``scores`` ``[b, h, blk, c]`` with each head's sink logit
    (``sinks`` ``[h]``) as one more softmax column, and that column's weight ``[b, h, blk]``, in reused buffers.

    The pattern is a view of rows ``c + 1`` floats apart (the sink's weight closes each row): its rows sum to
    ``1 − sink weight``, as transformers' eager attention returns them.
    """
    batch, heads, rows, width = scores.shape
    extended = _workspace.get("sink_scores", (batch, heads, rows, width + 1), torch.float32, scores.device)
    extended[..., :width] = scores
    extended[..., width] = sinks.to(torch.float32).view(1, heads, 1)
    weights = _workspace.get("pattern", (batch, heads, rows, width + 1), torch.float32, scores.device)
    torch.ops.aten._softmax.out(extended, -1, False, out=weights)  # [b, h, blk, c + 1]
    return weights[..., :width], weights[..., width]


def _attend_in_tiles(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    layout: KeyLayout | None,
    scaling: float,
    sinks: Tensor | None,
    observers: Sequence[AttentionObserver],
    site: AttentionSite | None,
    output: Tensor,
) -> Tensor:
    """Every query at once through :func:`attnviz.core.kernel_calls.attend_rows_`, when no observer needs the pattern.

    The observers (all ``accepts_summary_only``) get ``observe(site, None, 0, summary=…, weighted=…)`` for the whole
    call: a :class:`RowSummary` ``[4 + 2·r + G, b, h, q]`` with the widest band asked for and the weights on every
    key position some observer lists in ``summary_columns(site)``; with ``sinks`` (float32 ``[h]``) also
    ``sink_share=`` ``[b, h, q]`` where they accept it.
    """
    batch, heads, query_len, _ = query.shape
    key_len = key.shape[2]
    # observers that keep what a call hands them (to reduce a batch's layers together, on a GPU) get tensors of
    # their own, not the reused workspace: no copy on either side
    owned = any(getattr(observer, "keeps_summary", lambda _: False)(query.device) for observer in observers)
    take = (lambda _, shape, dtype, device: torch.empty(shape, dtype=dtype, device=device)) if owned else _workspace.get
    summarised = [observer for observer in observers if getattr(observer, "accepts_summary", False)]
    summary = None
    if summarised and site is not None:
        reach = max(getattr(observer, "summary_band_reach", 1) for observer in summarised)
        wanted: set[int] = set()
        for observer in summarised:
            wanted.update(getattr(observer, "summary_columns", lambda _site: ())(site))
        columns = tuple(sorted(column for column in wanted if 0 <= column < key_len))
        shape = RowSummary.buffer_shape(batch, heads, query_len, reach, len(columns))  # [4 + 2r + G, b, h, q]
        summary = RowSummary(take("summary", shape, torch.float32, query.device), columns)
    weigher, key_weights = _weigher(observers, site, batch, heads, key_len, query.device)
    weighted = None
    if weigher is not None:
        weighted = take("weighted", (batch, heads, query_len), torch.float32, query.device)
    sink_share = None
    if sinks is not None:
        sink_share = take("sink_share", (batch, heads, query_len), torch.float32, query.device)
    if query.device.type == "cpu":
        # the keys each run of TILE_ROWS queries can weigh (TILE_ROWS read at the call, as attend_rows_ reads it);
        # the GPU's kernel finds them itself (reading a mask's stops back from a GPU would wait for it)
        rows_per_tile = kernel_calls.TILE_ROWS
        if layout is not None:
            starts, stops = layout.key_spans(rows_per_tile, query_len, key_len)
        else:
            stops = key_stops(mask, rows_per_tile, query_len, key_len)
            starts = [0] * len(stops)
        attend_rows_(
            query,
            key,
            value,
            mask,  # [b|1, h|1, q|1, k]: the kernel reads a broadcast dimension with stride 0
            scaling,
            torch.tensor([_rounded_width(stop, key_len) for stop in stops], dtype=torch.int64),
            summary,
            output,
            key_weights,
            weighted,
            sinks,
            sink_share,
            layout,
            # rounded down to the 32 keys of the kernel's key panels (the keys before a start weigh 0 for its rows)
            torch.tensor([start // 32 * 32 for start in starts], dtype=torch.int64),
        )
    else:
        layout = layout.to(query.device) if layout is not None else None  # its key ranges where the kernel reads them
        attend_rows_triton(
            query,
            key,
            value,
            scaling,
            output,
            mask=mask,
            summary=summary,
            key_weights=key_weights,
            weighted=weighted,
            sinks=sinks,
            sink_share=sink_share,
            causal=layout is not None and layout.causal,
            window=layout.window if layout is not None else None,
            key_start=layout.key_start if layout is not None else None,
            key_stop=layout.key_stop if layout is not None else None,
        )
    for observer in observers:
        assert site is not None  # attend() passes observers only for a known site
        extras = _observer_extras(observer, weigher, weighted, summary, sink_share)
        if owned and hasattr(observer, "keeps_summary"):
            extras["owned"] = True
        # accepts_summary_only: the observer takes pattern=None (the protocol's type names the usual case)
        cast(Any, observer).observe(site, None, 0, **extras)
    return output


def _observer_extras(observer, weigher, weighted, summary, sink_share, *, scores=None) -> dict[str, Any]:
    """What ``observer.observe`` takes beside the pattern, by its ``accepts_*`` flags: the scores (when kept), the
    block's summary, the weighted pattern (the weigher only) and each row's sink share."""
    extras: dict[str, Any] = {}
    if scores is not None and getattr(observer, "accepts_scores", False):
        extras["scores"] = scores
    if summary is not None and getattr(observer, "accepts_summary", False):
        extras["summary"] = summary
    if observer is weigher:
        extras["weighted"] = weighted
    if sink_share is not None and getattr(observer, "accepts_sink_share", False):
        extras["sink_share"] = sink_share
    return extras


def _rounded_width(stop: int, key_len: int) -> int:
    """``stop`` keys rounded up to a multiple of WIDTH_MULTIPLE (within ``key_len``).

    Such widths keep the matrix products on their fast paths (an odd width costs up to 40% more in Q·Kᵀ); the
    extra keys are masked for every row that reads them (weight 0).
    """
    return min(key_len, -(-stop // WIDTH_MULTIPLE) * WIDTH_MULTIPLE)


def _weigher(
    observers: Sequence[AttentionObserver],
    site: AttentionSite | None,
    batch: int,
    heads: int,
    key_len: int,
    device: torch.device,
) -> tuple[AttentionObserver | None, Tensor | None]:
    """The observer (at most one) whose per-key weights ``[b, h, ≥k]`` the kernel sums against each row while the
    row is in the cache (the value norms of the carriers), saving it a pass over the pattern; and those weights."""
    if site is None:
        return None, None
    for observer in observers:
        if getattr(observer, "accepts_weighted_sum", False):
            key_weights = getattr(observer, "key_weights")(site)  # noqa: B009 (an optional method)
            if key_weights is not None and _fits(key_weights, batch, heads, key_len, device):
                return observer, key_weights
    return None, None


def _fits(key_weights: Tensor, batch: int, heads: int, key_len: int, query_device: torch.device) -> bool:
    """Whether ``key_weights`` is what :func:`attnviz.core.kernel_calls.attend_block_` reads: float32 ``[b, h, ≥k]``."""
    return (
        key_weights.dtype == torch.float32
        and key_weights.is_contiguous()
        and key_weights.dim() == 3
        and tuple(key_weights.shape[:2]) == (batch, heads)
        and key_weights.shape[2] >= key_len
        and key_weights.device == query_device
    )
