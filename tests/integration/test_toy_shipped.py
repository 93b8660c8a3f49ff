"""The trained toy checkpoints shipped in sample_data/toy: loaded (never retrained) and held to the issue's numbers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from attnviz.captures.attention_capture import PatternRecorder, capture
from attnviz.core import AttentionSite
from attnviz.models.specs import load_model
from attnviz.toy import checkpoint_series, solution_scores

TOY = Path(__file__).resolve().parents[2] / "sample_data" / "toy"
SHIPPED = ("reverse", "induction", "previous-token", "copy", "sort")
HELD_OUT_SEED = 20_261_122  # not a training stream: training uses random.Random(f"train:{seed}:{step}")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _load(name: str):
    return load_model(str(TOY / name), device="cpu")


def _patterns(loaded, batch) -> dict[AttentionSite, torch.Tensor]:
    recorder = PatternRecorder()
    with torch.no_grad():
        loaded.forward(batch, loaded.context([recorder]))
    return recorder.patterns


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_checkpoint_is_small_and_accurate(name):
    files = [p for p in (TOY / name).rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 1.5 * 2**20  # well under 2 MB, step series included
    loaded = _load(name)
    assert loaded.task == name
    metrics = loaded.task_metrics(loaded.task_batch(500, seed=HELD_OUT_SEED))
    assert metrics["accuracy"] >= 0.99, metrics


def test_shipped_reverse_has_an_anti_diagonal_cross_attention_head():
    loaded = _load("reverse")
    assert loaded.encoder_decoder
    batch = loaded.task_batch(300, seed=HELD_OUT_SEED)
    assert loaded.task_metrics(batch)["accuracy"] >= 0.99
    patterns = _patterns(loaded, batch)
    best = 0.0
    for site, pattern in patterns.items():  # [b, h, target, source]
        if site.stack != "cross":
            continue
        totals, count = torch.zeros(pattern.shape[1]), 0
        for example, target in enumerate(batch.target_tokens):
            n = len(target) - 1  # decoder input: <bos> y₁ … yₙ; position t emits yₜ₊₁ = source item n−1−t
            for t in range(n):
                totals += pattern[example, :, t, n - 1 - t]
                count += 1
        best = max(best, float((totals / count).max()))
    assert best >= 0.8
    # the library's own measure agrees (on other examples)
    assert max(float(s.max()) for s in solution_scores(loaded, 200).values()) >= 0.8


def test_shipped_induction_has_a_prefix_matching_head():
    loaded = _load("induction")
    assert loaded.causal and loaded.num_layers() == 2
    batch = loaded.task_batch(300, seed=HELD_OUT_SEED)
    labels = batch.inputs["labels"]
    # every labelled position is in the repeated half: its token occurred once before
    for example, tokens in enumerate(batch.tokens):
        for position in (labels[example] != -100).nonzero().flatten().tolist():
            assert tokens[position] in tokens[1:position]
    assert loaded.task_metrics(batch)["accuracy"] >= 0.95
    patterns = _patterns(loaded, batch)
    scores = {}
    for site, pattern in patterns.items():  # [b, h, q, k]
        totals, count = torch.zeros(pattern.shape[1]), 0
        for example, tokens in enumerate(batch.tokens):
            first: dict[str, int] = {}
            for position, token in enumerate(tokens):
                if token in first:  # second occurrence: weight on the token after the first one
                    totals += pattern[example, :, position, first[token] + 1]
                    count += 1
                first.setdefault(token, position)
        scores[site] = totals / count
    assert float(scores[AttentionSite("self", 1)].max()) >= 0.5
    # the training series shows the head forming
    series = checkpoint_series(TOY / "induction")
    assert [step for step, _ in series] == [100, 200, 300, 400, 500]
    early = load_model(str(series[0][1]), device="cpu")
    assert early.metadata["step"] == 100
    assert early.task_metrics(early.task_batch(200, seed=HELD_OUT_SEED))["accuracy"] < 0.5


def test_capture_of_the_shipped_reverse_model():
    result = capture(_load("reverse"), "3 1 4 1 5", target="5 1 4 1 3")
    assert result.tokens == ["3", "1", "4", "1", "5", "<eos>"]
    assert result.target_tokens == ["<bos>", "5", "1", "4", "1", "3"]
    cross = result.layer(-1, "cross")  # [head, target, source]
    anti_diagonal = torch.tensor([cross[:, t, 4 - t].max() for t in range(5)])
    assert float(anti_diagonal.min()) > 0.8
    # without a target, the decoder reads the model's own answer, which is right
    generated = capture(_load("reverse"), "2 7 1 8")
    assert generated.target_tokens == ["<bos>", "8", "1", "7", "2"]


def test_sample_readme_lists_the_checkpoints():
    readme = (TOY / "README.md").read_text(encoding="utf-8")
    for name in SHIPPED:
        assert f"attnviz train {name}" in readme


# -- the commands on the shipped checkpoints --------------------------------------------------------


def test_heatmap_command_on_the_shipped_reverse_model(capsys, tmp_path):
    from cli_helpers import run_cli
    from figure_helpers import read_svg

    out = tmp_path / "reverse-cross.svg"
    args = ("heatmap", "3 1 4 1 5", "--model", TOY / "reverse", "--cross", "--target", "5 1 4 1 3")
    result = run_cli(capsys, *args, "--layer", "1", "--head", "2", "--out", out)
    assert result.exit_code == 0, result.stderr
    figure = read_svg(out)
    assert figure.texts[:6] == ["3", "1", "4", "1", "5", "<eos>"]  # keys: the source
    assert figure.texts[7:13] == ["<bos>", "5", "1", "4", "1", "3"]  # queries: the target
    # the same head, saved as a capture, holds the anti-diagonal the figure shows
    saved = tmp_path / "reverse.safetensors"
    result = run_cli(
        capsys, "capture", "3 1 4 1 5", "--model", TOY / "reverse", "--target", "5 1 4 1 3", "--out", saved
    )
    assert result.exit_code == 0, result.stderr
    from attnviz.captures.attention_capture import AttentionCapture

    cross = AttentionCapture.load(saved).layer(1, "cross")[2]  # [target, source]
    assert min(float(cross[t, 4 - t]) for t in range(5)) > 0.8
    assert figure.annotations() == pytest.approx(cross.flatten().tolist(), abs=0.005)  # drawn row by row


def test_prune_command_on_the_shipped_reverse_model(capsys, tmp_path):
    import json

    from cli_helpers import run_cli

    out, report_path = tmp_path / "pruned-reverse", tmp_path / "report.json"
    args = ("prune", TOY / "reverse", "--ratio", "0.25", "--out", out, "--json", report_path)
    result = run_cli(capsys, *args, "--toy-examples", "128", "--latency-repeats", "1")
    assert result.exit_code == 0, result.stderr
    report = json.loads(report_path.read_text())
    assert report["metric"] == "accuracy" and report["metric_before"] == pytest.approx(1.0)
    assert report["heads_after"] == report["heads_before"] - 6  # 25% of 24 heads
    assert report["params_after"] < report["params_before"] and report["max_abs_diff"] <= 1e-5
    pruned = load_model(str(out), device="cpu")
    assert sum(pruned.layout().values()) == report["heads_after"]
    assert pruned.task_metrics(pruned.task_batch(200, seed=HELD_OUT_SEED))["accuracy"] == pytest.approx(
        report["metric_after"], abs=0.05
    )
