"""Sites reduced together at the end of each batch (what a GPU pass does) give the statistics reduced site by site.

On a GPU the accumulator sets each finished site aside and reduces the batch's sites side by side along the heads
(``attnviz.stats.accumulator.DEFERRED_DEVICES``); here the CPU is made to do the same, and every statistic, its
standard deviation and the by-position means must equal the site-by-site reduction to float32 rounding (the
per-query values are float32, their layout in memory differs).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import TEXTS

import attnviz
from attnviz.stats import accumulator
from attnviz.stats.definitions import STATISTIC_NAMES


@pytest.mark.parametrize("budget", [accumulator.DEFERRED_BYTES, 1], ids=["whole-batch", "each-site-at-once"])
@pytest.mark.parametrize("family", ["llama", "bert", "bart"])
def test_sites_reduced_together_equal_sites_reduced_one_by_one(tiny_model_dirs, monkeypatch, family, budget):
    loaded = attnviz.load_model(str(tiny_model_dirs[family]), device="cpu")
    texts = [*TEXTS[:3], " ".join(TEXTS[3:6])]  # padding, two batches of two
    monkeypatch.setattr(accumulator, "DEFERRED_BYTES", budget)  # 1: past the budget at every site
    results = []
    for devices in (("cuda",), ("cuda", "cpu")):
        monkeypatch.setattr(accumulator, "DEFERRED_DEVICES", devices)
        results.append(attnviz.compute_statistics(loaded, texts, batch_size=2, by_position=True, progress=False))
    one_by_one, together = results
    for stack in one_by_one.stacks:
        for name in STATISTIC_NAMES:
            for field in ("matrix", "std_matrix"):
                expected, got = getattr(one_by_one, field)(name, stack), getattr(together, field)(name, stack)
                assert torch.equal(expected.isnan(), got.isnan()), (stack, name)
                assert float((expected - got).nan_to_num().abs().max()) <= 1e-6, (
                    stack,
                    name,
                    field,
                    float((expected - got).nan_to_num().abs().max()),
                )
    assert one_by_one.by_position is not None and together.by_position is not None
    assert one_by_one.by_position.sites.keys() == together.by_position.sites.keys()
    for site, means in one_by_one.by_position.sites.items():  # [M, h, B]
        assert torch.equal(means.isnan(), together.by_position.sites[site].isnan()), site
        assert float((means - together.by_position.sites[site]).nan_to_num().abs().max()) <= 1e-6, site
