"""The core's fused softmax kernel (attnviz.core.kernel): torch's numbers, a right row summary, a safe fallback."""

from __future__ import annotations

import math
import os

import pytest
import torch

from attnviz.core import AttentionContext, AttentionSite, attend, kernel, kernel_calls
from attnviz.core import attention as core_attention
from attnviz.models.base import EncodedBatch
from attnviz.models.specs import load_model
from attnviz.stats import StatisticsAccumulator, compute_statistics

MIN = torch.finfo(torch.float32).min


@pytest.fixture(scope="module")
def loaded_kernel():
    """The kernel, built or loaded; CI (CI=true) requires it, elsewhere a machine without a compiler skips."""
    if not kernel.prepare_kernel():
        state, why, _ = kernel.kernel_status()
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the fused kernel must build in CI: {state} {why}")
        pytest.skip(f"fused kernel {state}: {why}")
    return kernel


def causal_mask(rows: int, width: int, query_start: int) -> torch.Tensor:
    """Additive ``[1, 1, rows, width]``: 0 where key j ≤ query i, the float32 minimum after."""
    i = torch.arange(query_start, query_start + rows)[:, None]
    j = torch.arange(width)[None, :]
    return torch.where(j <= i, 0.0, MIN)[None, None]


@pytest.mark.parametrize(
    ("batch", "heads", "rows", "width", "query_start", "mask_kind"),
    [
        (1, 3, 7, 37, 30, "causal"),  # width not a multiple of the lanes: a partial last vector
        (2, 4, 16, 64, 48, "causal"),
        (2, 2, 5, 21, 0, "padding"),  # [b, 1, 1, k] key padding, broadcast over rows
        (1, 2, 9, 40, 0, "none"),
        (1, 2, 6, 11, 5, "causal"),  # rows shorter than one vector
        (1, 2, 4, 2048, 2044, "causal"),  # a long row: the double-precision summary sums over many chunks
    ],
)
def test_pattern_equals_torch_softmax_and_summary_equals_hand_values(
    loaded_kernel, batch, heads, rows, width, query_start, mask_kind
):
    generator = torch.Generator().manual_seed(batch * 100 + width)
    raw = torch.randn(batch, heads, rows, width, generator=generator) * 12  # wide logits: peaked and flat rows
    raw[0, 0, 0] = 0.0  # a uniform row
    raw[-1, -1, -1, 0] = 500.0  # a one-hot row
    if mask_kind == "causal":
        mask = causal_mask(rows, width, query_start)
    elif mask_kind == "padding":
        lengths = torch.tensor([width, width - 6])
        mask = torch.where(torch.arange(width)[None, :] < lengths[:, None], 0.0, MIN)[:, None, None, :]
    else:
        mask = None
    scaling = 0.125
    reference = torch.softmax(raw * scaling + (0 if mask is None else mask), dim=-1)  # [b, h, r, c]

    pattern = raw.clone()
    reach = 2  # the band: weights on keys i − 2 … i + 2
    summary = torch.empty(kernel_calls.RowSummary.buffer_shape(batch, heads, rows, reach))
    assert kernel_calls.fused_softmax_(pattern, mask, scaling, query_start, summary)
    # torch's own numbers: the same exp, the same lanes and order of additions (one vector width: the
    # kernel is built for the CPU capability torch dispatches to, so its lanes are torch's)
    assert torch.equal(pattern, reference)

    # the summary against float64 hand computations from torch's pattern
    weights = reference.double()
    query = torch.arange(query_start, query_start + rows, dtype=torch.float64)[:, None]  # [r, 1]
    key = torch.arange(width, dtype=torch.float64)[None, :]  # [1, c]
    entropy = -(weights * torch.where(weights > 0, weights.log(), 0.0)).sum(-1)
    distance = (weights * (query - key).abs()).sum(-1)
    assert (summary[0].double() - weights.amax(-1)).abs().max() <= 1e-6
    assert (summary[1].double() - entropy).abs().max() <= 1e-5
    assert ((summary[2].double() - distance).abs() / distance.clamp(min=1)).max() <= 1e-5
    assert summary[1, 0, 0, 0] == pytest.approx(math.log(width) if mask_kind == "none" else summary[1, 0, 0, 0])
    assert summary[0, -1, -1, -1] == pytest.approx(1.0) and summary[1, -1, -1, -1] == pytest.approx(0.0, abs=1e-6)
    band = kernel_calls.RowSummary(summary).band  # [2·reach + 1, b, h, r]
    for offset in range(-reach, reach + 1):
        for row in range(rows):
            key_column = query_start + row - offset
            expected = pattern[..., row, key_column] if 0 <= key_column < width else torch.zeros(batch, heads)
            assert torch.equal(band[reach + offset, :, :, row], expected), (offset, row)  # read off the pattern
    with pytest.raises(ValueError, match="does not fit"):
        kernel_calls.fused_softmax_(raw.clone(), mask, scaling, query_start, torch.empty(3, batch, heads, rows))

    # asking for the summary does not change the pattern, not by one bit
    without = raw.clone()
    assert kernel_calls.fused_softmax_(without, mask, scaling, query_start, None)
    assert torch.equal(without, pattern)


