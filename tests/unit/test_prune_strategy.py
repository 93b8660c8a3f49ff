"""Choosing heads: global / per-layer ranking, never emptying a layer, iterative re-scoring, min-score stop."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TEXTS

from attnviz.common.errors import InputError
from attnviz.core import AttentionSite
from attnviz.models.head_sets import count_removed, removal_mask
from attnviz.prune.judging import text_batches
from attnviz.prune.strategy import PruneStrategy, layer_quotas, run_pruning, select_heads, step_targets

# fixtures shared by the pruning tests (tiny BERT, GPT-2 and LLaMA models)

S0, S1, S2 = (AttentionSite("self", i) for i in range(3))
LAYOUT = {S0: 4, S1: 4, S2: 4}


def _scores(rows):
    return {site: torch.tensor(row, dtype=torch.float64) for site, row in zip((S0, S1, S2), rows)}


def test_global_selection_takes_lowest_scores_and_keeps_a_head_per_layer():
    scores = _scores([[0.1, 0.2, 0.3, 0.4], [0.9, 0.8, 0.7, 0.6], [0.05, 0.5, 0.55, 0.56]])
    assert select_heads(scores, LAYOUT, {}, 3) == {S0: [0, 1], S2: [0]}
    # layer 0's four heads are the lowest six... but its last head stays
    chosen = select_heads(scores, LAYOUT, {}, 6)
    assert chosen == {S0: [0, 1, 2], S2: [0, 1, 2]}
    # already removed heads are skipped
    assert select_heads(scores, LAYOUT, {S0: [0, 1]}, 2) == {S0: [2], S2: [0]}


def test_per_layer_selection_follows_quotas():
    scores = _scores([[0.1, 0.2, 0.3, 0.4], [0.9, 0.8, 0.7, 0.6], [0.05, 0.5, 0.55, 0.56]])
    quotas = layer_quotas(LAYOUT, 6)
    assert quotas == {S0: 2, S1: 2, S2: 2}
    assert select_heads(scores, LAYOUT, {}, 6, "per-layer", quotas) == {S0: [0, 1], S1: [2, 3], S2: [0, 1]}


def test_layer_quotas_spread_remainders_and_respect_capacity():
    assert sum(layer_quotas(LAYOUT, 5).values()) == 5
    assert layer_quotas({S0: 2, S1: 6}, 4) == {S0: 1, S1: 3}
    assert layer_quotas({S0: 2, S1: 6}, 6) == {S0: 1, S1: 5}
    with pytest.raises(InputError):
        layer_quotas(LAYOUT, 10)


def test_step_targets():
    assert step_targets(10, 5) == [2, 4, 6, 8, 10]
    assert step_targets(3, 5) == [1, 2, 3]
    assert step_targets(1, 4) == [1]


def test_strategy_validation():
    with pytest.raises(InputError, match="scope"):
        PruneStrategy(scope="everywhere").validate()
    with pytest.raises(InputError, match="min_score must be a fraction"):
        PruneStrategy(min_score=1.5).validate()
    with pytest.raises(InputError, match="steps"):
        PruneStrategy(steps=0).validate()


@pytest.fixture(scope="module")
def gpt2_objective(tiny_models):
    loaded = tiny_models["gpt2"]
    return loaded.objective(text_batches(loaded, TEXTS, batch_size=6))


def test_one_shot_ablation_removes_the_lowest_ablation_scores(gpt2_objective):
    layout = gpt2_objective.loaded.layout()
    run = run_pruning(gpt2_objective, layout, "ablation", 3, PruneStrategy())
    ranked = sorted((float(v), s, h) for s, values in run.importance.scores.items() for h, v in enumerate(values))
    expected = {}
    for _, site, head in ranked[:3]:
        expected.setdefault(site, []).append(head)
    assert run.removed == {site: sorted(heads) for site, heads in sorted(expected.items())}
    assert len(run.steps) == 1 and run.steps[0].total_removed == 3


def test_iterative_rescoring_is_greedy_ablation(gpt2_objective):
    """Iterative ablation in single-head steps removes, each step, the head whose removal hurts least now."""
    layout = gpt2_objective.loaded.layout()
    run = run_pruning(gpt2_objective, layout, "ablation", 3, PruneStrategy(iterative=True, steps=3))
    assert [step.total_removed for step in run.steps] == [1, 2, 3]
    removed: dict = {}
    for step in run.steps:
        best = min(
            (
                gpt2_objective.loss(removal_mask(layout, {**removed, s: sorted(removed.get(s, []) + [h])})),
                s,
                h,
            )
            for s, heads in layout.items()
            for h in range(heads)
            if h not in removed.get(s, [])
        )
        assert step.removed == {best[1]: [best[2]]}
        removed.setdefault(best[1], []).append(best[2])
    assert run.last_importance is not run.importance


def test_min_score_stops_before_quality_drops_too_far(gpt2_objective):
    layout = gpt2_objective.loaded.layout()
    before = gpt2_objective.evaluate()
    run = run_pruning(
        gpt2_objective, layout, "random", 6, PruneStrategy(steps=6, min_score=0.999999), seed=0, quality_before=before
    )
    # every accepted step kept quality ≥ min_score × original; the refused one did not
    for step in run.steps:
        assert step.quality.score >= 0.999999 * before.score
    if count_removed(run.removed) < 6:
        assert run.stopped_by_min_score
    loose = run_pruning(gpt2_objective, layout, "random", 6, PruneStrategy(steps=3, min_score=1e-9), seed=0)
    assert count_removed(loose.removed) == 6 and not loose.stopped_by_min_score


def test_run_pruning_rejects_impossible_counts(gpt2_objective):
    layout = gpt2_objective.loaded.layout()
    with pytest.raises(InputError, match="every layer keeps one"):
        run_pruning(gpt2_objective, layout, "random", 7, PruneStrategy())
