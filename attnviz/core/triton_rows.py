"""The GPU counterpart of the CPU tile kernel: attention with every row's summary in one pass, in Triton.

:func:`attend_rows_triton` computes what :func:`attnviz.core.kernel_calls.attend_rows_` computes on the CPU —
``pattern V`` and each query row's :class:`~attnviz.core.kernel_calls.RowSummary` (max weight, entropy, distance,
the band of weights around the diagonal, the weights on chosen key columns) and the weighted sums of the carriers —
tile by tile of keys, flash-attention style, so that no pattern is ever written. Each program takes one head's
``BLOCK_M`` queries and walks the keys in tiles of ``BLOCK_N`` with a running maximum ``m`` and sum ``l``; the
summary's sums are rescaled with them::

    l = Σ_j e^{s_j − m}            max weight = 1 / l          (the largest weight is e^{m − m} / l)
    T = Σ_j e^{s_j − m}(s_j − m)    entropy    = ln l − T / l   (−Σ_j p_j ln p_j with p_j = e^{s_j − m} / l)
    D = Σ_j e^{s_j − m}|i − j|      distance   = D / l
    W = Σ_j e^{s_j − m} w_j         weighted   = W / l
    band and columns: the raw logits s_j of those keys, turned into weights e^{s_j − m} / l at the end

When ``m`` grows to ``m'`` every sum is multiplied by ``α = e^{m − m'}``, and ``T`` also gains ``(m − m')·l``.

Which keys a query may weigh comes either from an additive mask tensor (transformers' ``[b|1, h|1, q|1, k]``), or
from a description that needs no ``[q, k]`` tensor: causal (key ``j`` visible to query ``i`` when
``j ≤ i + k − q``), a sliding window of ``window`` keys, and per-sequence ``key_start``/``key_stop`` (padding on
the left or right); the two combine. Inputs may be float32, bfloat16 or float16; scores, softmax and every
statistic are float32, the output has the value's dtype.

Triton compiles the kernel for CUDA GPUs; with ``TRITON_INTERPRET=1`` it runs on CPU tensors through NumPy
(slowly), which is how the suite checks it without a GPU.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnviz.core.kernel_calls import RowSummary


@dataclass(frozen=True)
class LaunchConfig:
    """How the kernel is launched: ``block_m`` queries per program, keys in tiles of ``block_n``, and Triton's
    ``num_warps`` and ``num_stages`` (software pipelining of the key/value loads)."""

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2


#: the launch per input dtype and head size (a power of two ≥ 16), where the default is not the fastest; measured
#: on an H100-class GPU by ``benchmarks/bench_stats_gpu.py --tune`` (a tuning run may set entries for its own use)
LAUNCH_CONFIGS: dict[tuple[torch.dtype, int], LaunchConfig] = {}


def launch_config(dtype: torch.dtype, head_dim: int) -> LaunchConfig:
    """The launch for inputs of ``dtype`` and ``head_dim`` (value size included): :data:`LAUNCH_CONFIGS` or the
    default."""
    return LAUNCH_CONFIGS.get((dtype, _power_of_two(head_dim, 16)), LaunchConfig())


@functools.cache
def triton_available() -> bool:
    """Whether Triton imports (it is an optional dependency: ``pip install triton``)."""
    try:
        import triton
        import triton.language  # noqa: F401
    except (ImportError, RuntimeError, OSError):  # not installed, or a Triton that cannot find its compiler
        return False
    return True


def interpreting() -> bool:
    """Whether Triton runs kernels on the CPU through its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_applies(query: Tensor) -> bool:
    """Whether the core runs :func:`attend_rows_triton` for ``query``: on a CUDA device, where Triton is installed
    (on the CPU the core has its own tile kernel; the interpreter is for tests, which call the kernel directly)."""
    return query.device.type == "cuda" and triton_available()


