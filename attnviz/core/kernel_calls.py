"""Calls into the loaded fused kernel (:mod:`attnviz.core.kernel` builds and loads it): what each takes and gives.

Every function here runs only while the kernel is loaded (``kernel._module``) and says so, or is guarded by
:func:`kernel_applies` / :func:`block_kernel_applies`; none builds or loads anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnviz.core import kernel
from attnviz.core.key_range import KeyLayout


def _loaded():
    """The loaded extension, or None (read at each call: :func:`kernel.kernel_suspended` swaps it out)."""
    return kernel._module


@dataclass(frozen=True)
class RowSummary:
    """Per-query reductions of one block's pattern, computed by the kernel alongside it.

    ``values`` is float32 ``[4 + 2·r + G, b, h, blk]``, the buffer :func:`fused_softmax_` or
    :func:`attend_rows_` wrote: ``max_weight`` (``max_j Aᵢⱼ``), ``entropy`` (``−Σⱼ Aᵢⱼ ln Aᵢⱼ``,
    nats), ``distance`` (``Σⱼ Aᵢⱼ |i − j|``, ``i`` and ``j`` the query's and the key's position in
    the input), then the ``band`` of weights on the keys nearest each query: ``band[r + o] = A[i, i − o]``
    for ``o = −r … r`` (0 where key ``i − o`` is outside the block's columns); ``band[r]`` is the
    diagonal, ``band[r + 1]`` the previous key; then the weights on the keys ``columns`` (``G`` of
    them, only from :func:`attend_rows_`). Each field is a view ``[b, h, blk]`` (the band
    ``[2·r + 1, b, h, blk]``).
    """

    values: Tensor
    columns: tuple[int, ...] = ()  # key positions whose weights follow the band

    @property
    def max_weight(self) -> Tensor:
        return self.values[0]

    @property
    def entropy(self) -> Tensor:
        return self.values[1]

    @property
    def distance(self) -> Tensor:
        return self.values[2]

    @property
    def band(self) -> Tensor:
        return self.values[3 : 4 + 2 * self.band_reach]

    @property
    def band_reach(self) -> int:
        """``r``: the band holds the keys ``i − r … i + r``."""
        return (self.values.shape[0] - 4 - len(self.columns)) // 2

    @property
    def fields(self) -> Tensor:
        """``[4 + 2·r, b, h, blk]``: the summary without its columns (what :func:`fused_softmax_` writes)."""
        return self.values[: 4 + 2 * self.band_reach]

    def column(self, key: int) -> Tensor | None:
        """``[b, h, blk]``: each row's weight on key position ``key``, or None if the summary does not hold it."""
        if key not in self.columns:
            return None
        return self.values[4 + 2 * self.band_reach + self.columns.index(key)]

    @staticmethod
    def buffer_shape(batch: int, heads: int, rows: int, band_reach: int, columns: int = 0) -> tuple[int, int, int, int]:
        """Shape of the float32 buffer :func:`fused_softmax_` (no columns) or :func:`attend_rows_` writes into."""
        return (4 + 2 * band_reach + columns, batch, heads, rows)


def fused_softmax_(
    scores: Tensor,
    mask: Tensor | None,
    scaling: float,
    query_start: int,
    summary: Tensor | None,
    sinks: Tensor | None = None,
    sink_share: Tensor | None = None,
) -> bool:
    """Replace raw ``Q Kᵀ`` scores ``[b, h, blk, c]`` (float32, contiguous, CPU) by their pattern, in place.

    ``mask``: additive float32 ``[b|1, 1|h, blk|1, ≥c]`` or None. ``summary``: a float32 buffer of
    :meth:`RowSummary.buffer_shape` to receive the :class:`RowSummary` of every row, or None.
    ``sinks``: float32 ``[h]`` per-head sink logits (:func:`sink_logits`), or None; each row's softmax then
    includes its head's sink, whose weight goes to no key (rows sum to 1 − that weight; the summary's entropy is
    over keys and sink), and ``sink_share`` (float32 ``[b, h, blk]``, or None) receives that weight.
    Returns False (and does nothing) when the kernel is not loaded or the inputs are outside what it handles.
    """
    if _loaded() is None:
        return False
    if scores.dtype != torch.float32 or scores.device.type != "cpu" or not scores.is_contiguous():
        return False
    if mask is not None and (mask.dtype != torch.float32 or mask.device.type != "cpu" or mask.stride(-1) != 1):
        return False
    if summary is None:
        _loaded().softmax_rows_(
            scores, mask, float(scaling), int(query_start), scores.new_empty(0), 0, sinks, sink_share
        )
        return True
    band_reach = (summary.shape[0] - 4) // 2
    batch, heads, rows = scores.shape[:3]
    if summary.shape != RowSummary.buffer_shape(batch, heads, rows, band_reach):
        raise ValueError(f"summary buffer of shape {tuple(summary.shape)} does not fit scores {tuple(scores.shape)}")
    _loaded().softmax_rows_(scores, mask, float(scaling), int(query_start), summary, band_reach, sinks, sink_share)
    return True


def sink_logits(sinks: Tensor | None) -> Tensor | None:
    """Per-head sink logits ``[h]`` (transformers' ``s_aux``) as the kernel reads them: float32, contiguous, detached."""
    return None if sinks is None else sinks.detach().to(torch.float32).contiguous()


#: query rows of one head per task of :func:`attend_block_`: enough that repacking a task's keys for its two
#: matrix products costs little next to them (measured at 2,048–8,192 keys: 64 beats 16 and 32, ties 128)
ROWS_PER_TASK = 64


def attend_block_(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    scores: Tensor,
    mask: Tensor | None,
    scaling: float,
    query_start: int,
    summary: Tensor | None,
    output: Tensor,
    key_weights: Tensor | None = None,
    weighted: Tensor | None = None,
    sinks: Tensor | None = None,
    sink_share: Tensor | None = None,
) -> None:
    """One block of queries through attention in one parallel region: :func:`fused_softmax_` of ``Q Kᵀ`` and ``pattern V``.

    ``query`` ``[b, h, q, d]`` (last dim stride 1), ``key`` ``[b, kvh, k, d]`` and ``value`` ``[b, kvh, k, dv]``
    contiguous, all float32 on the CPU; ``scores`` ``[b, h, blk, c]`` receives the pattern of queries
    ``query_start …`` over keys ``< c``; ``output`` ``[b, q, h, dv]`` their ``pattern V``. Call only where
    :func:`block_kernel_applies` holds. With ``key_weights`` (float32 ``[b, h, ≥c]`` contiguous), ``weighted``
    (float32 ``[b, h, blk]``) receives each row's ``Σ_j pattern_ij · key_weights_j``, summed while the row is in
    the cache. ``sinks``, ``sink_share`` (``[b, h, blk]``): as :func:`fused_softmax_`.
    """
    assert _loaded() is not None  # block_kernel_applies said so
    reach = 0 if summary is None else (summary.shape[0] - 4) // 2
    empty = scores.new_empty(0)
    _loaded().attend_block_(
        query,
        key,
        value,
        scores,
        mask,
        float(scaling),
        int(query_start),
        empty if summary is None else summary,
        reach,
        output,
        ROWS_PER_TASK,
        empty if key_weights is None else key_weights,
        empty if weighted is None else weighted,
        sinks,
        sink_share,
    )


#: query rows of one head per task of :func:`attend_rows_`, and keys per tile: a tile of TILE_ROWS × KEY_TILE scores
#: (256 KB) stays in the L2 cache. Measured at 2,048 and 8,192 keys, 1 and 2 threads, against 64 × 512, 128 × 256,
#: 96 × 256 and 32 × 512: 128 × 512 was fastest in each case.
TILE_ROWS = 128
KEY_TILE = 512


def attend_rows_(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    scaling: float,
    stops: Tensor,
    summary: RowSummary | None,
    output: Tensor,
    key_weights: Tensor | None = None,
    weighted: Tensor | None = None,
    sinks: Tensor | None = None,
    sink_share: Tensor | None = None,
    layout: KeyLayout | None = None,
    starts: Tensor | None = None,
) -> None:
    """Attention of every query of a call, tile by tile of keys, without writing the pattern (flash attention).

    ``query`` ``[b, h, q, d]`` (last dim stride 1), ``key`` ``[b, kvh, k, d]`` and ``value`` ``[b, kvh, k, dv]``
    contiguous, all float32 on the CPU, ``mask`` additive ``[b|1, h|1, q|1, ≥k]`` or None; ``stops`` (and
    ``starts``, zeros if None) int64 ``[⌈q / TILE_ROWS⌉]``: the keys ``[start, stop)`` each run of TILE_ROWS queries
    can weigh (the others must be masked for them; starts a multiple of 32). ``output`` ``[b, q, h, dv]``
    receives ``pattern V``; ``summary`` (a buffer of :meth:`RowSummary.buffer_shape` with its ``columns``) the
    rows' summary; ``weighted`` ``[b, h, q]`` the rows' ``Σ_j pattern_ij · key_weights_j`` (``key_weights``
    ``[b, h, ≥k]``). ``sinks``, ``sink_share`` (``[b, h, q]``): as :func:`fused_softmax_`; each row's running max
    and sum start from its sink. ``layout`` (instead of ``mask``): the causal mask said in words, applied by
    position (a row that may weigh no key weighs every key alike; with a sink, only the sink).
    Call only where :func:`block_kernel_applies` holds.
    """
    assert _loaded() is not None  # block_kernel_applies said so
    empty = query.new_empty(0)
    columns = torch.tensor(summary.columns if summary is not None else (), dtype=torch.int64)
    _loaded().attend_rows_(
        query,
        key,
        value,
        mask,
        float(scaling),
        0,
        torch.zeros_like(stops) if starts is None else starts,
        stops,
        empty if summary is None else summary.values,
        0 if summary is None else summary.band_reach,
        columns,
        output,
        TILE_ROWS,
        KEY_TILE,
        empty if key_weights is None else key_weights,
        empty if weighted is None else weighted,
        sinks,
        sink_share,
        layout is not None and layout.causal,
        0 if layout is None or layout.window is None else layout.window,
        _key_ranges(layout),
    )


def _key_ranges(layout: KeyLayout | None) -> Tensor | None:
    """int64 ``[b, 2]``: each sequence's keys ``[start, stop)`` as the CPU kernel reads them, or None (no padding)."""
    if layout is None or layout.key_start is None or layout.key_stop is None:
        return None
    return torch.stack((layout.key_start, layout.key_stop), 1).to(torch.int64).contiguous()


def block_kernel_applies(query: Tensor, value: Tensor, mask: Tensor | None) -> bool:
    """Whether :func:`attend_block_` computes this call: the kernel applies and every tensor is float32."""
    return (
        kernel_applies(query.dtype, query.device, mask)
        and value.dtype == torch.float32
        and query.stride(-1) == 1
        and _block_available()
    )


def _block_available() -> bool:
    """Whether the loaded kernel has :func:`attend_block_` and :func:`attend_rows_` and found torch's BLAS (cached)."""
    global _block
    if _block is None or _block[0] is not _loaded():
        found = hasattr(_loaded(), "attend_rows_") and bool(
            getattr(_loaded(), "block_kernel_available", lambda: False)()
        )
        _block = (_loaded(), found)
    return _block[1]


_block: tuple[object, bool] | None = None  # (kernel module, whether attend_block_ runs with it)


def kernel_applies(scores_dtype: torch.dtype, device: torch.device, mask: Tensor | None) -> bool:
    """Whether :func:`fused_softmax_` would run for these inputs (decided before computing anything)."""
    if _loaded() is None or scores_dtype != torch.float32 or device.type != "cpu":
        return False
    return mask is None or (mask.dtype == torch.float32 and mask.device.type == "cpu" and mask.stride(-1) == 1)
