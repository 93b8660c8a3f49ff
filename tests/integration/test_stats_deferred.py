"""Sites reduced together at the end of each batch (what a GPU pass does) give the statistics reduced site by site.

On a GPU the accumulator sets each finished site aside and reduces the batch's sites side by side along the heads
(``attnviz.stats.deferral.DEFERRED_DEVICES``), the core handing it and the carriers the summaries of whole calls to
keep; here the CPU is made to do the same, and every statistic, its standard deviation, the by-position means and
the carriers must equal the site-by-site reduction to float32 rounding (the per-query values are float32, their
layout in memory differs).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import TEXTS

import attnviz
from attnviz.stats import deferral
from attnviz.stats.carriers import CARRIER_FIELDS
from attnviz.stats.definitions import STATISTIC_NAMES
from attnviz.stats.kept_rows import SummarisedRows


@pytest.mark.parametrize("budget", [deferral.DEFERRED_BYTES, 1], ids=["whole-batch", "each-site-at-once"])
@pytest.mark.parametrize("by_position", [True, False], ids=["by-position", "whole-calls"])
@pytest.mark.parametrize("family", ["llama", "bert", "bart"])
def test_sites_reduced_together_equal_sites_reduced_one_by_one(
    tiny_model_dirs, monkeypatch, family, budget, by_position
):
    loaded = attnviz.load_model(str(tiny_model_dirs[family]), device="cpu")
    texts = [*TEXTS[:3], " ".join(TEXTS[3:6])]  # padding, two batches of two
    monkeypatch.setattr(deferral, "DEFERRED_BYTES", budget)  # 1: past the budget at every site
    kept_whole = []  # calls whose summary was kept as the core handed it over
    keep = SummarisedRows.keep
    monkeypatch.setattr(SummarisedRows, "keep", lambda rows, *args: kept_whole.append(rows.site) or keep(rows, *args))
    results = []
    for devices in (("cuda",), ("cuda", "cpu")):
        monkeypatch.setattr(deferral, "DEFERRED_DEVICES", devices)
        results.append(attnviz.compute_statistics(loaded, texts, batch_size=2, by_position=by_position, progress=False))
    one_by_one, together = results
    if not by_position and family != "bart":  # the whole-call path (bart's cross-attention reads its blocks)
        assert len(kept_whole) >= 2 * len(loaded.layout()), kept_whole
    assert one_by_one.carriers is not None and together.carriers is not None
    assert one_by_one.carriers.means.keys() == together.carriers.means.keys()
    for site, means in one_by_one.carriers.means.items():  # [4, h]
        assert torch.equal(means.isnan(), together.carriers.means[site].isnan()), site
        difference = float((means - together.carriers.means[site]).nan_to_num().abs().max())
        assert difference <= 1e-6 * max(1.0, float(means.nan_to_num().abs().max())), (site, CARRIER_FIELDS)
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
    if not by_position:
        return
    assert one_by_one.by_position is not None and together.by_position is not None
    assert one_by_one.by_position.sites.keys() == together.by_position.sites.keys()
    for site, means in one_by_one.by_position.sites.items():  # [M, h, B]
        assert torch.equal(means.isnan(), together.by_position.sites[site].isnan()), site
        assert float((means - together.by_position.sites[site]).nan_to_num().abs().max()) <= 1e-6, site
