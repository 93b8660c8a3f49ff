"""The statistics pass on a CUDA GPU, where every layer runs the Triton tile kernel, against the CPU's tile kernel.

Skipped without a CUDA GPU (CI has none; the kernel itself is checked on CPU tensors through Triton's interpreter
in tests/unit/test_core_triton.py). Each model is a tiny seeded one of the zoo (peaked attention): float32
statistics on the GPU must equal the CPU's to float32 rounding, over a batch of texts of different lengths (padding)
that spans several key tiles.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import TEXTS

import attnviz
from attnviz.stats.definitions import STATISTIC_NAMES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

#: grouped heads (qwen2), learned sinks with sliding-window layers (gpt_oss), values narrower than queries (deepseek_v3)
FAMILIES = ("qwen2", "gpt_oss", "deepseek_v3")
#: float32 on both devices: sums over up to ~100 keys, distances up to ~100
TOLERANCE = {"mean_distance": 2e-4}


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_statistics_on_the_gpu_equal_the_cpu(tmp_path, family):
    from zoo import build

    directory = build(family, tmp_path / family)
    texts = [TEXTS[0], " ".join(TEXTS[:7]), TEXTS[1]]  # ~16, ~100 and ~15 tokens: padding and several tiles
    results = {}
    for device in ("cpu", "cuda"):
        loaded = attnviz.load_model(str(directory), device=device, dtype="float32")
        results[device] = attnviz.compute_statistics(loaded, texts, progress=False)
    for name in STATISTIC_NAMES:
        cpu, gpu = results["cpu"].matrix(name), results["cuda"].matrix(name)
        assert torch.equal(cpu.isnan(), gpu.isnan()), name
        difference = float((cpu - gpu).nan_to_num().abs().max())
        assert difference <= TOLERANCE.get(name, 1e-5), (family, name, difference)
    if family == "gpt_oss":
        assert float(results["cuda"].matrix("sink_share").nan_to_num().max()) > 0.05  # the sinks took weight
