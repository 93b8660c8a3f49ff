"""Importance scores against references: finite differences, explicit ablation, seeded randomness."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import TEXTS

from attnviz.common.errors import InputError
from attnviz.core import AttentionSite, HeadMask
from attnviz.models.head_sets import removal_mask
from attnviz.models.hf import HFModel
from attnviz.models.objective import LanguageModelObjective, RepresentationObjective
from attnviz.prune.importance import (
    ablation_importance,
    compute_importance,
    gradient_importance,
    normalize_per_layer,
    random_importance,
)
from attnviz.prune.judging import text_batches

# fixtures shared by the pruning tests (tiny BERT, GPT-2 and LLaMA models)


def _float64(loaded) -> HFModel:
    return HFModel(copy.deepcopy(loaded.model).double(), loaded.tokenizer, name=loaded.name)


def _mask_at(layout, site, head, value) -> HeadMask:
    """ξ = 1 everywhere except ξ[site][head] = value (float64)."""
    masks = {s: torch.ones(h, dtype=torch.float64) for s, h in layout.items()}
    masks[site][head] = value
    return HeadMask(masks)


#: heads checked against finite differences (a spread subset keeps the test fast)
CHECKED = {4: [0, 1, 3], 8: [0, 3, 6, 7]}


def _finite_difference(loss_of_mask, layout, eps=0.05) -> dict:
    """Fourth-order central differences ∂L/∂ξₕ for every head.

    The core keeps patterns in float32 by design, so L carries float32 rounding that a
    difference quotient amplifies by 1/eps; a wide fourth-order stencil keeps both that
    and the truncation error near 1e-4 relative. Heads outside :data:`CHECKED` are NaN.
    """
    grads = {}
    for site, heads in layout.items():
        values = []
        for h in range(heads):
            if h not in CHECKED[heads]:
                values.append(float("nan"))
                continue
            at = {k: loss_of_mask(_mask_at(layout, site, h, 1 + k * eps)) for k in (-2, -1, 1, 2)}
            values.append((-at[2] + 8 * at[1] - 8 * at[-1] + at[-2]) / (12 * eps))
        grads[site] = torch.tensor(values, dtype=torch.float64)
    return grads


#: relative tolerance of gradient vs finite differences (see _finite_difference)
RTOL = 2e-3


def test_gradient_importance_equals_finite_differences_lm(tiny_models):
    """Σ_batches |∂L_b/∂ξₕ| from autograd equals the same sum of central differences (two batches)."""
    loaded = _float64(tiny_models["llama"])
    layout = loaded.layout()
    objective = LanguageModelObjective(loaded, text_batches(loaded, TEXTS[:2], batch_size=1))
    assert len(objective.batches) == 2
    expected = {site: torch.zeros(h, dtype=torch.float64) for site, h in layout.items()}
    for index in range(2):

        def batch_share(mask, index=index):
            with torch.no_grad():
                total, _ = objective.batch_loss(index, loaded.context(head_mask=mask))
            return float(total) / objective.total_units()

        for site, grad in _finite_difference(batch_share, layout).items():
            expected[site] += grad.abs()

    ours = gradient_importance(objective, layout, normalize=False)
    for site in layout:
        checked = CHECKED[layout[site]]
        assert torch.allclose(ours[site][checked], expected[site][checked], rtol=RTOL, atol=1e-7), site
    assert all(bool((ours[site] > 0).all()) for site in layout)


def test_gradient_importance_with_removed_heads_equals_finite_differences(tiny_models):
    """Re-scoring (iterative pruning) differentiates at ξ = 1 with the removed heads held at 0."""
    loaded = _float64(tiny_models["gpt2"])
    layout = loaded.layout()
    site0 = AttentionSite("self", 0)
    removed = {site0: [1]}
    objective = LanguageModelObjective(loaded, text_batches(loaded, TEXTS[:3], batch_size=3))

    def loss(mask):
        mask.masks[site0] = mask.masks[site0].clone()
        mask.masks[site0][1] = 0.0
        return objective.loss(mask)

    expected = _finite_difference(loss, layout)
    ours = gradient_importance(objective, layout, removed, normalize=False)
    assert torch.isnan(ours[site0][1])
    for site in layout:
        keep = ~torch.isnan(ours[site]) & ~torch.isnan(expected[site])
        assert keep.sum() >= 2
        assert torch.allclose(ours[site][keep], expected[site][keep].abs(), rtol=RTOL, atol=1e-7)


def test_gradient_importance_of_encoder_probes_equals_finite_differences(tiny_models):
    """Encoders: the mean |∂(probe·h)/∂ξₕ| over probes equals the finite-difference estimate."""
    loaded = _float64(tiny_models["bert"])
    layout = loaded.layout()
    objective = RepresentationObjective(loaded, text_batches(loaded, TEXTS[:4], batch_size=4), probes=3, seed=7)
    expected = {site: torch.zeros(h, dtype=torch.float64) for site, h in layout.items()}
    for probe in range(3):

        def probe_loss(mask, probe=probe):
            with torch.no_grad():
                return float(objective.gradient_losses(0, loaded.context(head_mask=mask))[probe])

        for site, grad in _finite_difference(probe_loss, layout).items():
            expected[site] += grad.abs() / 3
    ours = gradient_importance(objective, layout, normalize=False)
    for site in layout:
        checked = CHECKED[layout[site]]
        assert torch.allclose(ours[site][checked], expected[site][checked], rtol=RTOL, atol=1e-7)


def test_representation_objective_is_zero_before_pruning_and_grows(tiny_models):
    loaded = tiny_models["bert"]
    objective = RepresentationObjective(loaded, text_batches(loaded, TEXTS, batch_size=4))
    before = objective.evaluate()
    assert before.loss == pytest.approx(0.0, abs=1e-10)
    assert before.metric == pytest.approx(1.0, abs=1e-6)
    after = objective.evaluate(removal_mask(loaded.layout(), {AttentionSite("self", 0): [0, 1]}))
    assert after.loss > 1e-4 and after.metric < 1.0


def test_ablation_importance_equals_loss_differences(tiny_models):
    loaded = tiny_models["gpt2"]
    layout = loaded.layout()
    objective = loaded.objective(text_batches(loaded, TEXTS, batch_size=4))
    site1 = AttentionSite("self", 1)
    scores = ablation_importance(objective, layout, {site1: [3]})
    base = objective.loss(removal_mask(layout, {site1: [3]}))
    for site, heads in layout.items():
        for head in range(heads):
            if site == site1 and head == 3:
                assert torch.isnan(scores[site][head])
                continue
            removed = {site1: [3]} if site != site1 else {site1: sorted({3, head})}
            if site != site1:
                removed = {site1: [3], site: [head]}
            expected = objective.loss(removal_mask(layout, removed)) - base
            assert float(scores[site][head]) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_language_model_loss_equals_transformers_loss(tiny_models):
    """The LM objective's mean NLL equals transformers' own ``labels=`` loss on an unpadded example."""
    loaded = tiny_models["llama"]
    batch = loaded.encode(TEXTS[:1])
    objective = LanguageModelObjective(loaded, [batch])
    with torch.no_grad():
        reference = loaded.model(**batch.inputs, labels=batch.inputs["input_ids"]).loss
    assert objective.loss() == pytest.approx(float(reference), rel=1e-5)
    assert objective.evaluate().metric == pytest.approx(float(torch.exp(reference)), rel=1e-5)


def test_random_importance_is_seeded():
    layout = {AttentionSite("self", 0): 4, AttentionSite("self", 1): 4}
    first, again, other = random_importance(layout, 3), random_importance(layout, 3), random_importance(layout, 4)
    assert all(torch.equal(first[s], again[s]) for s in layout)
    assert not all(torch.equal(first[s], other[s]) for s in layout)
    removed = random_importance(layout, 3, {AttentionSite("self", 0): [2]})
    assert torch.isnan(removed[AttentionSite("self", 0)][2])


def test_normalize_per_layer_gives_unit_norm_ignoring_nan():
    site = AttentionSite("self", 0)
    scores = {site: torch.tensor([3.0, float("nan"), 4.0], dtype=torch.float64)}
    normalized = normalize_per_layer(scores)[site]
    assert normalized[0] == pytest.approx(0.6) and normalized[2] == pytest.approx(0.8)
    assert torch.isnan(normalized[1])


def test_compute_importance_defaults_and_errors(tiny_models):
    loaded = tiny_models["llama"]
    objective = loaded.objective(text_batches(loaded, TEXTS[:2], batch_size=2))
    gradient = compute_importance("gradient", objective, loaded.layout())
    assert gradient.normalized
    for values in gradient.scores.values():
        assert float(torch.linalg.vector_norm(values)) == pytest.approx(1.0)
    assert not compute_importance("random", objective, loaded.layout(), seed=1).normalized
    assert len(gradient.records()) == 16 and set(gradient.records()[0]) == {"stack", "layer", "head", "score"}
    with pytest.raises(InputError, match="unknown importance"):
        compute_importance("magic", objective, loaded.layout())


@pytest.mark.parametrize(
    "proxy, statistic, sign", [("entropy", "normalized_entropy", -1.0), ("confidence", "max_weight", 1.0)]
)
def test_proxy_importance_comes_from_attnviz_stats(tiny_models, proxy, statistic, sign):
    from attnviz.stats import compute_statistics

    loaded = tiny_models["bert"]
    objective = loaded.objective(text_batches(loaded, TEXTS, batch_size=3), probes=1)
    importance = compute_importance(proxy, objective, loaded.layout(), {AttentionSite("self", 1): [2]})
    reference = compute_statistics(loaded, batches=objective.batches, progress=False).matrix(statistic)
    assert not importance.normalized
    assert torch.allclose(importance.scores[AttentionSite("self", 0)], sign * reference[0].double())
    layer1 = importance.scores[AttentionSite("self", 1)]
    assert torch.isnan(layer1[2]) and torch.allclose(layer1[[0, 1, 3]], sign * reference[1, [0, 1, 3]].double())