@functools.cache
def _kernel() -> Any:
    """The ``@triton.jit`` kernel, defined on first use so that importing attnviz never imports Triton."""
    import triton
    import triton.language as tl

    @triton.jit
    def attend_rows_kernel(
        Q, K, V, Mask, Out, Summary, Columns, KeyWeights, Weighted, KeyStart, KeyStop, Sinks, SinkShare,
        sqb, sqh, sqm, sqd,
        skb, skh, skn, skd,
        svb, svh, svn, svd,
        smb, smh, smm, smn,
        sob, som, soh, sod,
        ssf, ssb, ssh, ssm,
        swb, swh, swn,
        sxb, sxh, sxm,
        szb, szh, szm,
        heads, n_rep, q_len, k_len, head_dim, value_dim, scaling, window,
        HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, PADDED: tl.constexpr,
        SUMMARY: tl.constexpr, REACH: tl.constexpr, BAND_P2: tl.constexpr,
        COLUMNS: tl.constexpr, COLUMNS_P2: tl.constexpr, WEIGHTS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
        UPCAST: tl.constexpr, SINKS: tl.constexpr, SHARE: tl.constexpr, PRECISION: tl.constexpr,
    ):  # fmt: skip
        block_m = tl.program_id(0)
        batch_head = tl.program_id(1)
        b = batch_head // heads
        h = batch_head % heads
        kvh = h // n_rep
        rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [M] query positions
        dims = tl.arange(0, BLOCK_D)
        vdims = tl.arange(0, BLOCK_DV)
        row_ok = rows < q_len
        q = tl.load(
            Q + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :] * sqd,
            mask=row_ok[:, None] & (dims[None, :] < head_dim),
            other=0.0,
        )  # [M, D]
        if UPCAST:
            q = q.to(tl.float32)
        offset = k_len - q_len  # causal: query i sees keys j <= i + offset (a longer key side holds the past)
        first = block_m * 0  # the key tiles this block of queries can weigh: [first, last)
        last = k_len + first
        if PADDED:
            first = tl.load(KeyStart + b).to(tl.int32)
            last = tl.load(KeyStop + b).to(tl.int32)
        if CAUSAL:
            last = tl.minimum(last, (block_m + 1) * BLOCK_M + offset)
        if WINDOWED:
            first = tl.maximum(first, block_m * BLOCK_M + offset - window + 1)
        first = tl.maximum(first, 0) // BLOCK_N * BLOCK_N
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        key_max = tl.full([BLOCK_M], float("-inf"), tl.float32)  # the largest logit of a key (the sink's may be larger)
        if SINKS:  # the head's sink is each row's first term: the running max at its logit, Σ exp = 1
            sink = tl.load(Sinks + h).to(tl.float32)
            m_i = tl.zeros([BLOCK_M], tl.float32) + sink
            l_i = tl.zeros([BLOCK_M], tl.float32) + 1.0
        t_i = tl.zeros([BLOCK_M], tl.float32)
        d_i = tl.zeros([BLOCK_M], tl.float32)
        w_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        band = tl.full([BLOCK_M, BAND_P2], float("-inf"), tl.float32)  # raw logits of keys i − o, o = −r … r
        band_slots = tl.arange(0, BAND_P2)
        picked = tl.full([BLOCK_M, COLUMNS_P2], float("-inf"), tl.float32)  # raw logits of the chosen keys
        column_slots = tl.arange(0, COLUMNS_P2)
        for start in range(first, last, BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)  # [N] key positions
            key_ok = keys < k_len
            k = tl.load(
                K + b * skb + kvh * skh + keys[None, :] * skn + dims[:, None] * skd,
                mask=key_ok[None, :] & (dims[:, None] < head_dim),
                other=0.0,
            )  # [D, N]
            if UPCAST:
                k = k.to(tl.float32)
            s = tl.dot(q, k, input_precision=PRECISION, out_dtype=tl.float32) * scaling  # [M, N]
            if HAS_MASK:
                s += tl.load(
                    Mask + b * smb + h * smh + rows[:, None] * smm + keys[None, :] * smn,
                    mask=row_ok[:, None] & key_ok[None, :],
                    other=0.0,
                ).to(tl.float32)
            visible = key_ok[None, :] & (keys[None, :] >= 0)
            if PADDED:
                visible &= (keys[None, :] >= tl.load(KeyStart + b)) & (keys[None, :] < tl.load(KeyStop + b))
            if CAUSAL:
                visible &= keys[None, :] <= rows[:, None] + offset
            if WINDOWED:
                visible &= keys[None, :] > rows[:, None] + offset - window
            visible &= s != float("-inf")  # a key the mask hides with -inf (or a lowest value that overflowed)
            s = tl.where(visible, s, float("-inf"))
            key_max = tl.maximum(key_max, tl.max(s, 1))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet
            alpha = tl.where(m_i == float("-inf"), 0.0, tl.exp(m_i - m_safe))
            shift = tl.where(m_i == float("-inf"), 0.0, m_i - m_safe)
            centred = tl.where(visible, s - m_safe[:, None], 0.0)
            p = tl.where(visible, tl.exp(centred), 0.0)  # [M, N]
            t_i = alpha * (t_i + shift * l_i) + tl.sum(p * centred, 1)
            l_i = alpha * l_i + tl.sum(p, 1)
            if SUMMARY:
                gap = tl.abs(rows[:, None] - keys[None, :]).to(tl.float32)
                d_i = alpha * d_i + tl.sum(p * gap, 1)
                # the band's keys i − r … i + r lie in few tiles, each chosen column in one: skip the others
                if (start <= block_m * BLOCK_M + BLOCK_M - 1 + REACH) & (
                    start + BLOCK_N - 1 >= block_m * BLOCK_M - REACH
                ):
                    for slot in tl.static_range(2 * REACH + 1):
                        at = keys[None, :] == rows[:, None] - (slot - REACH)  # key i − o, o = slot − r
                        value_at = tl.sum(tl.where(at & visible, s, 0.0), 1)
                        hit = tl.sum((at & visible).to(tl.int32), 1) > 0
                        band = tl.where((band_slots[None, :] == slot) & hit[:, None], value_at[:, None], band)
                for slot in tl.static_range(COLUMNS):
                    column = tl.load(Columns + slot)
                    if (column >= start) & (column < start + BLOCK_N):
                        at = keys[None, :] == column
                        value_at = tl.sum(tl.where(at & visible, s, 0.0), 1)
                        hit = tl.sum((at & visible).to(tl.int32), 1) > 0
                        picked = tl.where((column_slots[None, :] == slot) & hit[:, None], value_at[:, None], picked)
            if WEIGHTS:
                key_weight = tl.load(KeyWeights + b * swb + h * swh + keys * swn, mask=key_ok, other=0.0)
                w_i = alpha * w_i + tl.sum(p * key_weight[None, :], 1)
            v = tl.load(
                V + b * svb + kvh * svh + keys[:, None] * svn + vdims[None, :] * svd,
                mask=key_ok[:, None] & (vdims[None, :] < value_dim),
                other=0.0,
            )  # [N, DV]
            if UPCAST:
                v = v.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION, out_dtype=tl.float32)
            m_i = m_new
        seen = l_i > 0
        inverse = tl.where(seen, 1.0 / tl.where(seen, l_i, 1.0), 0.0)  # rows that see no key give zeros
        out = acc * inverse[:, None]
        tl.store(
            Out + b * sob + rows[:, None] * som + h * soh + vdims[None, :] * sod,
            out.to(Out.dtype.element_ty),
            mask=row_ok[:, None] & (vdims[None, :] < value_dim),
        )
        m_final = tl.where(m_i == float("-inf"), 0.0, m_i)
        if SUMMARY:
            base = Summary + b * ssb + h * ssh + rows * ssm
            if SINKS:
                tl.store(base, tl.exp(key_max - m_final) * inverse, mask=row_ok)  # max weight of a key
            else:
                tl.store(base, inverse, mask=row_ok)  # max weight
            tl.store(base + ssf, tl.where(seen, tl.log(tl.where(seen, l_i, 1.0)) - t_i * inverse, 0.0), mask=row_ok)
            tl.store(base + 2 * ssf, d_i * inverse, mask=row_ok)
            weights = tl.exp(band - m_final[:, None]) * inverse[:, None]  # [M, BAND_P2]
            for slot in tl.static_range(2 * REACH + 1):
                value = tl.sum(tl.where(band_slots[None, :] == slot, weights, 0.0), 1)
                tl.store(base + (3 + slot) * ssf, value, mask=row_ok)
            weights = tl.exp(picked - m_final[:, None]) * inverse[:, None]  # [M, COLUMNS_P2]
            for slot in tl.static_range(COLUMNS):
                value = tl.sum(tl.where(column_slots[None, :] == slot, weights, 0.0), 1)
                tl.store(base + (4 + 2 * REACH + slot) * ssf, value, mask=row_ok)
        if WEIGHTS:
            tl.store(Weighted + b * sxb + h * sxh + rows * sxm, w_i * inverse, mask=row_ok)
        if SHARE:
            tl.store(SinkShare + b * szb + h * szh + rows * szm, tl.exp(sink - m_final) * inverse, mask=row_ok)

    return attend_rows_kernel


