"""Pruning the shipped real models (MiniLM, SmolLM2): kept short, marked slow, run by default."""

from __future__ import annotations

import pytest
import torch

from attnviz.common.texts import default_corpus_path, read_examples
from attnviz.core import AttentionSite
from attnviz.models.head_sets import removal_mask
from attnviz.models.physical import prune_heads_physically
from attnviz.models.specs import load_model
from attnviz.prune import PruneConfig, prune_model, save_outcome
from attnviz.prune.cost import forward_output, parameter_count

pytestmark = pytest.mark.slow


def _texts(count: int) -> list[str]:
    return read_examples(default_corpus_path())[:count]


def test_minilm_prune_round_trip(minilm, tmp_path):
    """30% of MiniLM's heads by gradient: physically smaller, same outputs as masked, reloads."""
    outcome = prune_model(
        minilm, PruneConfig(ratio=0.3, latency_tokens=64, latency_repeats=1, probes=2), texts=_texts(16)
    )
    report = outcome.report
    assert report.heads_before == 72 and report.heads_after == 72 - round(0.3 * 72)
    assert report.max_abs_diff <= 1e-5
    assert report.params_after < report.params_before
    assert report.metric == "cosine_similarity" and 0.5 < report.metric_after < 1.0
    assert report.metric_after == pytest.approx(report.metric_masked, abs=1e-5)
    out = save_outcome(outcome, tmp_path / "pruned-minilm", source="minilm", transformers_copy=False)
    reloaded = load_model(str(out), device="cpu")
    assert reloaded.layout() == outcome.pruned.layout()
    batch = minilm.encode(_texts(4))
    valid = batch.inputs["attention_mask"].bool()
    masked = forward_output(minilm, batch, minilm.context(head_mask=removal_mask(minilm.layout(), outcome.removed)))
    assert (masked[valid] - forward_output(reloaded, batch)[valid]).abs().max() <= 1e-5


def test_smollm2_grouped_query_pruning_matches_masked():
    """SmolLM2 (9 query heads over 3 key/value heads per layer): whole group, one per group, and uneven removals."""
    loaded = load_model("smollm2", device="cpu")
    removed = {
        AttentionSite("self", 0): [3, 4, 5],  # all of group 1: its key/value head goes too
        AttentionSite("self", 1): [0, 3, 6],  # one head of every group: groups shrink to 2
        AttentionSite("self", 2): [0, 1, 4, 7],  # uneven: one per group sliced, head 1 masked
    }
    pruned, plans = prune_heads_physically(loaded, removed)
    assert plans[AttentionSite("self", 0)].keep_kv_heads == [0, 2]
    assert plans[AttentionSite("self", 1)].masked == [] and plans[AttentionSite("self", 2)].masked == [1]
    layers = pruned.model.model.layers
    assert (layers[0].self_attn.k_proj.out_features, layers[0].self_attn.q_proj.out_features) == (2 * 64, 6 * 64)
    assert layers[1].self_attn.num_key_value_groups == 2
    assert parameter_count(pruned.model) < parameter_count(loaded.model)
    batch = loaded.encode(["The cat sat on the mat because it was tired."])
    masked = forward_output(loaded, batch, loaded.context(head_mask=removal_mask(loaded.layout(), removed)))
    ours = forward_output(pruned, batch)
    # logits of magnitude ~20 after 30 layers: float32 sums over fewer heads run in another order (seen: 1.0001e-4)
    assert (masked - ours).abs().max() <= 1e-5 * masked.abs().max() + 1e-4
    assert torch.equal(masked.argmax(-1), ours.argmax(-1))


def test_importance_finds_the_shipped_induction_circuit():
    """The trained induction toy's job is done by self.0 head 3 (previous token) and self.1 head 1 (prefix
    matching) — see sample_data/toy/README.md. Gradient and ablation importance both rank them first in their
    layers, and pruning the six other heads keeps the task solved while pruning those two does not."""
    from pathlib import Path

    from attnviz.prune.importance import compute_importance

    checkpoint = Path(__file__).resolve().parents[2] / "sample_data" / "toy" / "induction"
    loaded = load_model(str(checkpoint), device="cpu")
    objective = loaded.objective(loaded.own_example_batches(128, batch_size=64, seed=0))
    layout = loaded.layout()
    site0, site1 = AttentionSite("self", 0), AttentionSite("self", 1)
    for method in ("gradient", "ablation"):
        scores = compute_importance(method, objective, layout).scores
        assert int(scores[site0].argmax()) == 3 and int(scores[site1].argmax()) == 1, method
    kept = objective.evaluate(removal_mask(layout, {site0: [0, 1, 2], site1: [0, 2, 3]}))  # all but the circuit
    broken = objective.evaluate(removal_mask(layout, {site0: [3], site1: [1]}))  # only the circuit
    assert kept.metric > 0.95 and broken.metric < 0.85 and broken.loss > 5 * kept.loss
