"""Attention variants of the literature, each a :data:`~attnviz.core.attention.PatternFunction`.

Every toy model computes attention through :func:`attnviz.core.attend`; a
variant only changes how a block of queries turns into a pattern (the weights
over the keys), so capture, statistics, head masks and pruning work the same
for all of them. Shapes: ``query`` ``[b, h, blk, d]`` (rows ``query_start …``),
``key`` ``[b, h, k, d]``, additive ``mask`` ``[b|1, 1|h, blk, k]`` (0 visible,
very negative hidden: causal future, padding keys), pattern float32
``[b, h, blk, k]`` with rows summing to 1 over visible keys.

Scores (``i`` a query position, ``j`` a key position)::

    scaled-dot  (Vaswani et al., 2017)   qᵢ·kⱼ / √d
    dot         (Luong et al., 2015)     qᵢ·kⱼ
    general     (Luong et al., 2015)     qᵢᵀ W kⱼ             W: [h, d, d] learned
    additive    (Bahdanau et al., 2015)  vᵀ tanh(W qᵢ + U kⱼ)  W, U: [h, a, d], v: [h, a] learned
    relative    (Shaw et al., 2018)      qᵢ·(kⱼ + r[clip(j − i, ±K)]) / √d   r: [2K+1, d] learned

and pattern = softmax over the visible keys. Sparsity variants are scaled-dot
with fewer visible keys (a mask, so hidden keys get exactly zero weight):

    local       |i − j| ≤ w
    strided     |i − j| ≤ w  or  (i − j) mod s = 0                 (Sparse Transformer, Child et al., 2019)
    longformer  |i − j| ≤ w  or  i < g  or  j < g                   (sliding window + global tokens)
    bigbird     longformer  or  block(j) ∈ random_blocks(block(i))  (random blocks drawn once from a seed)

Linear attention replaces ``exp(qᵢ·kⱼ)`` by a kernel ``φ(qᵢ)·φ(kⱼ)``:

    linear      φ(x) = elu(x) + 1                                   (Katharopoulos et al., 2020)
    performer   φ(x) = exp(ωx − ‖x‖²/2) / √m, x = q/d^¼ or k/d^¼    (positive random features, Choromanski et al., 2021)

Its pattern is the normalised ``φ(qᵢ)·φ(kⱼ) / Σⱼ φ(qᵢ)·φ(kⱼ)`` over the visible
keys: ``pattern @ V`` equals the linear-time ``φ(Q)(φ(K)ᵀV)`` form exactly, but
the n×n pattern exists, so it can be captured and measured like the others.

Relative positions and sparsity patterns need queries and keys from the same
sequence, so they apply to self-attention only; cross-attention of those
variants is scaled-dot over all source keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnviz.core.attention import PatternFunction
from attnviz.toy.config import ToyConfig

#: additive-mask values below this hide a key (masks use ``finfo(dtype).min``; classic BERT used −10000)
HIDDEN_BELOW = -5000.0
#: value written into hidden scores before the softmax (finite, so a fully hidden row gives no NaN)
_HIDE = torch.finfo(torch.float32).min

#: one line per variant, for help texts and READMEs
VARIANTS: dict[str, str] = {
    "scaled-dot": "qᵢ·kⱼ/√d (Vaswani et al.)",
    "dot": "qᵢ·kⱼ, unscaled (Luong et al.)",
    "general": "qᵢᵀWkⱼ with a learned W per head (Luong et al.)",
    "additive": "vᵀtanh(Wqᵢ + Ukⱼ) (Bahdanau et al.)",
    "relative": "qᵢ·(kⱼ + r_clip(j−i))/√d with learned r (Shaw et al.)",
    "local": "scaled-dot over keys with |i−j| ≤ window",
    "strided": "scaled-dot over |i−j| ≤ window and every stride-th key (Sparse Transformer)",
    "longformer": "scaled-dot over a sliding window plus global tokens (Longformer)",
    "bigbird": "longformer plus seeded random key blocks (BigBird)",
    "linear": "normalised φ(qᵢ)·φ(kⱼ) with φ = elu + 1 (linear attention)",
    "performer": "normalised φ(qᵢ)·φ(kⱼ) with positive random features (Performer)",
}
SPARSE_VARIANTS = ("local", "strided", "longformer", "bigbird")

#: ``(query positions [blk], key length) -> [blk, k]`` bool, True where query ``i`` may see key ``j``
Visibility = Callable[[Tensor, int], Tensor]
#: ``(x [b, h, n, d], is_query) -> features [b, h, n, m]`` (positive)
FeatureMap = Callable[[Tensor, bool], Tensor]


# -- sparsity patterns ---------------------------------------------------------------------------


def _offsets(rows: Tensor, key_length: int) -> Tensor:
    """``i − j`` for every query row ``i`` in ``rows`` and key ``j``: ``[blk, k]``."""
    cols = torch.arange(key_length, device=rows.device)
    return rows[:, None] - cols[None, :]


def local_visibility(window: int) -> Visibility:
    """Keys within ``window`` positions of the query: ``|i − j| ≤ window``."""

    def visible(rows: Tensor, key_length: int) -> Tensor:
        return _offsets(rows, key_length).abs() <= window

    return visible


def strided_visibility(stride: int, window: int) -> Visibility:
    """The Sparse Transformer's strided pattern: ``|i − j| ≤ window`` or ``(i − j) mod stride = 0``."""

    def visible(rows: Tensor, key_length: int) -> Tensor:
        offsets = _offsets(rows, key_length)
        return (offsets.abs() <= window) | (offsets.remainder(stride) == 0)

    return visible


