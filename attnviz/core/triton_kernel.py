"""The Triton source of the GPU tile kernel; :mod:`attnviz.core.triton_rows` launches it and says what it computes.

Each program takes one head's ``BLOCK_M`` queries and walks the keys in tiles of ``BLOCK_N``, in three runs: the
tiles before and after the interior are *checked* (an additive mask, padding, causality, a window: which keys each
query may weigh is worked out per element), the interior tiles, whose every key every query of the block may weigh,
are not. In the interior the mean distance also comes cheaper: there every key ``j`` is at most the query ``i``, so
``Σ p_j |i − j| = (i − s) Σ p_j − Σ p_j (j − s)`` for the tile's first key ``s``. The interior stops before the
band's first key (``i − r`` of the block's first query), so its loop holds no code for the band: in registers and
instructions per tile it stays close to plain attention (``benchmarks/bench_kernel_compiled.py`` counts them for a
GPU without one).

Logits are kept in base 2 (multiplied by ``log2 e``, so ``exp2`` stands for ``exp``): the running maximum ``m``, the
band's and the columns' logits and the sink. The entropy's sum ``T = Σ p_j (s_j − m)`` is then in bits, and turned
into nats at the end (``ln l − ln 2 · T / l``).

This module imports Triton: :mod:`attnviz.core.triton_rows` imports it on first use only, so that importing attnviz
never imports Triton.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def key_tile(
    acc, m_i, l_i, t_i, d_i, w_i, band, picked, key_max,
    q, K, V, Mask, KeyWeights, Columns, KeyStart, KeyStop,
    b, h, kvh, rows, blind, block_start, start, dims, vdims, band_slots, column_slots,
    skb, skh, skn, skd, svb, svh, svn, svd, smb, smh, smm, smn, swb, swh, swn,
    q_len, k_len, head_dim, value_dim, qk_scale, offset, window,
    CHECKED: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
    PADDED: tl.constexpr, SUMMARY: tl.constexpr, REACH: tl.constexpr, COLUMNS: tl.constexpr,
    WEIGHTS: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, EVEN_D: tl.constexpr, SINKS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One tile of ``BLOCK_N`` keys from ``start``: the running sums updated (see the module docstring)."""
    keys = start + tl.arange(0, BLOCK_N)  # [N] key positions
    key_ok = keys < k_len
    k_ptrs = K + b * skb + kvh * skh + keys[None, :] * skn + dims[:, None] * skd  # [D, N]
    if CHECKED:
        k = tl.load(k_ptrs, mask=key_ok[None, :] & (dims[:, None] < head_dim), other=0.0)
    elif EVEN_D:  # an interior tile lies wholly inside the keys, and the head fills the block: no mask at all
        k = tl.load(k_ptrs)
    else:
        k = tl.load(k_ptrs, mask=dims[:, None] < head_dim, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
    raw = tl.dot(q, k, input_precision=PRECISION, out_dtype=tl.float32)  # [M, N], unscaled
    if CHECKED:
        s = raw * qk_scale  # base-2 logits
        if HAS_MASK:
            additive = tl.load(
                Mask + b * smb + h * smh + rows[:, None] * smm + keys[None, :] * smn,
                mask=(rows[:, None] < q_len) & key_ok[None, :],
                other=0.0,
            ).to(tl.float32)
            # in base 2, the lowest float32 (transformers' "hidden") would overflow to -inf, and a row that hides
            # every key would then weigh none instead of all alike (as softmax does): keep it finite
            s += tl.where(additive == float("-inf"), float("-inf"), tl.maximum(additive, -2.0e38)) * 1.4426950408889634
        visible = key_ok[None, :] & (keys[None, :] >= 0)
        if PADDED:
            visible &= (keys[None, :] >= tl.load(KeyStart + b)) & (keys[None, :] < tl.load(KeyStop + b))
        if CAUSAL:
            visible &= keys[None, :] <= rows[:, None] + offset
        if WINDOWED:
            visible &= keys[None, :] > rows[:, None] + offset - window
        if WINDOWED and not CAUSAL:  # a window on both sides
            visible &= keys[None, :] < rows[:, None] + offset + window
        if PADDED and not SINKS:  # a row that may weigh no key weighs every key alike (equal logits)
            s = tl.where(blind[:, None], 0.0, s)
            visible = tl.where(blind[:, None], key_ok[None, :], visible)
        visible &= s != float("-inf")  # a key the mask hides with -inf (or a lowest value that overflowed)
        s = tl.where(visible, s, float("-inf"))  # a hidden key's logit is -inf: its band or column weight is 0
        logit_scale = 1.0
    else:
        # the band and the columns read raw logits here and scale the ones they pick: a scaled copy of the tile
        # would hold [M, N] more registers
        s = raw
        logit_scale = qk_scale
    if SUMMARY:
        # the band and the chosen columns first, while the tile's weights do not yet take registers; the band's keys
        # i − r … i + r lie in few tiles, each chosen column in one: the others skip this
        if CHECKED and (start <= block_start + BLOCK_M - 1 + REACH) & (start + BLOCK_N - 1 >= block_start - REACH):
            for slot in tl.static_range(2 * REACH + 1):
                at = rows - (slot - REACH)  # [M] the key i − o of each query, o = slot − r
                value_at = tl.sum(tl.where(keys[None, :] == at[:, None], s, 0.0), 1) * logit_scale
                hit = (at >= start) & (at < start + BLOCK_N)
                band = tl.where((band_slots[None, :] == slot) & hit[:, None], value_at[:, None], band)
        for slot in tl.static_range(COLUMNS):
            column = tl.load(Columns + slot)
            if (column >= start) & (column < start + BLOCK_N):
                value_at = tl.sum(tl.where(keys[None, :] == column, s, 0.0), 1) * logit_scale  # [M]
                picked = tl.where(column_slots[None, :] == slot, value_at[:, None], picked)
    if CHECKED:
        tile_max = tl.max(s, 1)
        m_new = tl.maximum(m_i, tile_max)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet
        centred = tl.where(visible, s - m_safe[:, None], 0.0)
        p = tl.where(visible, tl.exp2(centred), 0.0)  # [M, N]
    else:
        # the scale is positive, so the largest scaled logit is the largest raw one scaled, and scaling and centring
        # fuse into one multiply-add per element
        tile_max = tl.max(raw, 1) * qk_scale
        m_new = tl.maximum(m_i, tile_max)
        m_safe = m_new
        centred = raw * qk_scale - m_new[:, None]
        p = tl.exp2(centred)  # [M, N]
    if SINKS:
        key_max = tl.maximum(key_max, tile_max)
    alpha = tl.where(m_i == float("-inf"), 0.0, tl.exp2(m_i - m_safe))
    tile_sum = tl.sum(p, 1)
    if SUMMARY:
        shift = tl.where(m_i == float("-inf"), 0.0, m_i - m_safe)
        t_i = alpha * (t_i + shift * l_i) + tl.sum(p * centred, 1)
    l_i = alpha * l_i + tile_sum
    if SUMMARY:
        if CHECKED:
            gap = tl.abs(rows[:, None] - keys[None, :]).to(tl.float32)
            d_i = alpha * d_i + tl.sum(p * gap, 1)
        else:
            # every key j ≤ query i: Σ p_j (i − j) = (i − start) Σ p_j − Σ p_j (j − start), where j − start is the
            # key's lane, the same in every tile (no conversion per key), and the terms are smaller than i and j
            lanes = tl.arange(0, BLOCK_N).to(tl.float32)  # [N]
            d_i = alpha * d_i + (rows - start).to(tl.float32) * tile_sum - tl.sum(p * lanes[None, :], 1)
    if WEIGHTS:
        if CHECKED:
            key_weight = tl.load(KeyWeights + b * swb + h * swh + keys * swn, mask=key_ok, other=0.0)
        else:
            key_weight = tl.load(KeyWeights + b * swb + h * swh + keys * swn)
        w_i = alpha * w_i + tl.sum(p * key_weight[None, :], 1)
    v_ptrs = V + b * svb + kvh * svh + keys[:, None] * svn + vdims[None, :] * svd  # [N, DV]
    if CHECKED:
        v = tl.load(v_ptrs, mask=key_ok[:, None] & (vdims[None, :] < value_dim), other=0.0)
    elif EVEN_D:
        v = tl.load(v_ptrs)
    else:
        v = tl.load(v_ptrs, mask=vdims[None, :] < value_dim, other=0.0)
    if UPCAST:
        v = v.to(tl.float32)
    # the running output is rescaled and handed to the product as its accumulator (added to in place)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION, out_dtype=tl.float32)
    return acc, m_new, l_i, t_i, d_i, w_i, band, picked, key_max


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
    UPCAST: tl.constexpr, SINKS: tl.constexpr, SHARE: tl.constexpr, PRECISION: tl.constexpr, EVEN_D: tl.constexpr,
):  # fmt: skip
    # the longest causal blocks (the last queries) first, so that short ones fill the GPU's tail
    block_m = tl.num_programs(0) - 1 - tl.program_id(0)
    batch_head = tl.program_id(1)
    b = batch_head // heads
    h = batch_head % heads
    kvh = h // n_rep
    block_start = block_m * BLOCK_M
    rows = block_start + tl.arange(0, BLOCK_M)  # [M] query positions
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
    qk_scale = scaling * 1.4426950408889634  # base-2 logits
    offset = k_len - q_len  # causal: query i sees keys j <= i + offset (a longer key side holds the past)
    # the keys this block may weigh, [first, last), and those every one of its queries may weigh, the interior
    first = block_m * 0
    last = k_len + first
    inner_first = first
    inner_last = k_len // BLOCK_N * BLOCK_N + first
    if PADDED:
        first = tl.load(KeyStart + b).to(tl.int32)
        last = tl.load(KeyStop + b).to(tl.int32)
        inner_first = first
        inner_last = last // BLOCK_N * BLOCK_N
    if CAUSAL:
        last = tl.minimum(last, block_start + BLOCK_M + offset)
    if CAUSAL or SUMMARY:  # interior keys j ≤ every query i (and ≤ i + offset): the cheap distance holds
        inner_last = tl.minimum(inner_last, tl.minimum(block_start, block_start + offset + 1) // BLOCK_N * BLOCK_N)
    if SUMMARY:  # the band's keys i − r … i + r lie after the interior: its tiles are not where nearly all time goes
        inner_last = tl.minimum(inner_last, tl.maximum(block_start - REACH, 0) // BLOCK_N * BLOCK_N)
    if WINDOWED:
        first = tl.maximum(first, block_start + offset - window + 1)
        inner_first = tl.maximum(inner_first, block_start + BLOCK_M + offset - window)
    if WINDOWED and not CAUSAL:  # and keys before i + window
        last = tl.minimum(last, block_start + BLOCK_M - 1 + offset + window)
        inner_last = tl.minimum(inner_last, (block_start + offset + window) // BLOCK_N * BLOCK_N)
    first = tl.maximum(first, 0) // BLOCK_N * BLOCK_N
    inner_first = (tl.maximum(inner_first, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    if HAS_MASK:  # an additive mask may hide any key
        inner_first = last
    inner_first = tl.minimum(tl.maximum(inner_first, first), last)
    inner_last = tl.maximum(tl.minimum(inner_last, last), inner_first)
    # rows that may weigh no key (left padding under causality): softmax of a row of equal (lowest) logits weighs
    # every key alike, so such a block reads every key, all checked. With a sink the sink takes all the weight.
    blind = rows < 0  # [M]
    if PADDED and not SINKS:
        row_first = tl.zeros([BLOCK_M], tl.int32) + tl.load(KeyStart + b).to(tl.int32)
        row_last = tl.zeros([BLOCK_M], tl.int32) + tl.load(KeyStop + b).to(tl.int32)
        if CAUSAL:
            row_last = tl.minimum(row_last, rows + offset + 1)
        if WINDOWED:
            row_first = tl.maximum(row_first, rows + offset - window + 1)
        if WINDOWED and not CAUSAL:
            row_last = tl.minimum(row_last, rows + offset + window)
        blind = (row_first >= row_last) & row_ok
        if tl.max(blind.to(tl.int32), 0) > 0:
            first = first * 0
            last = first + k_len
            inner_first = last
            inner_last = last
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    key_max = tl.full([BLOCK_M], float("-inf"), tl.float32)  # the largest logit of a key (the sink's may be larger)
    if SINKS:  # the head's sink is each row's first term: the running max at its logit, Σ exp = 1
        sink = tl.load(Sinks + h).to(tl.float32) * 1.4426950408889634
        m_i = tl.zeros([BLOCK_M], tl.float32) + sink
        l_i = tl.zeros([BLOCK_M], tl.float32) + 1.0
    t_i = tl.zeros([BLOCK_M], tl.float32)
    d_i = tl.zeros([BLOCK_M], tl.float32)
    w_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    band = tl.full([BLOCK_M, BAND_P2], float("-inf"), tl.float32)  # logits of keys i − o, o = −r … r
    band_slots = tl.arange(0, BAND_P2)
    picked = tl.full([BLOCK_M, COLUMNS_P2], float("-inf"), tl.float32)  # logits of the chosen keys
    column_slots = tl.arange(0, COLUMNS_P2)
    for start in range(first, inner_first, BLOCK_N):
        acc, m_i, l_i, t_i, d_i, w_i, band, picked, key_max = key_tile(
            acc, m_i, l_i, t_i, d_i, w_i, band, picked, key_max,
            q, K, V, Mask, KeyWeights, Columns, KeyStart, KeyStop,
            b, h, kvh, rows, blind, block_start, start, dims, vdims, band_slots, column_slots,
            skb, skh, skn, skd, svb, svh, svn, svd, smb, smh, smm, smn, swb, swh, swn,
            q_len, k_len, head_dim, value_dim, qk_scale, offset, window,
            True, HAS_MASK, CAUSAL, WINDOWED, PADDED, SUMMARY, REACH, COLUMNS, WEIGHTS, UPCAST, PRECISION,
            EVEN_D, SINKS,
            BLOCK_M, BLOCK_N,
        )  # fmt: skip
    for start in range(inner_first, inner_last, BLOCK_N):
        acc, m_i, l_i, t_i, d_i, w_i, band, picked, key_max = key_tile(
            acc, m_i, l_i, t_i, d_i, w_i, band, picked, key_max,
            q, K, V, Mask, KeyWeights, Columns, KeyStart, KeyStop,
            b, h, kvh, rows, blind, block_start, start, dims, vdims, band_slots, column_slots,
            skb, skh, skn, skd, svb, svh, svn, svd, smb, smh, smm, smn, swb, swh, swn,
            q_len, k_len, head_dim, value_dim, qk_scale, offset, window,
            False, HAS_MASK, CAUSAL, WINDOWED, PADDED, SUMMARY, REACH, COLUMNS, WEIGHTS, UPCAST, PRECISION,
            EVEN_D, SINKS,
            BLOCK_M, BLOCK_N,
        )  # fmt: skip
    for start in range(inner_last, last, BLOCK_N):
        acc, m_i, l_i, t_i, d_i, w_i, band, picked, key_max = key_tile(
            acc, m_i, l_i, t_i, d_i, w_i, band, picked, key_max,
            q, K, V, Mask, KeyWeights, Columns, KeyStart, KeyStop,
            b, h, kvh, rows, blind, block_start, start, dims, vdims, band_slots, column_slots,
            skb, skh, skn, skd, svb, svh, svn, svd, smb, smh, smm, smn, swb, swh, swn,
            q_len, k_len, head_dim, value_dim, qk_scale, offset, window,
            True, HAS_MASK, CAUSAL, WINDOWED, PADDED, SUMMARY, REACH, COLUMNS, WEIGHTS, UPCAST, PRECISION,
            EVEN_D, SINKS,
            BLOCK_M, BLOCK_N,
        )  # fmt: skip
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
            tl.store(base, tl.exp2(key_max - m_final) * inverse, mask=row_ok)  # max weight of a key
        else:
            tl.store(base, inverse, mask=row_ok)  # max weight
        entropy = tl.log(tl.where(seen, l_i, 1.0)) - 0.6931471805599453 * t_i * inverse
        tl.store(base + ssf, tl.where(seen, entropy, 0.0), mask=row_ok)
        tl.store(base + 2 * ssf, d_i * inverse, mask=row_ok)
        weights = tl.exp2(band - m_final[:, None]) * inverse[:, None]  # [M, BAND_P2]
        for slot in tl.static_range(2 * REACH + 1):
            value = tl.sum(tl.where(band_slots[None, :] == slot, weights, 0.0), 1)
            tl.store(base + (3 + slot) * ssf, value, mask=row_ok)
        weights = tl.exp2(picked - m_final[:, None]) * inverse[:, None]  # [M, COLUMNS_P2]
        for slot in tl.static_range(COLUMNS):
            value = tl.sum(tl.where(column_slots[None, :] == slot, weights, 0.0), 1)
            tl.store(base + (4 + 2 * REACH + slot) * ssf, value, mask=row_ok)
    if WEIGHTS:
        tl.store(Weighted + b * sxb + h * sxh + rows * sxm, w_i * inverse, mask=row_ok)
    if SHARE:
        tl.store(SinkShare + b * szb + h * szh + rows * szm, tl.exp2(sink - m_final) * inverse, mask=row_ok)
