"""The GPU tile kernel (attnviz.core.triton_rows), run on CPU tensors by Triton's interpreter.

Each case compares :func:`attend_rows_triton` with attention computed in float64 from the definition (and, where
the CPU kernel is loaded, with :func:`attnviz.core.kernel_calls.attend_rows_`): outputs, every field of the row
summary (max weight, entropy, distance, the band, the key columns) and the carriers' weighted sums, for grouped
heads, a value size other than the query size, partial tiles, additive masks, and the mask described without a
tensor (causal, a sliding window, padding). Float32 products are rounded as a GPU's tensor cores would round them
(``tf32_products``). With ``TRITON_INTERPRET=0`` on a machine with a CUDA GPU the same cases run the compiled kernel
on the GPU (``TRITON_INTERPRET=0 pytest tests/unit/test_core_triton.py``).
"""

from __future__ import annotations

import os

# Triton reads it when it is imported (tests/conftest.py sets it first): every kernel of this process then runs on CPU
# tensors (attnviz runs Triton only on CUDA devices, so nothing else in the process changes)
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")

from attnviz.core.kernel_calls import RowSummary
from attnviz.core.key_range import KeyLayout
from attnviz.core.triton_rows import LaunchConfig, attend_rows_triton, interpreting

if not interpreting() and not torch.cuda.is_available():
    pytest.skip("TRITON_INTERPRET=0 and no CUDA GPU: nothing can run the kernel", allow_module_level=True)
#: where the kernel runs: CPU tensors through the interpreter, or the GPU
DEVICE = "cpu" if interpreting() else "cuda"
SMALL_TILES = LaunchConfig(block_m=32, block_n=16)
TINY_TILES = LaunchConfig(block_m=16, block_n=16)

LOWEST = torch.finfo(torch.float32).min
BATCH, HEADS, KV_HEADS, QUERIES, KEYS, QK_DIM, V_DIM = 2, 4, 2, 37, 37, 24, 20
REACH, COLUMNS = 1, (0, 5)


@pytest.fixture(scope="module")
def inputs():
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(BATCH, HEADS, QUERIES, QK_DIM, generator=generator) * 2  # peaked rows
    key = torch.randn(BATCH, KV_HEADS, KEYS, QK_DIM, generator=generator) * 2
    value = torch.randn(BATCH, KV_HEADS, KEYS, V_DIM, generator=generator)
    key_weights = torch.rand(BATCH, HEADS, KEYS, generator=generator)
    return query, key, value, key_weights


def reference(query, key, value, key_weights, additive):
    """float64 attention and its row statistics from the definition: ``additive`` ``[b|1, 1, q, k]``."""
    repeat = HEADS // KV_HEADS
    keys, values = (tensor.double().repeat_interleave(repeat, 1) for tensor in (key, value))
    pattern = torch.softmax(query.double() @ keys.transpose(-1, -2) * QK_DIM**-0.5 + additive, -1)  # [b, h, q, k]
    rows, cols = torch.arange(QUERIES)[:, None], torch.arange(KEYS)[None, :]
    band = []
    for offset in range(-REACH, REACH + 1):
        column = torch.arange(QUERIES) - offset
        inside = (column >= 0) & (column < KEYS)
        picked = pattern.gather(-1, column.clamp(0, KEYS - 1).expand(BATCH, HEADS, QUERIES)[..., None])[..., 0]
        band.append(torch.where(inside, picked, 0.0))
    return {
        "output": (pattern @ values).transpose(1, 2),
        "max_weight": pattern.max(-1).values,
        "entropy": -(pattern * pattern.clamp_min(1e-300).log()).sum(-1),
        "distance": (pattern * (rows - cols).abs()).sum(-1),
        "band": torch.stack(band),
        "columns": torch.stack([pattern[..., column] for column in COLUMNS]),
        "weighted": (pattern * key_weights.double()[:, :, None, :]).sum(-1),
    }


def on_device(**tensors):
    return {name: None if tensor is None else tensor.to(DEVICE) for name, tensor in tensors.items()}