def longformer_visibility(window: int, global_tokens: int) -> Visibility:
    """Sliding window plus global tokens: the first ``global_tokens`` positions see and are seen by all."""

    def visible(rows: Tensor, key_length: int) -> Tensor:
        cols = torch.arange(key_length, device=rows.device)
        return (
            (_offsets(rows, key_length).abs() <= window)
            | (rows < global_tokens)[:, None]
            | (cols < global_tokens)[None, :]
        )

    return visible


def bigbird_random_blocks(num_blocks: int, random_blocks: int, seed: int) -> Tensor:
    """``[num_blocks, num_blocks]`` bool: query block ``a`` sees key block ``b`` at random.

    Each query block draws ``random_blocks`` distinct key blocks from its own
    generator (seeded by ``seed`` and the block index), so the table is the same
    on every machine and every call.
    """
    table = torch.zeros(num_blocks, num_blocks, dtype=torch.bool)
    for block in range(num_blocks):
        generator = torch.Generator().manual_seed(seed * 100_003 + block)
        chosen = torch.randperm(num_blocks, generator=generator)[: min(random_blocks, num_blocks)]
        table[block, chosen] = True
    return table


def bigbird_visibility(
    window: int, global_tokens: int, block_size: int, random_blocks: int, seed: int, max_positions: int
) -> Visibility:
    """BigBird: sliding window, global tokens, and ``random_blocks`` random key blocks per query block."""
    base = longformer_visibility(window, global_tokens)
    tables: dict[int, Tensor] = {}

    def visible(rows: Tensor, key_length: int) -> Tensor:
        positions = max(max_positions, key_length, int(rows.max()) + 1 if rows.numel() else 0)
        num_blocks = math.ceil(positions / block_size)
        if num_blocks not in tables:
            tables[num_blocks] = bigbird_random_blocks(num_blocks, random_blocks, seed)
        table = tables[num_blocks].to(rows.device)
        cols = torch.arange(key_length, device=rows.device)
        random = table[rows // block_size][:, cols // block_size]  # [blk, k]
        return base(rows, key_length) | random

    return visible


def sparsity_visibility(config: ToyConfig) -> Visibility | None:
    """The visibility rule of a sparse variant, or ``None`` for dense ones."""
    if config.attention == "local":
        return local_visibility(config.window)
    if config.attention == "strided":
        return strided_visibility(config.stride, config.window)
    if config.attention == "longformer":
        return longformer_visibility(config.window, config.global_tokens)
    if config.attention == "bigbird":
        return bigbird_visibility(
            config.window,
            config.global_tokens,
            config.block_size,
            config.random_blocks,
            config.seed,
            config.max_positions,
        )
    return None


# -- pattern functions ------------------------------------------------------------------------------


def _query_rows(query: Tensor, query_start: int) -> Tensor:
    """Absolute positions of the queries in this block: ``[blk]``."""
    return torch.arange(query_start, query_start + query.shape[2], device=query.device)


def softmax_over_visible(
    scores: Tensor, mask: Tensor | None, visibility: Visibility | None, query_start: int
) -> Tensor:
    """``softmax(scores + mask)`` with keys outside ``visibility`` hidden; float32 ``[b, h, blk, k]``.

    Hidden keys get exactly zero weight; a row with no visible key at all (a
    padding query) is all zero rather than NaN.
    """
    scores = scores.float()
    hidden = None
    if mask is not None:
        scores = scores + mask.float()
        hidden = mask < HIDDEN_BELOW  # [b, 1|h, blk, k]
    if visibility is not None:
        rows = torch.arange(query_start, query_start + scores.shape[2], device=scores.device)
        outside = ~visibility(rows, scores.shape[3])  # [blk, k]
        hidden = outside if hidden is None else hidden | outside
    if hidden is None:
        return torch.softmax(scores, dim=-1)
    pattern = torch.softmax(scores.masked_fill(hidden, _HIDE), dim=-1)
    return pattern.masked_fill(hidden.all(dim=-1, keepdim=True), 0.0)


def scaled_dot_pattern(scale: float, visibility: Visibility | None = None) -> PatternFunction:
    """``softmax(qᵢ·kⱼ · scale)``: scaled-dot with ``scale = d^-½``, Luong's dot with ``scale = 1``."""

    def pattern(query: Tensor, key: Tensor, mask: Tensor | None, query_start: int) -> Tensor:
        scores = torch.matmul(query.float(), key.float().transpose(2, 3)) * scale  # [b, h, blk, k]
        return softmax_over_visible(scores, mask, visibility, query_start)

    return pattern


def general_pattern(weight: Tensor, visibility: Visibility | None = None) -> PatternFunction:
    """Luong's general score ``qᵢᵀ W kⱼ``; ``weight``: ``[h, d, d]``, one matrix per head."""

    def pattern(query: Tensor, key: Tensor, mask: Tensor | None, query_start: int) -> Tensor:
        projected = torch.matmul(query.float(), weight.float()[None])  # [b, h, blk, d]: qᵢᵀW
        scores = torch.matmul(projected, key.float().transpose(2, 3))  # [b, h, blk, k]
        return softmax_over_visible(scores, mask, visibility, query_start)

    return pattern


def additive_pattern(
    query_weight: Tensor, key_weight: Tensor, vector: Tensor, visibility: Visibility | None = None
) -> PatternFunction:
    """Bahdanau's score ``vᵀ tanh(W qᵢ + U kⱼ)``; ``W``, ``U``: ``[h, a, d]``, ``v``: ``[h, a]``."""

    def pattern(query: Tensor, key: Tensor, mask: Tensor | None, query_start: int) -> Tensor:
        projected_query = torch.einsum("bhqd,had->bhqa", query.float(), query_weight.float())  # [b, h, blk, a]
        projected_key = torch.einsum("bhkd,had->bhka", key.float(), key_weight.float())  # [b, h, k, a]
        hidden = torch.tanh(projected_query[:, :, :, None, :] + projected_key[:, :, None, :, :])  # [b, h, blk, k, a]
        scores = torch.einsum("bhqka,ha->bhqk", hidden, vector.float())  # [b, h, blk, k]
        return softmax_over_visible(scores, mask, visibility, query_start)

    return pattern


def relative_pattern(table: Tensor, max_distance: int, scale: float) -> PatternFunction:
    """Shaw et al.'s score ``qᵢ·(kⱼ + r[clip(j − i, ±K)]) · scale``; ``table``: ``[2K+1, d]``, row ``K`` is offset 0."""

    def pattern(query: Tensor, key: Tensor, mask: Tensor | None, query_start: int) -> Tensor:
        batch, heads, block, _ = query.shape
        key_length = key.shape[2]
        query = query.float()
        content = torch.matmul(query, key.float().transpose(2, 3))  # [b, h, blk, k]: qᵢ·kⱼ
        offsets = -_offsets(_query_rows(query, query_start), key_length)  # [blk, k]: j − i
        index = offsets.clamp(-max_distance, max_distance) + max_distance  # [blk, k] rows of the table
        per_offset = torch.matmul(query, table.float().t())  # [b, h, blk, 2K+1]: qᵢ·r_o for every offset o
        position = per_offset.gather(3, index.expand(batch, heads, block, key_length))  # [b, h, blk, k]
        return softmax_over_visible((content + position) * scale, mask, None, query_start)

    return pattern


def elu_feature_map(x: Tensor, is_query: bool) -> Tensor:
    """``φ(x) = elu(x) + 1`` (positive), the linear-attention kernel of Katharopoulos et al."""
    return nn.functional.elu(x.float()) + 1.0


def performer_feature_map(omega: Tensor) -> FeatureMap:
    """FAVOR+ positive random features ``φ(x) = exp(ωx − ‖x‖²/2) / √m`` on ``x = q/d^¼`` (``k/d^¼``).

    ``omega``: ``[m, d]`` Gaussian. ``E[φ(q)·φ(k)] = exp(q·k/√d)``, so the pattern
    approximates scaled-dot softmax. A per-query constant (max over features) and
    a per-head constant over all keys are subtracted before ``exp`` for stability;
    both cancel in the normalisation.
    """

    def features(x: Tensor, is_query: bool) -> Tensor:
        x = x.float() * x.shape[-1] ** -0.25
        logits = torch.matmul(x, omega.float().t()) - 0.5 * (x**2).sum(-1, keepdim=True)  # [b, h, n, m]
        if is_query:
            stabiliser = logits.amax(dim=-1, keepdim=True)  # [b, h, n, 1]: cancels row by row
        else:
            stabiliser = logits.amax(dim=(-2, -1), keepdim=True)  # [b, h, 1, 1]: same for every key
        return torch.exp(logits - stabiliser) * omega.shape[0] ** -0.5

    return features


def kernel_pattern(feature_map: FeatureMap, visibility: Visibility | None = None) -> PatternFunction:
    """Linear attention's pattern: ``φ(qᵢ)·φ(kⱼ)`` over the visible keys, normalised to sum to 1."""

    def pattern(query: Tensor, key: Tensor, mask: Tensor | None, query_start: int) -> Tensor:
        weights = torch.matmul(feature_map(query, True), feature_map(key, False).transpose(2, 3))  # [b, h, blk, k]
        if mask is not None:
            weights = weights * (mask >= HIDDEN_BELOW)
        if visibility is not None:
            weights = weights * visibility(_query_rows(query, query_start), key.shape[2])
        # A row with no visible key (padding queries only) stays all zero instead of 0/0.
        return weights / weights.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)

    return pattern


