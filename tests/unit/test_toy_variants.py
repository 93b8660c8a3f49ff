"""Every toy attention variant against its formula, computed by hand (loops) on small tensors, masks included."""

from __future__ import annotations

import math

import pytest
import torch

import attnviz.core.attention as core_attention
from attnviz.captures.attention_capture import PatternRecorder
from attnviz.core import AttentionContext, AttentionSite, attend
from attnviz.toy.config import VARIANT_NAMES, ToyConfig
from attnviz.toy.model import additive_mask
from attnviz.toy.variants import (
    AttentionVariant,
    bigbird_random_blocks,
    elu_feature_map,
    kernel_pattern,
    performer_feature_map,
    scaled_dot_pattern,
)

B, H, N, D = 2, 3, 7, 4
SITE = AttentionSite("self", 0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tensors(seed: int = 0, key_length: int = N):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(B, H, N, D, generator=generator, dtype=torch.float64).float()
    key = torch.randn(B, H, key_length, D, generator=generator)
    value = torch.randn(B, H, key_length, D, generator=generator)
    return query, key, value


def _visible_keys(causal: bool, lengths=(N, 5), key_length: int = N) -> torch.Tensor:
    """``[b, q, k]`` bool: padding keys (example 1 has 5 real tokens) and, if causal, the future hidden."""
    valid = torch.arange(key_length)[None, :] < torch.tensor(lengths)[:, None]
    mask = additive_mask(valid, N, causal, torch.float32)  # [b, 1, q, k]
    return mask[:, 0] == 0


def _run(pattern_fn, query, key, value, causal: bool, lengths=(N, 5)):
    """Pattern (as observed) and output of the core with this pattern function and the masks."""
    valid = torch.arange(key.shape[2])[None, :] < torch.tensor(lengths)[:, None]
    mask = additive_mask(valid, query.shape[2], causal, torch.float32)
    recorder = PatternRecorder()
    output = attend(
        query, key, value, mask=mask, pattern_fn=pattern_fn, site=SITE, context=AttentionContext([recorder])
    )
    return recorder.patterns[SITE], output  # [b, h, q, k], [b, q, h, d]


def _softmax_reference(score, visible: torch.Tensor) -> torch.Tensor:
    """Pattern by hand: ``score(b, h, i, j)`` exponentiated over visible keys, normalised per row."""
    pattern = torch.zeros(B, H, N, visible.shape[-1])
    for b in range(B):
        for h in range(H):
            for i in range(N):
                keys = [j for j in range(visible.shape[-1]) if visible[b, i, j]]
                if not keys:
                    continue
                scores = [score(b, h, i, j) for j in keys]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                for j, w in zip(keys, weights):
                    pattern[b, h, i, j] = w / sum(weights)
    return pattern


def _check(pattern, output, reference, value, visible, atol=1e-5):
    torch.testing.assert_close(pattern, reference, atol=atol, rtol=1e-4)
    expected_output = torch.einsum("bhqk,bhkd->bqhd", reference, value)
    torch.testing.assert_close(output, expected_output, atol=atol, rtol=1e-4)
    hidden = ~visible[:, None].expand_as(pattern)
    assert float(pattern[hidden].abs().sum()) == 0.0  # hidden keys get exactly zero weight
    rows = visible.any(-1)[:, None].expand(B, H, N)
    torch.testing.assert_close(pattern.sum(-1)[rows], torch.ones(int(rows.sum())), atol=1e-5, rtol=0)


def _variant(attention: str, **fields) -> AttentionVariant:
    torch.manual_seed(1)
    config = ToyConfig(width=D * H, num_heads=H, max_positions=N, attention=attention, **fields)
    variant = AttentionVariant(config, H, self_attention=True, layer_seed=0)
    for parameter in variant.parameters():  # make learned parameters non-trivial
        parameter.data.add_(torch.randn(parameter.shape) * 0.3)
    return variant


def _dot(a, b) -> float:
    return float(sum(float(x) * float(y) for x, y in zip(a, b)))


@pytest.mark.parametrize("causal", [False, True])
def test_scaled_dot_and_dot(causal):
    query, key, value = _tensors()
    visible = _visible_keys(causal)
    for attention, scale in (("scaled-dot", D**-0.5), ("dot", 1.0)):
        variant = _variant(attention)
        pattern, output = _run(variant.pattern_function(), query, key, value, causal)
        reference = _softmax_reference(lambda b, h, i, j, s=scale: _dot(query[b, h, i], key[b, h, j]) * s, visible)
        _check(pattern, output, reference, value, visible)


@pytest.mark.parametrize("causal", [False, True])
def test_general(causal):
    query, key, value = _tensors(1)
    visible = _visible_keys(causal)
    variant = _variant("general")
    weight = variant.weight.detach()  # [h, d, d]

    def score(b, h, i, j):
        return sum(
            float(query[b, h, i, x]) * float(weight[h, x, y]) * float(key[b, h, j, y])
            for x in range(D)
            for y in range(D)
        )

    pattern, output = _run(variant.pattern_function(), query, key, value, causal)
    _check(pattern, output, _softmax_reference(score, visible), value, visible)


@pytest.mark.parametrize("causal", [False, True])
def test_additive(causal):
    query, key, value = _tensors(2)
    visible = _visible_keys(causal)
    variant = _variant("additive", additive_width=5)
    w, u, v = variant.query_weight.detach(), variant.key_weight.detach(), variant.vector.detach()

    def score(b, h, i, j):
        total = 0.0
        for a in range(w.shape[1]):
            inner = _dot(w[h, a], query[b, h, i]) + _dot(u[h, a], key[b, h, j])
            total += float(v[h, a]) * math.tanh(inner)
        return total

    pattern, output = _run(variant.pattern_function(), query, key, value, causal)
    _check(pattern, output, _softmax_reference(score, visible), value, visible)


@pytest.mark.parametrize("causal", [False, True])
def test_relative_shaw(causal, monkeypatch):
    query, key, value = _tensors(3)
    visible = _visible_keys(causal)
    variant = _variant("relative", max_relative_position=2)
    table = variant.relative_keys.detach()  # [2K+1, d], row K = offset 0

    def score(b, h, i, j):
        offset = max(-2, min(2, j - i))
        return _dot(query[b, h, i], key[b, h, j] + table[offset + 2]) * D**-0.5

    reference = _softmax_reference(score, visible)
    pattern, output = _run(variant.pattern_function(), query, key, value, causal)
    _check(pattern, output, reference, value, visible)
    # processed in blocks of queries, each block must use its own absolute positions
    monkeypatch.setattr(core_attention, "BLOCK_ELEMENTS", B * H * N * 2)
    pattern, output = _run(variant.pattern_function(), query, key, value, causal)
    _check(pattern, output, reference, value, visible)


def _allowed(
    attention: str, i: int, j: int, window=1, stride=3, global_tokens=1, block_size=2, random_table=None
) -> bool:
    if attention == "local":
        return abs(i - j) <= window
    if attention == "strided":
        return abs(i - j) <= window or (i - j) % stride == 0
    longformer = abs(i - j) <= window or i < global_tokens or j < global_tokens
    if attention == "longformer":
        return longformer
    return longformer or bool(random_table[i // block_size, j // block_size])


@pytest.mark.parametrize("attention", ["local", "strided", "longformer", "bigbird"])
@pytest.mark.parametrize("causal", [False, True])
def test_sparsity_masks(attention, causal, monkeypatch):
    query, key, value = _tensors(4)
    fields = {"window": 1, "stride": 3, "global_tokens": 1, "block_size": 2, "random_blocks": 1, "seed": 5}
    table = bigbird_random_blocks(math.ceil(N / 2), 1, 5)
    visible = _visible_keys(causal)
    for b in range(B):
        for i in range(N):
            for j in range(N):
                visible[b, i, j] &= _allowed(attention, i, j, random_table=table)
    variant = _variant(attention, **fields)
    reference = _softmax_reference(lambda b, h, i, j: _dot(query[b, h, i], key[b, h, j]) * D**-0.5, visible)
    pattern, output = _run(variant.pattern_function(), query, key, value, causal)
    _check(pattern, output, reference, value, visible)
    monkeypatch.setattr(core_attention, "BLOCK_ELEMENTS", B * H * N * 3)  # blocks of 3 queries
    pattern, output = _run(variant.pattern_function(), query, key, value, causal)
    _check(pattern, output, reference, value, visible)


def test_bigbird_random_blocks_are_seeded():
    first = bigbird_random_blocks(6, 2, seed=3)
    torch.testing.assert_close(first, bigbird_random_blocks(6, 2, seed=3))
    assert not torch.equal(first, bigbird_random_blocks(6, 2, seed=4))
    assert first.sum(dim=1).tolist() == [2] * 6  # exactly two random key blocks per query block


def _kernel_reference(phi, query, key, visible):
    pattern = torch.zeros(B, H, N, key.shape[2])
    for b in range(B):
        for h in range(H):
            for i in range(N):
                weights = [
                    _dot(phi(query[b, h, i]), phi(key[b, h, j])) if visible[b, i, j] else 0.0
                    for j in range(key.shape[2])
                ]
                for j, w in enumerate(weights):
                    pattern[b, h, i, j] = w / sum(weights)
    return pattern


@pytest.mark.parametrize("causal", [False, True])
def test_linear_elu(causal):
    query, key, value = _tensors(5)
    visible = _visible_keys(causal)
    variant = _variant("linear")

    def phi(x):
        return [v + 1 if v > 0 else math.exp(v) for v in x.tolist()]  # elu(x) + 1

    pattern, output = _run(variant.pattern_function(), query, key, value, causal)
    _check(pattern, output, _kernel_reference(phi, query, key, visible), value, visible)


@pytest.mark.parametrize("causal", [False, True])
def test_performer(causal):
    query, key, value = _tensors(6)
    visible = _visible_keys(causal)
    variant = _variant("performer", num_features=16)
    omega = variant.omega  # [m, d]

    def phi(x):
        x = x * D**-0.25
        m = omega.shape[0]
        return [math.exp(_dot(omega[f], x) - _dot(x, x) / 2) / math.sqrt(m) for f in range(m)]

    pattern, output = _run(variant.pattern_function(), query, key, value, causal)
    _check(pattern, output, _kernel_reference(phi, query, key, visible), value, visible, atol=1e-5)


def test_linear_pattern_equals_the_linear_time_form():
    """pattern @ V equals φ(Q)(φ(K)ᵀV) / φ(Q)Σφ(K) (bidirectional) and its running-sum form (causal)."""
    query, key, value = _tensors(7)
    for causal in (False, True):
        _pattern, output = _run(kernel_pattern(elu_feature_map), query, key, value, causal, lengths=(N, N))
        fq, fk = elu_feature_map(query, True), elu_feature_map(key, False)  # [b, h, n, d]
        if causal:
            kv = torch.cumsum(torch.einsum("bhkd,bhke->bhkde", fk, value), dim=2)  # Σ_{j≤i} φ(kⱼ)vⱼᵀ
            numerator = torch.einsum("bhqd,bhqde->bhqe", fq, kv)
            denominator = torch.einsum("bhqd,bhqd->bhq", fq, torch.cumsum(fk, dim=2))
        else:
            numerator = fq @ (fk.transpose(2, 3) @ value)  # [b, h, q, d]
            denominator = fq @ fk.sum(dim=2)[..., None]  # [b, h, q, 1]
            denominator = denominator[..., 0]
        expected = (numerator / denominator[..., None]).transpose(1, 2)  # [b, q, h, d]
        torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-4)


def test_performer_approximates_softmax_with_many_features():
    query, key, _ = _tensors(8)
    query, key = query * 0.5, key * 0.5
    omega = torch.randn(20000, D, generator=torch.Generator().manual_seed(0))
    approx = kernel_pattern(performer_feature_map(omega))(query, key, None, 0)
    exact = scaled_dot_pattern(D**-0.5)(query, key, None, 0)
    assert float((approx - exact).abs().max()) < 0.02


def test_cross_attention_of_position_variants_is_scaled_dot():
    """Relative positions and sparsity need one sequence: cross-attention falls back to scaled-dot."""
    query, key, _value = _tensors(9, key_length=5)
    reference = scaled_dot_pattern(D**-0.5)(query, key, None, 0)
    for attention in ("relative", "local", "bigbird"):
        config = ToyConfig(width=D * H, num_heads=H, attention=attention, window=0)
        variant = AttentionVariant(config, H, self_attention=False)
        torch.testing.assert_close(variant.pattern_function()(query, key, None, 0), reference)


@pytest.mark.parametrize("attention", VARIANT_NAMES)
def test_every_variant_keeps_fully_hidden_rows_finite(attention):
    """A padding query whose every key is hidden gives a finite row (no NaN reaches later layers)."""
    query, key, _ = _tensors(10)
    mask = torch.zeros(B, 1, N, N)
    mask[:, :, -1, :] = torch.finfo(torch.float32).min
    pattern = _variant(attention, window=0).pattern_function()(query, key, mask, 0)
    assert torch.isfinite(pattern).all()
