"""Sanity checks of ``attnviz stats`` on real pretrained models (known properties, not tuning targets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnviz.core import AttentionSite
from attnviz.stats import compute_statistics, detect_heads

SENTENCES = [
    "The cat sat on the mat because it was tired.",
    "She opened the window and let the cold morning air into the kitchen.",
    "Why do leaves change colour in the autumn?",
    "The train to the coast leaves at seven, so we should pack tonight.",
    "Water boils at a lower temperature on a high mountain.",
    "After years of practice, he could finally play the piece without a mistake.",
]


@pytest.mark.slow
def test_smollm2_has_first_token_sinks_in_the_middle_layers():
    """Attention sinks are a known property of causal LMs: most middle-layer heads park on token 0."""
    from attnviz.models.specs import load_model

    loaded = load_model("smollm2", device="cpu")
    stats = compute_statistics(loaded, SENTENCES, batch_size=6, progress=False)
    detection = detect_heads(stats)
    layers = stats.num_layers()
    middle = range(layers // 4, 3 * layers // 4)  # layers 7-21 of 30
    sinks = [sum("first-token-sink" in f for f in detection.flags[AttentionSite("self", layer)]) for layer in middle]
    heads = stats.num_heads() * len(middle)
    assert sum(sinks) > 0.6 * heads, sinks
    # the flag follows the number: mean first-token mass of flagged heads is ≥ the threshold
    first = stats.matrix("first_token")
    for layer in middle:
        for head, flags in enumerate(detection.flags[AttentionSite("self", layer)]):
            assert ("first-token-sink" in flags) == (float(first[layer, head]) >= 0.5)
    # causal model: normalised entropy divides by ln(i+1); every query sees at least itself
    assert stats.causal and (stats.matrix("normalized_entropy") <= 1.0 + 1e-5).all()


@pytest.mark.slow
def test_minilm_has_special_token_heads(minilm):
    """BERT-style encoders send much attention to [CLS]/[SEP]: special-token heads appear."""
    stats = compute_statistics(minilm, SENTENCES, batch_size=3, progress=False)
    detection = detect_heads(stats)
    special_heads = detection.flagged("special-token")
    assert len(special_heads) >= 10, len(special_heads)
    assert not stats.causal
    # [CLS] is token 0, so special-token mass is at least the first-token mass
    assert (stats.matrix("special_tokens") >= stats.matrix("first_token") - 1e-6).all()


TOY_DIR = Path(__file__).resolve().parents[2] / "sample_data" / "toy"
TOY_CHECKPOINTS = sorted(p for p in TOY_DIR.glob("*") if (p / "attnviz-toy.json").is_file()) if TOY_DIR.is_dir() else []


@pytest.mark.skipif(not TOY_CHECKPOINTS, reason="no toy checkpoints in sample_data/toy")
@pytest.mark.parametrize("checkpoint", TOY_CHECKPOINTS, ids=[p.name for p in TOY_CHECKPOINTS])
def test_stats_on_a_shipped_toy_checkpoint(capsys, tmp_path, checkpoint):
    """`attnviz stats` on a toy checkpoint draws its task's examples and gives numbers in range."""
    from cli_helpers import run_cli

    out = tmp_path / "toy.json"
    result = run_cli(capsys, "stats", checkpoint, "--json", out, "--toy-examples", "32", "--no-table")
    assert result.exit_code == 0, result.stderr
    record = json.loads(out.read_text())
    assert record["num_examples"] == 32 and record["num_tokens"] > 32
    for head in record["heads"]:
        for name in (
            "max_weight",
            "diagonal",
            "previous_token",
            "local_ratio",
            "first_token",
            "special_tokens",
            "normalized_distance",
        ):
            assert 0.0 <= head[name] <= 1.0 + 1e-5, (name, head)
        assert head["entropy"] >= 0.0 and head["mean_distance"] >= 0.0
        if head["normalized_entropy"] is not None:
            assert 0.0 <= head["normalized_entropy"] <= 1.0 + 1e-5
    if checkpoint.name == "previous-token":
        # trained so that position i reads token i − 1 (see sample_data/toy/README.md)
        best = max(record["heads"], key=lambda head: head["previous_token"])
        assert best["previous_token"] > 0.9 and "previous-token" in best["flags"]
