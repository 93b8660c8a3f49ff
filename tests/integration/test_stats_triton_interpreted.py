"""Whole statistics passes through the GPU's tile kernel, without a GPU.

Triton's interpreter runs :func:`attnviz.core.triton_rows.attend_rows_triton` at every layer on the CPU tensors that
the core hands its CPU tile kernel: the same mask, causality, sinks, chosen key columns and carriers' key weights.
Its float32 products are rounded as a GPU's tensor cores round them (:mod:`tensor_cores`: three TF32 products, the
default). The statistics and carriers must equal the CPU kernel's pass to the tolerance that
tests/integration/test_stats_gpu.py holds a GPU to, for the same families (grouped heads, learned sinks with
sliding windows, values narrower than queries): the whole-model check of the kernel's arithmetic where CI has no GPU.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import TEXTS

import attnviz
from attnviz.core import blocks, kernel
from attnviz.core.triton_rows import LaunchConfig, attend_rows_triton, interpreting
from attnviz.stats.definitions import STATISTIC_NAMES

pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")

#: tiles of 16 queries and 16 keys: at 128 tokens most key tiles are interior (every key visible to every query of
#: the block), the band and the chosen columns cross tile boundaries, as at thousands of tokens with the GPU's launch
SMALL_TILES = LaunchConfig(block_m=16, block_n=16)
FAMILIES = ("qwen2", "gpt_oss", "deepseek_v3")
#: as tests/integration/test_stats_gpu.py: float32 on both sides, distances up to ~100
TOLERANCE = {"mean_distance": 2e-4}


def _through_triton(
    query, key, value, mask, scaling, stops, summary, output, key_weights, weighted, sinks, share, layout, starts
):  # fmt: skip
    """The CPU kernel's call (:func:`attnviz.core.kernel_calls.attend_rows_`, the same arguments, ``stops`` and
    ``starts`` unused: the GPU's kernel finds each block's keys itself) made by the GPU's kernel instead."""
    attend_rows_triton(
        query, key, value, scaling, output, mask=mask, summary=summary, key_weights=key_weights, weighted=weighted,
        sinks=sinks, sink_share=share, causal=layout is not None and layout.causal, window=layout and layout.window,
        key_start=layout and layout.key_start, key_stop=layout and layout.key_stop, launch=SMALL_TILES,
    )  # fmt: skip
    _through_triton.calls += 1


@pytest.mark.parametrize("family", FAMILIES)
def test_a_pass_through_the_gpu_kernel_equals_the_cpu_kernel(tmp_path, monkeypatch, family):
    from tensor_cores import round_as_tensor_cores
    from zoo import build

    if not interpreting():
        pytest.skip("TRITON_INTERPRET=0: tests/integration/test_stats_gpu.py runs the kernel on a GPU")
    if not kernel.prepare_kernel():
        pytest.skip(f"the CPU kernel is not available here: {kernel.kernel_status()}")
    loaded = attnviz.load_model(str(build(family, tmp_path / family)), device="cpu", dtype="float32")
    # a batch of ~100 tokens alone (causal, interior tiles) and one of two short texts (padding, described by key
    # ranges; with gpt-oss's window of 4 the shorter text's last queries see no key)
    texts = [" ".join(TEXTS[:7]), TEXTS[0], TEXTS[1]]
    plan = {"batch_size": 2, "max_tokens_per_batch": 110}
    reference = attnviz.compute_statistics(loaded, texts, progress=False, **plan)
    round_as_tensor_cores(monkeypatch)
    _through_triton.calls = 0
    monkeypatch.setattr(blocks, "attend_rows_", _through_triton)
    computed = attnviz.compute_statistics(loaded, texts, progress=False, **plan)
    assert _through_triton.calls >= len(loaded.layout())  # every layer went through the GPU's kernel
    for name in STATISTIC_NAMES:
        expected, got = reference.matrix(name), computed.matrix(name)
        assert torch.equal(expected.isnan(), got.isnan()), name
        difference = float((expected - got).nan_to_num().abs().max())
        assert difference <= TOLERANCE.get(name, 1e-5), (family, name, difference)
    assert reference.carriers is not None and computed.carriers is not None
    for site, means in reference.carriers.means.items():
        assert torch.allclose(computed.carriers.means[site], means, rtol=1e-5, atol=1e-6, equal_nan=True), site
    if family == "gpt_oss":
        assert float(computed.matrix("sink_share").nan_to_num().max()) > 0.05  # the sinks took weight
