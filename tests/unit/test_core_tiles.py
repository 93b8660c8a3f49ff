"""attend_rows_ (attnviz.core.kernel_calls): attention tile by tile of keys, without a pattern, against float64."""

from __future__ import annotations

import math
import os

import pytest
import torch

from attnviz.core import AttentionContext, AttentionSite, attend, blocks, kernel, kernel_calls
from attnviz.core import attention as core_attention
from attnviz.models.base import EncodedBatch
from attnviz.stats import StatisticsAccumulator
from attnviz.stats.definitions import STATISTIC_INDEX

MIN = torch.finfo(torch.float32).min


@pytest.fixture(scope="module")
def loaded_kernel():
    """The kernel with its block routines; CI (CI=true) requires them, elsewhere a machine without them skips."""
    if not kernel.prepare_kernel() or not kernel_calls.block_kernel_applies(
        torch.zeros(1, 1, 1, 1), torch.zeros(1), None
    ):
        state, why, _ = kernel.kernel_status()
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the fused kernel and its block routines must load in CI: {state} {why}")
        pytest.skip(f"fused kernel {state}: {why}")
    return kernel


def masks(kind: str, batch: int, length: int) -> torch.Tensor | None:
    """Additive float32 masks as transformers builds them (the float32 minimum where a key is hidden)."""
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    if kind == "none":
        return None
    if kind == "key padding":  # an encoder's [b, 1, 1, k]: example 1 has 9 keys fewer, broadcast over rows
        lengths = torch.tensor([length, length - 9])[:batch]
        return torch.where(j < lengths[:, None], 0.0, MIN)[:, None, None, :].contiguous()
    causal = torch.where(j <= i, 0.0, MIN)[None, None].expand(batch, 1, length, length).clone()  # [b, 1, q, k]
    if kind == "causal, left padding":  # example 1 starts after 5 pad tokens: its first 5 rows see no key at all
        causal[1, :, :, :5] = MIN
    if kind == "causal, -inf":
        causal = torch.where(causal == 0, 0.0, -math.inf)
    return causal


def reference(query, key, value, mask, scaling, reach, columns, key_weights, sinks=None):
    """Float64 softmax attention and the summary fields by hand: ``([b, q, h, dv], [F, b, h, q], [b, h, q])``.

    ``sinks``: ``[h]`` sink logits, one more softmax column with no value (the summary's entropy counts it)."""
    repeat = query.shape[1] // key.shape[1]
    key, value = key.double().repeat_interleave(repeat, 1), value.double().repeat_interleave(repeat, 1)
    scores = query.double() @ key.transpose(2, 3) * scaling
    if mask is not None:
        scores = scores + mask.double()
    if sinks is not None:
        sink_column = sinks.double().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.cat([scores, sink_column], -1).softmax(-1)
        pattern, sink_share = weights[..., :-1], weights[..., -1]
    else:
        pattern, sink_share = scores.softmax(-1), 0.0  # [b, h, q, k]; a row that sees no key is uniform, as in torch
    length = pattern.shape[-1]
    positions = torch.arange(length, dtype=torch.float64)
    entropy = -(pattern * torch.where(pattern > 0, pattern.log(), 0.0)).sum(-1)
    entropy = entropy - torch.special.xlogy(sink_share, sink_share) if sinks is not None else entropy
    distance = (pattern * (positions[:, None] - positions[None, :]).abs()).sum(-1)
    band = []
    for offset in range(-reach, reach + 1):  # weight on key i − offset
        keys = torch.arange(length) - offset
        inside = (keys >= 0) & (keys < length)
        band.append(torch.where(inside, pattern[..., torch.arange(length), keys.clamp(0, length - 1)], 0.0))
    fields = torch.stack([pattern.amax(-1), entropy, distance, *band, *(pattern[..., c] for c in columns)])
    weighted = (pattern * key_weights.double()[:, :, None, :length]).sum(-1)
    return (pattern @ value).transpose(1, 2), fields, weighted


