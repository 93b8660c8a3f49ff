"""Probe scores and labels: planted heads through the attention core, shipped toy model, capture reference."""

from __future__ import annotations

import math

import pytest
import torch

from attnviz.core import AttentionContext, AttentionSite, attend
from attnviz.heads import FunctionThresholds, HeadFunctions, ProbeSettings, probe_batches
from attnviz.heads.probes import ProbeBatch
from attnviz.heads.scores import SCORE_INDEX, SCORE_NAMES, ProbeScoreAccumulator
from attnviz.models.hf_inputs import ordinary_token_ids

T = 6  # block length of the planted probe
START = 1  # [BOS] first
N = START + 2 * T  # positions


def planted_patterns(n: int = N, t: int = T, start: int = START) -> torch.Tensor:
    """``[h=4, n, n]`` causal patterns: exact induction, duplicate-token, previous-token heads, and a uniform head.

    Rows the planted rule does not cover put all their weight on position 0 (the BOS sink).
    """
    patterns = torch.zeros(4, n, n)
    patterns[:, :, 0] = 1.0
    for k in range(1, t + 1):
        query = start + t + k - 1  # r_k's second occurrence
        patterns[0, query] = 0.0
        patterns[0, query, start + k] = 1.0  # the token after r_k's first occurrence
        patterns[1, query] = 0.0
        patterns[1, query, start + k - 1] = 1.0  # r_k's first occurrence
    for i in range(1, n):
        patterns[2, i] = 0.0
        patterns[2, i, i - 1] = 1.0
    patterns[3] = torch.ones(n, n).tril()
    patterns[3] /= patterns[3].sum(-1, keepdim=True)
    return patterns


class PlantedPattern:
    """A :data:`~attnviz.core.attention.PatternFunction` returning the planted rows of each block."""

    def __init__(self, patterns: torch.Tensor, batch: int):
        self.patterns = patterns  # [h, n, n]
        self.batch = batch

    def __call__(self, query, key, mask, query_start):
        rows = query.shape[2]
        block = self.patterns[:, query_start : query_start + rows]  # [h, blk, n]
        return block.unsqueeze(0).expand(self.batch, -1, -1, -1).clone()  # [b, h, blk, n]


def run_planted(layers: int = 2, batch: int = 3) -> dict[AttentionSite, torch.Tensor]:
    """Run the planted heads through :func:`attend` (in 3-query blocks) with the probe-score observer."""
    import attnviz.core.attention as core

    accumulator = ProbeScoreAccumulator(causal=True)
    accumulator.begin_batch(ProbeBatch(batch=None, length=T, source_start=START))
    context = AttentionContext(observers=[accumulator])
    patterns = planted_patterns()
    query = torch.randn(batch, 4, N, 8)
    key = value = torch.randn(batch, 4, N, 8)
    old = core.BLOCK_ELEMENTS
    core.BLOCK_ELEMENTS = batch * 4 * N * 3  # 3 queries per block: the observer sees blocks
    try:
        for layer in range(layers):
            attend(
                query,
                key,
                value,
                pattern_fn=PlantedPattern(patterns, batch),
                site=AttentionSite("self", layer),
                context=context,
            )
    finally:
        core.BLOCK_ELEMENTS = old
    return accumulator.means()


def test_planted_heads_score_one_and_get_their_labels():
    scores = run_planted()
    for site, values in scores.items():  # [score, h]
        induction, duplicate, previous = (values[SCORE_INDEX[name]] for name in SCORE_NAMES[:3])
        assert induction[0] == pytest.approx(1.0) and duplicate[0] == 0.0 and previous[0] < 0.5
        assert duplicate[1] == pytest.approx(1.0) and induction[1] == 0.0
        assert previous[2] == pytest.approx(1.0) and induction[2] == 0.0 and duplicate[2] == 0.0
        # uniform causal head: query s+T+k−1 sees s+T+k keys, so each weight is 1/(s+T+k)
        expected = sum(1.0 / (START + T + k) for k in range(1, T + 1)) / T
        assert induction[3] == pytest.approx(expected) and duplicate[3] == pytest.approx(expected)
        assert math.isnan(float(values[SCORE_INDEX["next_token"]].max()))  # causal: no next token
    result = HeadFunctions(
        model="planted", causal=True, probe=ProbeSettings(length=T), scores=scores, thresholds=FunctionThresholds()
    )
    site = AttentionSite("self", 1)
    assert [result.labels(site, head) for head in range(4)] == [
        ("induction",),
        ("duplicate-token",),
        ("previous-token",),
        (),
    ]
    assert [result.main_label(site, head) for head in range(4)] == [
        "induction",
        "duplicate-token",
        "previous-token",
        None,
    ]
    assert result.ranking("induction")[0][1] == 0
    stricter = FunctionThresholds(previous_token_min=None)  # label turned off
    assert HeadFunctions("planted", True, ProbeSettings(length=T), scores, stricter).labels(site, 2) == ()