def run(query, key, value, key_weights, dtype=torch.float32, launch=SMALL_TILES, **where):
    output = torch.empty(BATCH, QUERIES, HEADS, V_DIM, dtype=dtype, device=DEVICE)
    shape = RowSummary.buffer_shape(BATCH, HEADS, QUERIES, REACH, len(COLUMNS))
    summary = RowSummary(torch.zeros(shape, device=DEVICE), COLUMNS)
    weighted = torch.zeros(BATCH, HEADS, QUERIES, device=DEVICE)
    cast = [tensor.to(DEVICE, dtype) for tensor in (query, key, value)]
    where = {name: value.to(DEVICE) if isinstance(value, torch.Tensor) else value for name, value in where.items()}
    attend_rows_triton(
        *cast, QK_DIM**-0.5, output, summary=summary, key_weights=key_weights.to(DEVICE), weighted=weighted,
        launch=launch, **where,
    )  # fmt: skip
    summary = RowSummary(summary.values.cpu(), COLUMNS)
    return {
        "output": output.double().cpu(),
        "max_weight": summary.max_weight,
        "entropy": summary.entropy,
        "distance": summary.distance,
        "band": summary.band,
        "columns": torch.stack([summary.column(column) for column in COLUMNS]),
        "weighted": weighted.cpu(),
    }


def causal(window: int | None = None) -> torch.Tensor:
    hidden = torch.ones(QUERIES, KEYS, dtype=torch.bool).triu(1)
    if window is not None:
        hidden |= torch.ones(QUERIES, KEYS, dtype=torch.bool).tril(-window)
    return torch.where(hidden, float("-inf"), 0.0).double()


def assert_close(computed, expected, rows=slice(None), tolerance=3e-5):
    for name, value in expected.items():
        got = computed[name]
        if name == "output":
            difference = (got[:, rows] - value[:, rows]).abs().max()
        else:
            difference = (got.double()[..., rows] - value[..., rows]).abs().max()
        scale = 10.0 if name == "distance" else 1.0  # distances are sums of |i − j| up to the length
        assert difference <= tolerance * scale, (name, float(difference))


def test_causal_grouped_heads_with_every_statistic(inputs):
    assert_close(run(*inputs, causal=True), reference(*inputs, causal()))


def test_an_additive_mask_with_left_padding(inputs):
    mask = torch.zeros(BATCH, 1, QUERIES, KEYS)
    mask[1, :, :, :5] = LOWEST  # the second sequence's first five keys are padding
    mask = mask + torch.where(torch.ones(QUERIES, KEYS, dtype=torch.bool).triu(1), LOWEST, 0.0)
    # rows that see no key at all (padding queries) are uniform, as torch's softmax makes them
    assert_close(run(*inputs, mask=mask), reference(*inputs, mask.double()))


@pytest.mark.parametrize("window", [None, 6], ids=["causal", "window"])
def test_padding_and_causality_described_without_a_tensor_equal_the_mask(inputs, window):
    # the first sequence padded on the right, the second on the left: the second's first five queries see no key,
    # and with the window so do the first's last two (keys 30 … 35 and 31 … 36 are all padding)
    layout = KeyLayout(window, torch.tensor([0, 5]), torch.tensor([30, KEYS]))
    mask = layout.additive_rows(0, QUERIES, KEYS, torch.float32, torch.device("cpu")).double()  # eager's mask
    computed = run(*inputs, causal=True, window=window, key_start=layout.key_start, key_stop=layout.key_stop)
    # every row, those that see no key uniform over every key as softmax makes them under eager's mask
    assert_close(computed, reference(*inputs, mask))
    assert torch.allclose(computed["max_weight"][1, :, :5], torch.tensor(1 / KEYS, dtype=torch.float32))


