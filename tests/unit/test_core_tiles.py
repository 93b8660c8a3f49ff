"""attend_rows_ (attnviz.core.kernel_calls): attention tile by tile of keys, without a pattern, against float64."""

from __future__ import annotations

import math
import os

import pytest
import torch

from attnviz.core import AttentionContext, AttentionSite, attend, blocks, kernel, kernel_calls
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


def reference(query, key, value, mask, scaling, reach, columns, key_weights):
    """Float64 softmax attention and the summary fields by hand: ``([b, q, h, d], [F, b, h, q], [b, h, q])``."""
    repeat = query.shape[1] // key.shape[1]
    key, value = key.double().repeat_interleave(repeat, 1), value.double().repeat_interleave(repeat, 1)
    scores = query.double() @ key.transpose(2, 3) * scaling
    if mask is not None:
        scores = scores + mask.double()
    pattern = scores.softmax(-1)  # [b, h, q, k]; a row that sees no key is uniform, as in torch
    length = pattern.shape[-1]
    positions = torch.arange(length, dtype=torch.float64)
    entropy = -(pattern * torch.where(pattern > 0, pattern.log(), 0.0)).sum(-1)
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