# -- the per-layer parameters of a variant -------------------------------------------------------------


class AttentionVariant(nn.Module):
    """What a variant adds to one attention layer (its parameters) and the pattern function it uses.

    Per-head parameters (``general``'s W, ``additive``'s W, U, v) have the head as
    their first axis, so pruning slices them with :meth:`keep_heads`. ``relative``'s
    table and ``performer``'s features are shared by the heads of a layer (as in
    the papers).
    """

    def __init__(self, config: ToyConfig, heads: int, self_attention: bool, layer_seed: int = 0):
        super().__init__()
        self.kind = config.attention
        self.self_attention = self_attention
        self.head_dim = config.head_dim
        self.max_relative_position = config.max_relative_position
        d = config.head_dim
        if self.kind == "general":
            # starts as scaled-dot (W = I/√d) and learns from there
            self.weight = nn.Parameter(torch.eye(d).repeat(heads, 1, 1) * d**-0.5)  # [h, d, d]
        elif self.kind == "additive":
            a = config.additive_width or d
            self.query_weight = nn.Parameter(torch.randn(heads, a, d) * d**-0.5)  # [h, a, d]
            self.key_weight = nn.Parameter(torch.randn(heads, a, d) * d**-0.5)  # [h, a, d]
            self.vector = nn.Parameter(torch.randn(heads, a) * a**-0.5)  # [h, a]
        elif self.kind == "relative" and self_attention:
            self.relative_keys = nn.Parameter(torch.randn(2 * config.max_relative_position + 1, d) * 0.02)  # [2K+1, d]
        elif self.kind == "performer":
            generator = torch.Generator().manual_seed(config.seed * 1_000_003 + layer_seed)
            self.register_buffer("omega", torch.randn(config.num_features, d, generator=generator))  # [m, d]
        self.visibility = sparsity_visibility(config) if self_attention else None

    def pattern_function(self) -> PatternFunction:
        """The pattern function for :func:`attnviz.core.attend`, reading this layer's current parameters."""
        scale = self.head_dim**-0.5
        if self.kind == "dot":
            return scaled_dot_pattern(1.0)
        if self.kind == "general":
            return general_pattern(self.weight)
        if self.kind == "additive":
            return additive_pattern(self.query_weight, self.key_weight, self.vector)
        if self.kind == "relative" and self.self_attention:
            return relative_pattern(self.relative_keys, self.max_relative_position, scale)
        if self.kind == "linear":
            return kernel_pattern(elu_feature_map)
        if self.kind == "performer":
            return kernel_pattern(performer_feature_map(self.omega))  # type: ignore[arg-type]  # a buffer
        return scaled_dot_pattern(scale, self.visibility)  # scaled-dot and the sparse variants

    def keep_heads(self, keep: Tensor) -> None:
        """Keep only the heads at indices ``keep`` (``[h']`` long) in the per-head parameters."""
        for name in ("weight", "query_weight", "key_weight", "vector"):
            parameter = getattr(self, name, None)
            if isinstance(parameter, nn.Parameter):
                setattr(self, name, nn.Parameter(parameter.data[keep].clone()))