ENCODER_LAYOUTS = {
    # keys less than 6 positions away on either side (ModernBERT's local attention), the first sequence padded
    "two-sided window and padding": KeyLayout(6, torch.tensor([0, 0]), torch.tensor([30, KEYS]), causal=False),
    # padding on both sides of the first sequence; the second holds no token: each of its rows weighs every key alike
    "padding": KeyLayout(None, torch.tensor([5, 0]), torch.tensor([30, 0]), causal=False),
    "two-sided window": KeyLayout(6, causal=False),
}


@pytest.mark.parametrize("name", ENCODER_LAYOUTS)
def test_an_encoders_padding_and_two_sided_window_without_a_tensor(inputs, name):
    layout = ENCODER_LAYOUTS[name]
    mask = layout.additive_rows(0, QUERIES, KEYS, torch.float32, torch.device("cpu")).double()  # eager's mask
    computed = run(*inputs, window=layout.window, key_start=layout.key_start, key_stop=layout.key_stop)
    assert_close(computed, reference(*inputs, mask))


def test_a_sliding_window(inputs):
    assert_close(run(*inputs, causal=True, window=8), reference(*inputs, causal(window=8)))


def test_no_mask_at_all(inputs):
    assert_close(run(*inputs), reference(*inputs, torch.zeros(1, 1, QUERIES, KEYS, dtype=torch.float64)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_half_precision_inputs_give_float32_statistics(inputs, dtype):
    rounded = [tensor.to(dtype).float() for tensor in inputs[:3]] + [inputs[3]]
    expected = reference(*rounded, causal())
    computed = run(*inputs, dtype=dtype, causal=True)
    assert computed["max_weight"].dtype == torch.float32
    output_tolerance = {torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]  # the output is stored in the input's dtype
    assert (computed.pop("output") - expected.pop("output")).abs().max() <= output_tolerance
    assert_close(computed, expected, tolerance=1e-4)


@pytest.fixture(autouse=True)
def tf32_products(monkeypatch):
    """In every test run by the interpreter, float32 products rounded as a GPU's tensor cores round them
    (:mod:`tensor_cores`); yields the arithmetic each precision is given, None on a GPU, whose hardware rounds."""
    if not interpreting():
        yield None
        return
    from tensor_cores import round_as_tensor_cores

    yield round_as_tensor_cores(monkeypatch)


def test_float32_through_three_tf32_products(inputs, tf32_products):
    """Float32 inputs multiplied as three TF32 tensor-core products (the default where Triton sums them precisely):
    every output and statistic within 3e-5 of float64, what "float32's precision" means here. In the interpreter,
    with the tensor cores' rounding emulated, one TF32 product alone lies outside that tolerance, and so does the
    default launch when its products are made single ones; full precision stays inside."""
    import triton

    from attnviz.core.triton_rows import float32_precision, precise_tf32x3

    expected = reference(*inputs, causal())
    three = LaunchConfig(block_m=32, block_n=16, float32_products="tf32x3")
    assert_close(run(*inputs, launch=three, causal=True), expected)
    assert_close(run(*inputs, causal=True), expected)  # the default launch, whichever its products
    assert float32_precision() == ("tf32x3" if precise_tf32x3(triton.__version__) else "ieee")
    if tf32_products is None:  # on a GPU: the hardware rounds, nothing is emulated
        return
    tf32_products["TF32x3"] = "TF32"  # one product
    with pytest.raises(AssertionError):
        assert_close(run(*inputs, launch=three, causal=True), expected)
    if float32_precision() == "tf32x3":
        with pytest.raises(AssertionError):
            assert_close(run(*inputs, causal=True), expected)
    full = LaunchConfig(block_m=32, block_n=16, float32_products="ieee")
    assert_close(run(*inputs, launch=full, causal=True), expected)


@pytest.mark.parametrize(
    ("version", "precise"),
    [("3.0.0", False), ("3.1.0", False), ("3.2.0", True), ("3.7.1", True), ("3.10.0", True), ("4.0.0+git1a2b", True)],
)
def test_tf32x3_is_the_default_from_the_triton_that_sums_its_remainders_apart(version, precise):
    """Triton 3.1 and earlier add TF32×3's remainder products into the running sum before the main product (seen in
    their compiled code); 3.2 and later sum them apart."""
    from attnviz.core.triton_rows import precise_tf32x3

    assert precise_tf32x3(version) is precise


def test_equals_the_cpu_tile_kernel(inputs):
    from attnviz.core import kernel
    from attnviz.core.kernel_calls import attend_rows_

    if not kernel.prepare_kernel():
        pytest.skip(f"the CPU kernel is not available here: {kernel.kernel_status()}")
    query, key, _, key_weights = inputs
    value = key.flip(-2)  # the CPU kernel takes values as wide as the keys
    mask = torch.where(torch.ones(QUERIES, KEYS, dtype=torch.bool).triu(1), LOWEST, 0.0)[None, None]
    shape = RowSummary.buffer_shape(BATCH, HEADS, QUERIES, REACH, len(COLUMNS))
    output, summary = torch.empty(BATCH, QUERIES, HEADS, QK_DIM), RowSummary(torch.zeros(shape), COLUMNS)
    weighted = torch.zeros(BATCH, HEADS, QUERIES)
    stops = torch.tensor([KEYS] * -(-QUERIES // 128), dtype=torch.int64)
    attend_rows_(query, key, value, mask, QK_DIM**-0.5, stops, summary, output, key_weights, weighted)
    triton_output = torch.empty_like(output, device=DEVICE)
    triton_summary = RowSummary(torch.zeros(shape, device=DEVICE), COLUMNS)
    triton_weighted = torch.zeros_like(weighted, device=DEVICE)
    moved = on_device(query=query, key=key, value=value, mask=mask, key_weights=key_weights)
    attend_rows_triton(
        moved["query"], moved["key"], moved["value"], QK_DIM**-0.5, triton_output, mask=moved["mask"],
        summary=triton_summary, key_weights=moved["key_weights"], weighted=triton_weighted, launch=TINY_TILES,
    )  # fmt: skip
    triton_summary = RowSummary(triton_summary.values.cpu(), COLUMNS)
    computed = {"output": triton_output.double().cpu(), "max_weight": triton_summary.max_weight}
    computed |= {"entropy": triton_summary.entropy, "weighted": triton_weighted.cpu()}
    # float32 products err in proportion to the values they sum (outputs here reach ~7): 2e-6 of the largest
    assert (computed["output"] - output.double()).abs().max() <= 2e-6 * output.abs().max().clamp_min(1.0)
    assert (computed["max_weight"] - summary.max_weight).abs().max() <= 2e-6
    assert (computed["entropy"] - summary.entropy).abs().max() <= 1e-5
    assert (computed["weighted"] - weighted).abs().max() <= 2e-6


def test_attention_sinks_equal_the_cpu_tile_kernel(inputs):
    """Each head's learned sink (gpt-oss) as one more softmax term without a value, values narrower than queries:
    the Triton pass against the CPU kernel's (tested against float64 in test_core_tiles), sink share included."""
    from attnviz.core import kernel
    from attnviz.core.kernel_calls import attend_rows_

    if not kernel.prepare_kernel():
        pytest.skip(f"the CPU kernel is not available here: {kernel.kernel_status()}")
    query, key, value, key_weights = inputs
    sinks = torch.tensor([-2.0, 0.0, 3.0, 40.0])  # 40: the sink outweighs every key of the last head
    mask = torch.zeros(BATCH, 1, QUERIES, KEYS)
    mask[1, :, :, :5] = LOWEST  # padding: the second sequence's first rows see no key, their weight all on the sink
    mask = mask + torch.where(torch.ones(QUERIES, KEYS, dtype=torch.bool).triu(1), LOWEST, 0.0)
    shape = RowSummary.buffer_shape(BATCH, HEADS, QUERIES, REACH, len(COLUMNS))
    results = []
    for triton in (False, True):
        output, summary = torch.empty(BATCH, QUERIES, HEADS, V_DIM), RowSummary(torch.zeros(shape), COLUMNS)
        weighted, share = torch.zeros(BATCH, HEADS, QUERIES), torch.full((BATCH, HEADS, QUERIES), float("nan"))
        if triton:
            moved = on_device(query=query, key=key, value=value, mask=mask, key_weights=key_weights, sinks=sinks)
            output, weighted, share = output.to(DEVICE), weighted.to(DEVICE), share.to(DEVICE)
            summary = RowSummary(summary.values.to(DEVICE), COLUMNS)
            attend_rows_triton(
                moved["query"], moved["key"], moved["value"], QK_DIM**-0.5, output, mask=moved["mask"],
                summary=summary, key_weights=moved["key_weights"], weighted=weighted, sinks=moved["sinks"],
                sink_share=share, launch=TINY_TILES,
            )  # fmt: skip
            output, weighted, share = output.cpu(), weighted.cpu(), share.cpu()
            summary = RowSummary(summary.values.cpu(), COLUMNS)
        else:
            stops = torch.tensor([KEYS] * -(-QUERIES // 128), dtype=torch.int64)
            attend_rows_(
                query, key, value, mask, QK_DIM**-0.5, stops, summary, output, key_weights, weighted, sinks, share
            )
        results.append((output.double(), summary.values.double(), weighted.double(), share.double()))
    (output, fields, weighted, share), (triton_output, triton_fields, triton_weighted, triton_share) = results
    assert (triton_output - output).abs().max() <= 2e-6 * output.abs().max().clamp_min(1.0)  # as above
    assert (triton_weighted - weighted).abs().max() <= 2e-6
    assert (triton_fields[2] - fields[2]).abs().max() <= 1e-4  # mean distance, sums of |i − j| up to 36
    assert (
        triton_fields[[0, 1, *range(3, fields.shape[0])]] - fields[[0, 1, *range(3, fields.shape[0])]]
    ).abs().max() <= 1e-5
    assert (triton_share - share).abs().max() <= 2e-6
    assert share[:, 3].min() > 0.99 and share[1, :, :5].min() > 0.999 and share[0, 0].max() < 0.5


def band_weights(pattern: torch.Tensor, offset: int) -> torch.Tensor:
    """``pattern[..., i, i − offset]`` ``[b, h, q]``, 0 where that key does not exist."""
    queries, keys = pattern.shape[-2:]
    column = torch.arange(queries) - offset
    inside = (column >= 0) & (column < keys)
    picked = pattern.gather(-1, column.clamp(0, keys - 1).expand(*pattern.shape[:-1])[..., None])[..., 0]
    return torch.where(inside, picked, 0.0)


@pytest.mark.parametrize("past", [0, 19], ids=["same-length", "past-keys"])
@pytest.mark.parametrize("sinks", [False, True], ids=["no-sinks", "sinks"])
def test_long_causal_rows_through_interior_tiles(past, sinks):
    """A causal pass of 100 queries over 100 (+19 past) keys in 16-wide tiles, no mask tensor: most tiles are
    interior (every key visible to every query of the block, the distance from the cheaper formula), the band and the
    columns cross tile boundaries; against float64 from the definition, each head's sink as one more softmax term."""
    generator = torch.Generator().manual_seed(1)
    queries, keys, heads, kv_heads, dim = 100, 100 + past, 4, 2, 32
    query = torch.randn(1, heads, queries, dim, generator=generator) * 2
    key = torch.randn(1, kv_heads, keys, dim, generator=generator) * 2
    # [b, k, kvh, d] seen as [b, kvh, k, d], as a model's value projection reaches attention: read through strides
    value = torch.randn(1, keys, kv_heads, dim, generator=generator).transpose(1, 2)
    key_weights = torch.rand(1, heads, keys, generator=generator)
    sink_logits = torch.tensor([-1.0, 0.5, 2.0, 4.0]) if sinks else None
    columns = (0, 17, 40)
    # float64 reference: [b, h, q, k (+ sink)]
    logits = query.double() @ key.double().repeat_interleave(2, 1).transpose(-1, -2) * dim**-0.5
    hidden = torch.ones(queries, keys, dtype=torch.bool).triu(1 + past)
    logits = logits.masked_fill(hidden, float("-inf"))
    if sinks:
        logits = torch.cat([logits, sink_logits.double()[None, :, None, None].expand(1, heads, queries, 1)], -1)
    weights = torch.softmax(logits, -1)
    share = weights[..., -1] if sinks else None
    pattern = weights[..., :keys]
    rows, cols = torch.arange(queries)[:, None], torch.arange(keys)[None, :]
    full = weights.clamp_min(1e-300)
    expected = {
        "output": (pattern @ value.double().repeat_interleave(2, 1)).transpose(1, 2),
        "max_weight": pattern.max(-1).values,
        "entropy": -(weights * full.log()).sum(-1),
        "distance": (pattern * (rows - cols).abs()).sum(-1),
        "columns": torch.stack([pattern[..., column] for column in columns]),
        "weighted": (pattern * key_weights.double()[:, :, None, :]).sum(-1),
        "band": torch.stack([band_weights(pattern, offset) for offset in (-1, 0, 1)]),
    }
    output = torch.empty(1, queries, heads, dim, device=DEVICE)
    summary = RowSummary(torch.zeros(RowSummary.buffer_shape(1, heads, queries, 1, 3), device=DEVICE), columns)
    weighted = torch.zeros(1, heads, queries, device=DEVICE)
    sink_share = torch.zeros(1, heads, queries, device=DEVICE)
    attend_rows_triton(
        query.to(DEVICE), key.to(DEVICE), value.to(DEVICE), dim**-0.5, output, causal=True, summary=summary,
        key_weights=key_weights.to(DEVICE), weighted=weighted,
        sinks=sink_logits.to(DEVICE) if sinks else None, sink_share=sink_share if sinks else None,
        launch=LaunchConfig(block_m=16, block_n=16),
    )  # fmt: skip
    summary = RowSummary(summary.values.cpu(), columns)
    computed = {
        "output": output.double().cpu(),
        "max_weight": summary.max_weight,
        "entropy": summary.entropy,
        "distance": summary.distance,
        "columns": torch.stack([summary.column(column) for column in columns]),
        "weighted": weighted.cpu(),
        "band": summary.band,
    }
    for name, value_expected in expected.items():
        scale = 100.0 if name == "distance" else 1.0
        difference = float((computed[name].double() - value_expected).abs().max())
        assert difference <= 3e-5 * scale, (name, difference)
    if sinks:
        assert float((sink_share.cpu().double() - share).abs().max()) <= 2e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_output_alone_through_interior_tiles(dtype):
    """No summary, no carriers (the kernel a plain forward runs): heads that fill their block (no mask on the head
    dimension) and a causal pass long enough for interior tiles, against float64 from the definition."""
    generator = torch.Generator().manual_seed(2)
    queries, heads, kv_heads, dim = 90, 3, 1, 16
    query, key, value = (
        torch.randn(1, count, queries, dim, generator=generator) * 2 for count in (heads, kv_heads, kv_heads)
    )  # [b, h|kvh, q, d]
    query, key, value = (tensor.to(dtype).float() for tensor in (query, key, value))  # the rounded inputs
    logits = query.double() @ key.double().transpose(-1, -2) * dim**-0.5  # [1, h, q, k] (one key/value head)
    logits = logits.masked_fill(torch.ones(queries, queries, dtype=torch.bool).triu(1), float("-inf"))
    expected = (torch.softmax(logits, -1) @ value.double()).transpose(1, 2)  # [1, q, h, d]
    output = torch.empty(1, queries, heads, dim, dtype=dtype, device=DEVICE)
    moved = [tensor.to(DEVICE, dtype) for tensor in (query, key, value)]
    attend_rows_triton(*moved, dim**-0.5, output, causal=True, launch=TINY_TILES)
    tolerance = {torch.float32: 2e-5, torch.bfloat16: 4e-2}[dtype]  # outputs up to ~6; stored in the input dtype
    assert float((output.double().cpu() - expected).abs().max()) <= tolerance