def test_core_outputs_match_torch_ops_with_and_without_observers(loaded_kernel, monkeypatch):
    """attend with the kernel ≈ attend on torch's operations, whether observers read the pattern (blocks of whole
    rows) or nobody does (tiles of keys, attend_rows_): the two differ only in the rounding of their sums."""
    monkeypatch.setattr(core_attention, "BLOCK_ELEMENTS", 2 * 6 * 50 * 7)  # blocks of 7 queries
    generator = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, length, dim = 2, 6, 2, 50, 16
    query = torch.randn(batch, heads, length, dim, generator=generator)
    key = torch.randn(batch, kv_heads, length, dim, generator=generator)
    value = torch.randn(batch, kv_heads, length, dim, generator=generator)
    mask = causal_mask(length, length, 0).expand(batch, 1, length, length).clone()
    mask[1, :, :, 45:] = MIN  # the second example is padded to 45 tokens
    with torch.no_grad():
        fused = attend(query, key, value, mask=mask, context=AttentionContext(fused_softmax=True))
        default = attend(query, key, value, mask=mask)  # captures: torch's softmax unless the pass asks
        with kernel.kernel_suspended():
            plain = attend(query, key, value, mask=mask, context=AttentionContext(fused_softmax=True))
        accumulator = StatisticsAccumulator(causal=True)
        observed_calls = []

        class Counter:
            accepts_key_prefix = True
            accepts_summary = True

            def observe(self, site, pattern, query_start, summary=None):
                observed_calls.append(summary is not None)

        accumulator.begin_batch(
            EncodedBatch(
                inputs={"attention_mask": (mask[:, 0, -1] == 0).long()},
                tokens=[["t"] * 50, ["t"] * 45],
                special=[[False] * 50, [False] * 45],
                word_ids=[list(range(50)), list(range(45))],
            )
        )
        context = AttentionContext(observers=[accumulator, Counter()], fused_softmax=True)
        observed = attend(query, key, value, mask=mask, site=AttentionSite("self", 0), context=context)
    assert torch.equal(default, plain)  # without fused_softmax the loaded kernel is not used
    # the kernel's softmax is torch's bit for bit; its block products are BLAS calls per head and 16 rows
    # (attend_block_), whose sums may round differently from torch's batched product
    torch.testing.assert_close(fused, plain, rtol=0, atol=2e-6)
    torch.testing.assert_close(observed, fused, rtol=0, atol=2e-6)
    assert observed_calls and all(observed_calls)  # every block came with its row summary


@pytest.mark.parametrize(
    ("local_window", "block_elements"),
    [(2, 2**21), (0, 2**21), (3, 2**21), (2, 600)],  # band reach 2, 1 (for previous), 3; many blocks per layer
)
def test_statistics_with_the_kernel_equal_statistics_on_torch_ops(
    loaded_kernel, tiny_model_dirs, monkeypatch, local_window, block_elements
):
    """Every statistic, both model kinds (causal LLaMA, bidirectional BERT): the kernel's summary path ≈ torch's passes.

    The summary path keeps a layer's blocks and reduces them together; torch's path reduces block by block.
    """
    monkeypatch.setattr(core_attention, "BLOCK_ELEMENTS", block_elements)
    texts = ["the cat sat on the mat", "a much longer sentence about attention heads and what they do", "hi"]
    for name in ("llama", "bert"):
        loaded = load_model(str(tiny_model_dirs[name]), device="cpu")
        fused = compute_statistics(loaded, texts, progress=False, local_window=local_window)
        with kernel.kernel_suspended():
            plain = compute_statistics(loaded, texts, progress=False, local_window=local_window)
        for statistic in fused.names:
            difference = (fused.matrix(statistic) - plain.matrix(statistic)).abs().max()
            assert difference <= 1e-5, (name, statistic, float(difference))