@pytest.mark.parametrize(
    ("threads", "tile_rows", "key_tile"),
    [(1, 64, 512), (2, 16, 32), (2, 7, 48), (1, 32, 16)],  # one tile; many tiles, partial tasks and tiles
)
@pytest.mark.parametrize("kind", ["causal", "causal, left padding", "causal, -inf", "key padding", "none"])
def test_tiles_equal_float64_attention_and_summary(loaded_kernel, monkeypatch, threads, tile_rows, key_tile, kind):
    monkeypatch.setattr(kernel_calls, "TILE_ROWS", tile_rows)
    monkeypatch.setattr(kernel_calls, "KEY_TILE", key_tile)
    generator = torch.Generator().manual_seed(tile_rows + key_tile)
    batch, heads, kv_heads, length, dim = 2, 6, 2, 101, 16
    query = torch.randn(batch, length, heads, dim, generator=generator).transpose(1, 2) * 2  # strided [b, h, q, d]
    key = torch.randn(batch, kv_heads, length, dim, generator=generator)
    value = torch.randn(batch, kv_heads, length, dim, generator=generator)
    key_weights = torch.rand(batch, heads, length, generator=generator)  # e.g. value norms
    mask = masks(kind, batch, length)
    scaling, reach, columns = dim**-0.5, 3, (0, 4, 57, 100)
    stops = [min(length, -(-stop // 16) * 16) for stop in blocks.key_stops(mask, tile_rows, length, length)]
    buffer = torch.full(kernel_calls.RowSummary.buffer_shape(batch, heads, length, reach, len(columns)), math.nan)
    summary = kernel_calls.RowSummary(buffer, columns)
    output, weighted = torch.full((batch, length, heads, dim), math.nan), torch.empty(batch, heads, length)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernel_calls.attend_rows_(
            query, key, value, mask, scaling, torch.tensor(stops), summary, output, key_weights, weighted
        )
    finally:
        torch.set_num_threads(before)

    expected_output, expected, expected_weighted = reference(
        query, key, value, mask, scaling, reach, columns, key_weights
    )
    torch.testing.assert_close(output.double(), expected_output, rtol=0, atol=2e-6)
    fields = summary.values.double()
    torch.testing.assert_close(fields[0], expected[0], rtol=0, atol=1e-6)  # max weight
    torch.testing.assert_close(fields[1], expected[1], rtol=0, atol=2e-6)  # entropy (nats)
    torch.testing.assert_close(fields[2], expected[2], rtol=1e-6, atol=1e-5)  # mean distance
    torch.testing.assert_close(fields[3:], expected[3:], rtol=0, atol=1e-6)  # band and columns
    assert summary.band.shape[0] == 2 * reach + 1 and torch.equal(summary.column(57), summary.values[-2])
    torch.testing.assert_close(weighted.double(), expected_weighted, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("dim", "value_dim"),
    [(16, 12), (64, 32)],  # values narrower than queries: through BLAS; through own products
)
@pytest.mark.parametrize("kind", ["causal", "causal, left padding", "key padding"])
def test_sinks_and_a_value_size_of_their_own_in_tiles_blocks_and_rows(loaded_kernel, monkeypatch, dim, value_dim, kind):
    """Each head's sink is one more softmax column without a value (gpt-oss); values may be narrower than queries
    (multi-head latent attention). All three kernel routines against float64, sink share included."""
    monkeypatch.setattr(kernel_calls, "TILE_ROWS", 16)
    monkeypatch.setattr(kernel_calls, "KEY_TILE", 32)  # several tiles: the running max starts at the sink, then grows
    generator = torch.Generator().manual_seed(dim + value_dim)
    batch, heads, kv_heads, length = 2, 4, 2, 70
    query = torch.randn(batch, heads, length, dim, generator=generator) * 0.5
    key = torch.randn(batch, kv_heads, length, dim, generator=generator)
    value = torch.randn(batch, kv_heads, length, value_dim, generator=generator)
    sinks = torch.tensor([-3.0, 0.0, 2.0, 12.0])  # 12: the sink outweighs every key, the max is at the sink
    key_weights = torch.rand(batch, heads, length, generator=generator)
    mask = masks(kind, batch, length)
    scaling, reach, columns = dim**-0.5, 2, (0, 5)
    expected_output, expected, expected_weighted = reference(
        query, key, value, mask, scaling, reach, columns, key_weights, sinks
    )
    scores = query.double() @ key.double().repeat_interleave(2, 1).transpose(2, 3) * scaling
    scores = scores + (0 if mask is None else mask.double())
    expected_share = 1 / (1 + (scores - sinks.double().view(1, -1, 1, 1)).exp().sum(-1))  # [b, h, q]

    # tiles: every query at once, no pattern
    stops = [min(length, -(-stop // 16) * 16) for stop in blocks.key_stops(mask, 16, length, length)]
    summary = kernel_calls.RowSummary(
        torch.full(kernel_calls.RowSummary.buffer_shape(batch, heads, length, reach, len(columns)), math.nan), columns
    )
    output, weighted = torch.full((batch, length, heads, value_dim), math.nan), torch.empty(batch, heads, length)
    share = torch.full((batch, heads, length), math.nan)
    kernel_calls.attend_rows_(
        query, key, value, mask, scaling, torch.tensor(stops), summary, output, key_weights, weighted, sinks, share
    )
    torch.testing.assert_close(output.double(), expected_output, rtol=0, atol=2e-6)
    torch.testing.assert_close(summary.values.double(), expected, rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(weighted.double(), expected_weighted, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(share.double(), expected_share, rtol=0, atol=1e-6)

    # a block of whole rows (queries 10 … 69): pattern, summary, output and sink share
    start, rows = 10, length - 10
    block_scores = torch.full((batch, heads, rows, length), math.nan)
    block_summary = torch.full(kernel_calls.RowSummary.buffer_shape(batch, heads, rows, reach), math.nan)
    block_output = torch.full((batch, length, heads, value_dim), math.nan)
    block_share = torch.full((batch, heads, rows), math.nan)
    block_mask = None if mask is None else mask[:, :, start:] if mask.shape[2] > 1 else mask
    kernel_calls.attend_block_(
        query,
        key,
        value,
        block_scores,
        block_mask,
        scaling,
        start,
        block_summary,
        block_output,
        None,
        None,
        sinks,
        block_share,
    )
    reference_pattern = torch.cat([scores, sinks.double().view(1, -1, 1, 1).expand(batch, heads, length, 1)], -1)
    reference_pattern = reference_pattern.softmax(-1)[..., :-1]
    torch.testing.assert_close(block_scores.double(), reference_pattern[:, :, start:], rtol=0, atol=1e-6)
    torch.testing.assert_close(block_output[:, start:].double(), expected_output[:, start:], rtol=0, atol=2e-6)
    torch.testing.assert_close(block_summary.double(), expected[: 4 + 2 * reach, ..., start:], rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(block_share.double(), expected_share[..., start:], rtol=0, atol=1e-6)

    # softmax of given scores in place (the block path with a head mask)
    rows_scores = (query @ key.repeat_interleave(2, 1).transpose(2, 3)).contiguous()
    row_share = torch.full((batch, heads, length), math.nan)
    assert kernel_calls.fused_softmax_(rows_scores, mask, scaling, 0, None, sinks, row_share)
    torch.testing.assert_close(rows_scores.double(), reference_pattern, rtol=0, atol=1e-6)
    torch.testing.assert_close(row_share.double(), expected_share, rtol=0, atol=1e-6)


def test_every_path_of_attend_takes_the_sinks_and_hands_observers_the_sink_share(loaded_kernel, monkeypatch):
    """torch's operations in buffers, the kernel's blocks (an observer reads the pattern), its tiles (statistics only)
    and the differentiable path: eager's sink softmax, outputs of values 12 wide from queries 16 wide."""
    monkeypatch.setattr(blocks, "WIDTH_MULTIPLE", 1)
    generator = torch.Generator().manual_seed(5)
    batch, heads, kv_heads, length, dim, value_dim = 2, 4, 2, 40, 16, 12
    query = torch.randn(batch, heads, length, dim, generator=generator)
    key = torch.randn(batch, kv_heads, length, dim, generator=generator)
    value = torch.randn(batch, kv_heads, length, value_dim, generator=generator)
    sinks = torch.tensor([-1.0, 0.5, 2.0, 4.0])
    mask = masks("causal, left padding", batch, length)
    expected_output, _, _ = reference(
        query, key, value, mask, dim**-0.5, 1, (), torch.zeros(batch, heads, length), sinks
    )
    pattern_fn = core_attention.softmax_pattern(dim**-0.5, sinks=sinks)
    site = AttentionSite("self", 0)

    class SinkReader:
        accepts_key_prefix = True
        accepts_sink_share = True

        def __init__(self):
            self.rows = []

        def observe(self, site, pattern, query_start, sink_share=None, **_):
            self.rows.append((pattern.double().sum(-1) + sink_share.double()).flatten())  # each row's whole softmax

    def run(fused, observers):
        context = AttentionContext(observers, fused_softmax=fused)
        return attend(query, key, value, mask=mask, pattern_fn=pattern_fn, site=site, context=context)

    with torch.no_grad():
        on_torch, in_blocks = SinkReader(), SinkReader()
        outputs = [run(False, [on_torch]), run(True, [in_blocks])]
        statistics = StatisticsAccumulator(causal=True)
        statistics.begin_batch(
            EncodedBatch(
                inputs={"attention_mask": torch.ones(batch, length, dtype=torch.long)},
                tokens=[["t"] * length] * batch,
                special=[[False] * length] * batch,
                word_ids=[list(range(length))] * batch,
            )
        )
        outputs.append(run(True, [statistics]))
    differentiable = query.clone().requires_grad_(True)
    outputs.append(attend(differentiable, key, value, mask=mask, pattern_fn=pattern_fn).detach())
    for output in outputs:
        assert output.shape == (batch, length, heads, value_dim)
        torch.testing.assert_close(output.double(), expected_output, rtol=0, atol=2e-6)
    for reader in (on_torch, in_blocks):  # keys and sink together: a whole softmax in every row
        torch.testing.assert_close(torch.cat(reader.rows), torch.ones(batch * heads * length, dtype=torch.float64))
    share = (
        statistics.sums[site][STATISTIC_INDEX["sink_share"]] / statistics.counts[site][STATISTIC_INDEX["sink_share"]]
    )
    assert share.shape == (heads,) and (share[1:] > share[:-1]).all()  # a larger sink logit, a larger share


def test_statistics_observers_run_in_tiles_and_other_observers_in_blocks(loaded_kernel, monkeypatch):
    """The tile path runs only when every observer takes a summary instead of the pattern; outputs agree either way."""
    calls = []
    tiles = blocks.attend_rows_
    monkeypatch.setattr(blocks, "attend_rows_", lambda *arguments: calls.append(1) or tiles(*arguments))
    generator = torch.Generator().manual_seed(1)
    batch, heads, kv_heads, length, dim = 2, 6, 2, 150, 16
    query = torch.randn(batch, heads, length, dim, generator=generator)
    key = torch.randn(batch, kv_heads, length, dim, generator=generator)
    value = torch.randn(batch, kv_heads, length, dim, generator=generator)
    mask = masks("causal", batch, length)
    padded = EncodedBatch(
        inputs={"attention_mask": torch.ones(batch, length, dtype=torch.long)},
        tokens=[["t"] * length] * 2,
        special=[[True] + [False] * (length - 1), [False] * length],
        word_ids=[list(range(length))] * 2,
    )

    class PatternReader:
        accepts_key_prefix = True

        def __init__(self):
            self.rows = 0

        def observe(self, site, pattern, query_start):
            self.rows += pattern.shape[2]

    site = AttentionSite("self", 0)
    with torch.no_grad():
        plain = attend(query, key, value, mask=mask, context=AttentionContext(fused_softmax=True))
        assert len(calls) == 1  # no observer needs the pattern: tiles
        statistics = StatisticsAccumulator(causal=True)
        statistics.begin_batch(padded)
        summarised = attend(
            query, key, value, mask=mask, site=site, context=AttentionContext([statistics], fused_softmax=True)
        )
        assert len(calls) == 2 and torch.equal(summarised, plain)
        reader = PatternReader()
        read = attend(query, key, value, mask=mask, site=site, context=AttentionContext([reader], fused_softmax=True))
    assert len(calls) == 2 and reader.rows == length  # the reader got every row of the pattern, in blocks
    torch.testing.assert_close(read, plain, rtol=0, atol=2e-6)
    index = STATISTIC_INDEX["first_token"]
    first = statistics.sums[site][index] / statistics.counts[site][index]  # mean weight on key 0
    assert first.shape == (heads,) and (first > 0).all()


def test_blocks_are_cache_sized_on_the_cpu_and_large_on_an_accelerator():
    """SmolLM2 at 8,192 tokens (9 heads): 28 queries a block in the CPU's cache, 910 on a GPU, where each block costs
    kernel launches and observer calls (measured on an H100: the statistics pass 21× a plain sdpa forward with
    cache-sized blocks, 1.4× with these)."""
    from attnviz.core.attention import ACCELERATOR_BLOCK_ELEMENTS, BLOCK_ELEMENTS, query_block_size

    assert query_block_size(1, 9, 8192, 8192, torch.device("cpu")) == BLOCK_ELEMENTS // (9 * 8192) == 28
    assert query_block_size(1, 9, 8192, 8192) == 28  # no device given: the CPU's bound
    assert query_block_size(1, 9, 8192, 8192, torch.device("cuda")) == ACCELERATOR_BLOCK_ELEMENTS // (9 * 8192) == 910
    assert query_block_size(1, 9, 500, 500, torch.device("cuda")) == 500  # a short input is one block