def test_shipped_toy_induction_checkpoint_labels():
    from attnviz.models.specs import load_model

    loaded = load_model("sample_data/toy/induction", device="cpu")
    from attnviz.heads import head_functions

    result = head_functions(loaded)
    assert result.probe.length == 8  # the task's longest repeated half
    assert "induction" in result.labels(AttentionSite("self", 1), 1)
    assert result.main_label(AttentionSite("self", 0), 3) == "previous-token"
    top_site, top_head, top_score = result.ranking("induction")[0]
    assert (top_site, top_head) == (AttentionSite("self", 1), 1) and top_score > 0.95
    # layer 0 has no induction head: it cannot, without a previous-token head before it
    assert float(result.matrix("induction")[0].max()) < 0.1


@pytest.mark.parametrize("family", ["llama", "bert", "bart"])
def test_observer_scores_equal_scores_from_captured_patterns(family, tiny_model_dirs):
    """The streaming scores equal the same definition applied to full captured patterns."""
    from attnviz.captures.attention_capture import PatternRecorder
    from attnviz.heads.compute import probe_scores
    from attnviz.models.hf import load_hf_model

    loaded = load_hf_model(str(tiny_model_dirs[family]), device="cpu")
    settings = ProbeSettings(length=5, sequences=3, seed=1, batch_size=2)
    _, scores = probe_scores(loaded, settings)
    sums: dict = {}
    for probe in probe_batches(loaded, settings):
        recorder = PatternRecorder()
        with torch.no_grad():
            loaded.forward(probe.batch, loaded.context([recorder]))
        for site, pattern in recorder.patterns.items():  # [b, h, q, k]
            q0, k0 = probe.starts(site.stack)
            causal = site.stack == "decoder" or (site.stack == "self" and loaded.causal)
            rows = {
                "induction": [(q0 + 5 + k - 1, k0 + k) for k in range(1, 6)],
                "duplicate_token": [(q0 + 5 + k - 1, k0 + k - 1) for k in range(1, 6)],
                "previous_token": [(q0 + i, k0 + i - 1) for i in range(1, 10)],
                "next_token": [] if causal else [(q0 + i, k0 + i + 1) for i in range(9)],
            }
            total = sums.setdefault(
                site, {name: [torch.zeros(pattern.shape[1], dtype=torch.float64), 0] for name in rows}
            )
            for name, pairs in rows.items():
                for q, k in pairs:
                    total[name][0] += pattern[:, :, q, k].double().sum(0)
                    total[name][1] += pattern.shape[0]
    assert set(sums) == set(scores)
    for site, per_score in sums.items():
        for name, (value, count) in per_score.items():
            got = scores[site][SCORE_INDEX[name]]
            if count == 0:
                assert torch.isnan(got).all()
            else:
                torch.testing.assert_close(got, value / count, atol=1e-6, rtol=1e-5)


def test_probe_sequences_are_ordinary_repeated_tokens(minilm):
    import random

    batches = probe_batches(minilm, ProbeSettings(length=10, sequences=3, seed=0))
    ids = batches[0].batch.inputs["input_ids"]  # [b, 1 + 2T + 1]
    tokenizer = minilm.tokenizer
    assert ids.shape == (3, 22)
    assert (ids[:, 0] == tokenizer.cls_token_id).all() and (ids[:, -1] == tokenizer.sep_token_id).all()
    assert torch.equal(ids[:, 1:11], ids[:, 11:21])  # the block, twice
    block = ids[0, 1:11].tolist()
    assert len(set(block)) == 10 and not set(block) & set(tokenizer.all_special_ids)
    assert all(not tokenizer.convert_ids_to_tokens(i).startswith("##") for i in block)
    same = probe_batches(minilm, ProbeSettings(length=10, sequences=3, seed=0))[0].batch.inputs["input_ids"]
    assert torch.equal(ids, same)  # seeded
    pool = ordinary_token_ids(tokenizer, random.Random(0), 50)
    assert all(tokenizer(tokenizer.decode([i]), add_special_tokens=False)["input_ids"] == [i] for i in pool)