def test_disabled_and_failed_builds_fall_back_to_torch(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # a cache of its own: nothing built there
    monkeypatch.setattr(kernel, "_state", "unloaded")
    monkeypatch.setattr(kernel, "_module", None)
    monkeypatch.setenv(kernel.KERNEL_VARIABLE, "0")
    assert not kernel.prepare_kernel()
    assert kernel.kernel_status()[0] == "disabled"

    monkeypatch.delenv(kernel.KERNEL_VARIABLE)
    monkeypatch.setattr(kernel, "_state", "unloaded")
    from torch.utils import cpp_extension

    attempts = []

    def broken_build(**kwargs):
        attempts.append(kwargs["name"])
        raise RuntimeError("Error building extension 'attnviz_softmax_rows'")

    monkeypatch.setattr(cpp_extension, "load_inline", broken_build)
    with pytest.warns(UserWarning, match=r"kernel is unavailable: the build failed .*Error building extension"):
        assert not kernel.prepare_kernel()
    state, why, _ = kernel.kernel_status()
    assert state == "unavailable" and "Error building extension" in why and len(attempts) == 1
    # a later process (state reset) remembers the failure on disk and does not try again
    monkeypatch.setattr(kernel, "_state", "unloaded")
    assert not kernel.prepare_kernel()
    assert len(attempts) == 1 and "not tried again" in kernel.kernel_status()[1]
    # the core still computes attention, on torch's operations
    query = torch.randn(1, 2, 5, 8)
    with torch.no_grad():
        output = attend(query, query, query)
    expected = torch.softmax(query @ query.transpose(2, 3) / math.sqrt(8), -1) @ query
    assert (output - expected.transpose(1, 2)).abs().max() <= 1e-6


def test_the_avx2_build_gives_torchs_softmax_too(loaded_kernel):
    """This machine runs the AVX-512 lanes; CPUs with AVX2 only run the 8-lane build of the same routine."""
    from torch.utils import cpp_extension

    flags = kernel._compiler_flags("AVX2")
    assert "-mavx512f" not in flags
    avx2 = cpp_extension.load_inline(
        name="attnviz_softmax_rows_avx2_test",
        cpp_sources=[kernel._source()],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
    )
    generator = torch.Generator().manual_seed(3)
    rows, width, query_start = 16, 83, 67  # 83 = 10 vectors of 8 and a tail of 3
    raw = torch.randn(2, 3, rows, width, generator=generator) * 12
    mask = causal_mask(rows, width, query_start)
    reference = torch.softmax(raw * 0.125 + mask, dim=-1).double()
    pattern, summary = raw.clone(), torch.empty(kernel_calls.RowSummary.buffer_shape(2, 3, rows, 1))
    avx2.softmax_rows_(pattern, mask, 0.125, query_start, summary, 1)
    # torch here adds 16 lanes, the AVX2 build 8 (as torch itself does on an AVX2 CPU): equal to rounding
    assert (pattern - reference).abs().max() <= 1e-6
    query = torch.arange(query_start, query_start + rows, dtype=torch.float64)[:, None]
    distance = (reference * (query - torch.arange(width)[None, :]).abs()).sum(-1)
    entropy = -(reference * torch.where(reference > 0, reference.log(), 0.0)).sum(-1)
    assert (summary[0].double() - reference.amax(-1)).abs().max() <= 1e-6
    assert (summary[1].double() - entropy).abs().max() <= 1e-5
    assert ((summary[2].double() - distance).abs() / distance).max() <= 1e-5
    rows_at = torch.arange(rows)
    diagonal, previous = pattern[..., rows_at, query_start + rows_at], pattern[..., rows_at, query_start + rows_at - 1]
    assert torch.equal(summary[4], diagonal) and torch.equal(summary[5], previous) and not summary[3].any()


@pytest.mark.parametrize(("threads", "rows_per_task"), [(1, 64), (2, 16), (2, 64)])
def test_a_whole_block_in_one_call_equals_its_steps(loaded_kernel, monkeypatch, threads, rows_per_task):
    """attend_block_: Q·Kᵀ, softmax with summary and pattern·V per task of a head's rows ≈ the same steps by torch."""
    monkeypatch.setattr(kernel_calls, "ROWS_PER_TASK", rows_per_task)  # 16: three tasks a head, the last one partial
    if not kernel_calls.block_kernel_applies(torch.zeros(1, 1, 1, 1), torch.zeros(1), None):
        pytest.skip("no BLAS sgemm_ found in this torch")
    generator = torch.Generator().manual_seed(7)
    batch, heads, kv_heads, length, dim, start, rows, width = 2, 6, 2, 90, 16, 37, 35, 80
    query = torch.randn(batch, length, heads, dim, generator=generator).transpose(1, 2)  # [b, h, q, d], strided
    key = torch.randn(batch, kv_heads, length, dim, generator=generator)
    value = torch.randn(batch, kv_heads, length, dim, generator=generator)
    mask = causal_mask(rows, width, start).expand(batch, 1, rows, width).clone()
    mask[1, :, :, 60:] = MIN  # the second example is padded to 60 keys
    scaling, reach = dim**-0.5, 2
    scores = torch.empty(batch, heads, rows, width)
    summary = torch.empty(kernel_calls.RowSummary.buffer_shape(batch, heads, rows, reach))
    output = torch.full((batch, length, heads, dim), 7.0)  # rows outside the block stay as they were
    key_weights = torch.rand(batch, heads, length, generator=generator)  # [b, h, k], e.g. value norms
    weighted = torch.empty(batch, heads, rows)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernel_calls.attend_block_(
            query, key, value, scores, mask, scaling, start, summary, output, key_weights, weighted
        )
    finally:
        torch.set_num_threads(before)

    repeated_key = key.repeat_interleave(heads // kv_heads, 1)[:, :, :width]  # [b, h, c, d]
    raw = query[:, :, start : start + rows] @ repeated_key.transpose(2, 3)  # [b, h, r, c]
    expected_pattern = raw.clone()
    expected_summary = torch.empty_like(summary)
    assert kernel_calls.fused_softmax_(expected_pattern, mask, scaling, start, expected_summary)
    torch.testing.assert_close(scores, expected_pattern, rtol=0, atol=1e-6)
    torch.testing.assert_close(summary, expected_summary, rtol=1e-5, atol=1e-5)
    reference = torch.softmax(raw * scaling + mask, -1) @ value.repeat_interleave(heads // kv_heads, 1)[:, :, :width]
    torch.testing.assert_close(output[:, start : start + rows], reference.transpose(1, 2), rtol=0, atol=2e-6)
    assert (output[:, :start] == 7.0).all() and (output[:, start + rows :] == 7.0).all()
    by_hand = torch.einsum("bhqk,bhk->bhq", expected_pattern.double(), key_weights[..., :width].double())
    torch.testing.assert_close(weighted.double(), by_hand, rtol=1e-5, atol=1e-6)


def test_carriers_take_the_kernels_weighted_sums_and_equal_their_own(loaded_kernel, tiny_model_dirs, monkeypatch):
    """Issue 32's carriers: Σ_j α_ij ‖f(x_j)‖ summed in the kernel's rows = the observer's own pass over the block."""
    from attnviz.core import blocks
    from attnviz.stats.carriers import CARRIER_FIELDS, TokenCarriers

    received = []
    observe = TokenCarriers.observe

    def spy(self, site, pattern, query_start, weighted=None, **extras):
        received.append(weighted is not None)
        return observe(self, site, pattern, query_start, weighted=weighted, **extras)

    monkeypatch.setattr(TokenCarriers, "observe", spy)
    texts = ["the cat sat on the mat", "a much longer sentence about attention heads and what they do", "hi"]
    loaded = load_model(str(tiny_model_dirs["llama"]), device="cpu")  # grouped-query heads
    in_kernel = compute_statistics(loaded, texts, progress=False)
    assert received and all(received)
    received.clear()
    monkeypatch.setattr(blocks, "block_kernel_applies", lambda *arguments: False)  # the batched path
    own_pass = compute_statistics(loaded, texts, progress=False)
    assert received and not any(received)
    for field in CARRIER_FIELDS:
        torch.testing.assert_close(
            in_kernel.carriers.matrix(field), own_pass.carriers.matrix(field), rtol=1e-5, atol=1e-6
        )
