"""``attnviz heads`` as a user runs it: the JSON contract, CSV, figures, rollout views, and bad input."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli
from figure_helpers import read_svg

TOY = "sample_data/toy/induction"


def test_json_contract_csv_and_figures_on_the_toy_model(capsys, tmp_path):
    out_json, out_csv = tmp_path / "heads.json", tmp_path / "heads.csv"
    plot, similarity = tmp_path / "heads.svg", tmp_path / "similarity.svg"
    result = run_cli(
        capsys,
        "heads",
        TOY,
        "--sequences",
        "8",
        "--json",
        out_json,
        "--csv",
        out_csv,
        "--plot",
        plot,
        "--similarity",
        similarity,
        "--similarity-examples",
        "4",
        "--sort",
        "induction",
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == [str(out_json), str(out_csv), str(plot), str(similarity)]
    record = json.loads(out_json.read_text())
    assert record["format"] == "attnviz-heads" and record["version"] == 1 and record["model"] == TOY
    assert record["probe"] == {"kind": "repeated-random-tokens", "length": 8, "sequences": 8, "seed": 0}
    assert len(record["heads"]) == 8
    for row in record["heads"]:
        assert {"stack", "layer", "head", "induction", "duplicate_token", "previous_token", "labels"} <= set(row)
        assert row["stack"] == "self" and isinstance(row["labels"], list)
        assert row["next_token"] is None  # causal model
    by_head = {(row["layer"], row["head"]): row for row in record["heads"]}
    assert by_head[1, 1]["induction"] > 0.95 and "induction" in by_head[1, 1]["labels"]
    assert by_head[0, 3]["main_label"] == "previous-token" and by_head[0, 3]["previous_token"] > 0.5
    assert max(by_head[0, h]["induction"] for h in range(4)) < 0.1
    matrix = record["similarity"]["js_divergence"]
    assert record["similarity"]["heads"][0] == ["self", 0, 0] and len(matrix) == 8
    assert all(matrix[i][i] == 0.0 and matrix[i][j] == matrix[j][i] for i in range(8) for j in range(8))
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 8 and float(rows[0]["induction"]) == pytest.approx(record["heads"][0]["induction"])
    # the probe figure: one layer × head panel per score (and its colour bar), a legend of the labels found
    probes = read_svg(plot)
    assert [t for t in probes.texts if t in ("induction", "duplicate token", "previous token")][:3] == [
        "induction",
        "duplicate token",
        "previous token",
    ]
    assert probes.images == 3 * 2 and probes.texts[-2:] == ["induction", "previous-token"]
    # the similarity figure: every head on both matrix axes and as one point of the 2-D embedding
    heads = [f"L{layer}H{head}" for layer in range(2) for head in range(4)]
    assert sorted(t for t in read_svg(similarity).texts if t in heads) == sorted(heads * 3)
    assert "IND" in result.stderr and "PRV" in result.stderr  # the layer × head grid of main labels


def test_corpus_adds_statistics_and_flags(capsys, tmp_path, tiny_model_dirs):
    out_json = tmp_path / "h.json"
    result = run_cli(
        capsys,
        "heads",
        tiny_model_dirs["bert"],
        "--length",
        "6",
        "--sequences",
        "2",
        "--text",
        "The cat sat on the mat.",
        "--text",
        "Bees dance.",
        "--json",
        out_json,
        "--labelled-only",
    )
    assert result.exit_code == 0, result.stderr
    record = json.loads(out_json.read_text())
    assert record["corpus"]["examples"] == 2
    assert all(isinstance(row["next_token"], float) for row in record["heads"])  # bidirectional encoder
    first = record["heads"][0]
    assert 0.0 <= first["statistics"]["first_token"] <= 1.0
    from attnviz.models.hf import load_hf_model
    from attnviz.stats import compute_statistics, detect_heads

    loaded = load_hf_model(str(tiny_model_dirs["bert"]), device="cpu")
    stats = compute_statistics(loaded, ["The cat sat on the mat.", "Bees dance."], progress=False)
    detection = detect_heads(stats)
    for row in record["heads"]:
        flags = detection.head_flags(row["layer"], row["head"])
        assert set(flags) <= set(row["labels"])
        assert row["statistics"]["max_weight"] == pytest.approx(
            float(stats.matrix("max_weight")[row["layer"], row["head"]]), abs=1e-6
        )


def test_rollout_view_and_capture(capsys, tmp_path, tiny_model_dirs):
    from attnviz.captures.attention_capture import AttentionCapture
    from attnviz.heads.propagation import rollout

    model = str(tiny_model_dirs["gpt2"])
    out = tmp_path / "c.safetensors"
    result = run_cli(capsys, "capture", "The cat sat on the mat.", "--model", model, "--rollout", "--out", out)
    assert result.exit_code == 0, result.stderr
    saved = AttentionCapture.load(out)
    matrix = saved.extras["rollout"]
    assert matrix.dtype == torch.float32 and matrix.shape == (len(saved.tokens), len(saved.tokens))
    torch.testing.assert_close(matrix, rollout(saved))
    assert float(matrix.triu(1).abs().max()) == 0.0  # causal
    drawn = tmp_path / "r.svg"
    result = run_cli(capsys, "heatmap", "--from-capture", out, "--view", "rollout", "--out", drawn)
    assert result.exit_code == 0, result.stderr
    figure = read_svg(drawn)  # the saved rollout, annotated on and below the diagonal (the rest is masked)
    n = len(saved.tokens)
    visible = [float(matrix[q, k]) for q in range(n) for k in range(q + 1)]  # row by row
    assert figure.annotations() == pytest.approx(visible, abs=0.005)
    assert figure.texts[:n] == saved.tokens and "attention rollout over 2 layers" in " ".join(figure.texts)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--json", "out.txt"], "unsupported output file type"),
        (["--length", "40"], "probe length of at most 12"),
        (["--plot", "same.png", "--similarity", "same.png"], "overlap"),
        (["--data", "missing.txt"], "does not exist"),
    ],
)
def test_bad_input_is_one_clear_line(capsys, tmp_path, monkeypatch, args, fragment):
    monkeypatch.chdir(tmp_path)
    import pathlib

    toy = str(pathlib.Path(__file__).resolve().parents[2] / TOY)
    result = run_cli(capsys, "heads", toy, *args)
    assert_clean_error(result, fragment)


def test_help_lists_choices_and_examples(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    result = run_cli(capsys, "heads", "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for fragment in ("induction", "duplicate_token", "--similarity", "--labelled-only", "Example: --length 30"):
        assert fragment in text


def test_flow_view_draws_short_inputs_and_refuses_long_ones(capsys, tmp_path, tiny_model_dirs):
    from attnviz.captures.attention_capture import capture
    from attnviz.heads.propagation import attention_flow
    from attnviz.models.hf import load_hf_model

    model = str(tiny_model_dirs["bert"])
    drawn = tmp_path / "flow.svg"
    result = run_cli(capsys, "heatmap", "The cat sat on the mat.", "--model", model, "--view", "flow", "--out", drawn)
    assert result.exit_code == 0, result.stderr
    flow = attention_flow(capture(load_hf_model(model, device="cpu"), "The cat sat on the mat."))  # [query, key]
    figure = read_svg(drawn)
    assert figure.annotations() == pytest.approx(flow.flatten().tolist(), abs=0.005)
    assert "attention flow over 2 layers" in " ".join(figure.texts)
    long_text = " ".join(["word"] * 40)
    result = run_cli(capsys, "heatmap", long_text, "--model", model, "--view", "flow", "--out", drawn)
    assert_clean_error(result, "at most 32 tokens", "rollout")