def _power_of_two(value: int, least: int = 1) -> int:
    return max(least, 1 << max(0, value - 1).bit_length())


def attend_rows_triton(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    scaling: float,
    output: Tensor,
    *,
    mask: Tensor | None = None,
    causal: bool = False,
    window: int | None = None,
    key_start: Tensor | None = None,
    key_stop: Tensor | None = None,
    summary: RowSummary | None = None,
    key_weights: Tensor | None = None,
    weighted: Tensor | None = None,
    sinks: Tensor | None = None,
    sink_share: Tensor | None = None,
    launch: LaunchConfig | None = None,
) -> None:
    """Attention of every query, key tile by key tile, with the rows' summary; nothing of ``[q, k]`` is written.

    ``query`` ``[b, h, q, d]``, ``key`` ``[b, kvh, k, d]``, ``value`` ``[b, kvh, k, dv]`` (``h`` a multiple of
    ``kvh``: grouped-query heads read their key/value head without a copy); ``output`` ``[b, q, h, dv]`` receives
    ``pattern V`` in its dtype. Which keys each query weighs: ``mask`` (additive ``[b|1, h|1, q|1, k]``), ``causal``,
    ``window`` (the last ``window`` keys up to the diagonal), ``key_start``/``key_stop`` (int ``[b]``: each
    sequence's keys ``[start, stop)``, its padding outside). ``summary`` receives the rows'
    :class:`~attnviz.core.kernel_calls.RowSummary` (float32 ``[4 + 2r + G, b, h, q]``), ``weighted`` (float32
    ``[b, h, q]``) each row's ``Σ_j pattern_ij · key_weights_j`` (``key_weights`` ``[b, h, ≥k]``).
    ``sinks`` (``[h]`` logits, or None): each head's attention sink, one more softmax term without a value (its
    running max and sum start from it; the summary's entropy counts it); ``sink_share`` (float32 ``[b, h, q]``)
    then receives each row's weight on it. A row that may weigh no key gets zeros (with a sink: all on the sink).
    ``launch``: tile sizes and warps (default: :func:`launch_config` of the inputs).
    """
    import triton

    batch, heads, query_len, head_dim = query.shape
    kv_heads, key_len, value_dim = key.shape[1], key.shape[2], value.shape[-1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads")
    if (key_start is None) != (key_stop is None):
        raise ValueError("give key_start and key_stop together")
    if mask is not None:
        mask = mask.expand(batch, heads, query_len, mask.shape[-1])[..., :key_len]  # stride 0 where broadcast
    reach = 0 if summary is None else summary.band_reach
    columns = () if summary is None else summary.columns
    dummy = query.new_empty(1, dtype=torch.float32)
    column_tensor = torch.tensor(columns or (0,), dtype=torch.int64, device=query.device)
    strides_of = lambda tensor, count: tensor.stride() if tensor is not None else (0,) * count
    summary_values = summary.values if summary is not None else None
    launch = launch or launch_config(query.dtype, max(head_dim, value_dim))
    grid = (triton.cdiv(query_len, launch.block_m), batch * heads)
    _kernel()[grid](
        query, key, value,
        mask if mask is not None else dummy,
        output,
        summary_values if summary_values is not None else dummy,
        column_tensor,
        key_weights if key_weights is not None else dummy,
        weighted if weighted is not None else dummy,
        key_start if key_start is not None else column_tensor,
        key_stop if key_stop is not None else column_tensor,
        sinks if sinks is not None else dummy,
        sink_share if sink_share is not None else dummy,
        *query.stride(), *key.stride(), *value.stride(), *strides_of(mask, 4), *output.stride(),
        *strides_of(summary_values, 4), *strides_of(key_weights, 3), *strides_of(weighted, 3),
        *strides_of(sink_share, 3),
        heads, heads // kv_heads, query_len, key_len, head_dim, value_dim, float(scaling), int(window or 0),
        HAS_MASK=mask is not None, CAUSAL=causal, WINDOWED=bool(window), PADDED=key_start is not None,
        SUMMARY=summary is not None, REACH=reach, BAND_P2=_power_of_two(2 * reach + 1),
        COLUMNS=len(columns), COLUMNS_P2=_power_of_two(len(columns)), WEIGHTS=key_weights is not None,
        BLOCK_M=launch.block_m, BLOCK_N=launch.block_n,
        BLOCK_D=_power_of_two(head_dim, 16), BLOCK_DV=_power_of_two(value_dim, 16),
        # Triton's interpreter multiplies half-precision tiles wrongly (it reads their bits as integers)
        UPCAST=interpreting() and query.dtype != torch.float32,
        SINKS=sinks is not None, SHARE=sinks is not None and sink_share is not None,
        # float32 products in full precision (a GPU would otherwise round their inputs to TF32's 10-bit mantissa)
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )  # fmt: skip
