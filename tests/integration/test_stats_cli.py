"""``attnviz stats`` as a user runs it: outputs, several checkpoints, and bad input."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli

from attnviz.models.hf import load_hf_model
from attnviz.stats import STATISTIC_NAMES, compute_statistics

TEXTS = ["The cat sat on the mat because it was tired.", "Dogs bark.", "Where did you learn to cook like that?"]


def test_json_csv_and_plot_match_the_library(capsys, tmp_path, tiny_model_dirs):
    model = str(tiny_model_dirs["bert"])
    data = tmp_path / "texts.jsonl"
    data.write_text("\n".join(json.dumps({"text": t, "label": i}) for i, t in enumerate(TEXTS)) + "\n")
    out_json, out_csv, out_plot = tmp_path / "s.json", tmp_path / "s.csv", tmp_path / "s.png"
    result = run_cli(
        capsys,
        "stats",
        model,
        "--data",
        data,
        "--json",
        out_json,
        "--csv",
        out_csv,
        "--plot",
        out_plot,
        "--batch-size",
        "2",
        "--sort",
        "entropy",
        "--limit",
        "3",
    )
    assert result.exit_code == 0, result.stderr
    record = json.loads(out_json.read_text())
    assert record["model"] == model and record["num_examples"] == 3
    assert record["num_layers"] == 2 and record["num_heads"] == 4 and len(record["heads"]) == 8

    expected = compute_statistics(load_hf_model(model, name=model), TEXTS, progress=False)
    assert record["num_tokens"] == expected.num_tokens
    for row in record["heads"]:
        for name in STATISTIC_NAMES:
            assert row[name] == pytest.approx(float(expected.matrix(name)[row["layer"], row["head"]]), abs=1e-6)
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 8
    assert float(rows[5]["first_token"]) == pytest.approx(record["heads"][5]["first_token"])
    assert out_plot.read_bytes()[:4] == b"\x89PNG"
    assert str(out_json) in result.stdout  # written paths go to stdout
    assert "heads:" in result.stderr and "collapsed" in result.stderr  # summary line


def test_several_checkpoints_give_a_list_and_an_evolution_plot(capsys, tmp_path, tiny_model_dirs):
    a, b = str(tiny_model_dirs["bert"]), str(tiny_model_dirs["llama"])
    out_json, out_plot = tmp_path / "evolution.json", tmp_path / "evolution.svg"
    result = run_cli(
        capsys,
        "stats",
        a,
        b,
        "--text",
        TEXTS[0],
        "--text",
        TEXTS[1],
        "--json",
        out_json,
        "--plot",
        out_plot,
        "--no-table",
    )
    assert result.exit_code == 0, result.stderr
    records = json.loads(out_json.read_text())
    assert [r["model"] for r in records] == [a, b]
    assert [r["causal"] for r in records] == [False, True]
    assert "<svg" in out_plot.read_text()[:500]
    assert "across checkpoints" in result.stderr


def test_absolute_preset_by_its_former_name_and_threshold_override_reach_the_json(capsys, tmp_path, tiny_model_dirs):
    out_json = tmp_path / "s.json"
    result = run_cli(
        capsys,
        "stats",
        str(tiny_model_dirs["gpt2"]),
        "--text",
        TEXTS[0],
        "--preset",
        "seed",
        "--unfocused-max-weight",
        "0.25",
        "--json",
        out_json,
        "--flagged-only",
    )
    assert result.exit_code == 0, result.stderr
    thresholds = json.loads(out_json.read_text())["thresholds"]
    assert thresholds["preset"] == "absolute" and thresholds["collapsed_entropy"] == 1.0
    assert thresholds["unfocused_max_weight"] == 0.25 and thresholds["collapsed_max_weight"] is None
    # the former name works, but not silently; the help names only the presets --preset offers
    assert "warning: threshold preset 'seed' is the former name of 'absolute': give absolute" in result.stderr
    help_text = run_cli(capsys, "stats", "--help").stdout
    assert "seed:" not in help_text and "(seed " not in help_text and "absolute: off" in " ".join(help_text.split())
    # every head of the absolute rule: collapsed iff entropy < 1.0 nats
    for head in json.loads(out_json.read_text())["heads"]:
        assert ("collapsed" in head["flags"]) == (head["entropy"] < 1.0)


def test_help_lists_thresholds_with_examples(capsys):
    result = run_cli(capsys, "stats", "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for option in (
        "--collapsed-max-weight",
        "--unfocused-normalized-entropy",
        "--preset",
        "--first-token-min",
        "--flagged-only",
        "--sort",
        "--json",
        "--csv",
        "--plot",
        "--batch-size",
        "--local-window",
    ):
        assert option in text
    assert "Example" in text


@pytest.mark.parametrize(
    "make_args, fragment",
    [
        (lambda tmp: ["--data", tmp / "missing.txt"], "does not exist"),
        (lambda tmp: ["--data", _write(tmp / "empty.txt", "\n  \n")], "empty"),
        (lambda tmp: ["--data", _write(tmp / "no_text.jsonl", '{"sentence": "hi"}\n')], '"text" field'),
        (lambda tmp: ["--collapsed-max-weight", "1.5"], "between 0 and 1"),
        (lambda tmp: ["--collapsed-entropy", "-1"], "nats"),
        (lambda tmp: ["--preset", "strict"], "unknown threshold preset"),
        (lambda tmp: ["--sort", "bogus"], "unknown statistic"),
        (lambda tmp: ["--json", tmp / "stats.txt"], "unsupported output file type"),
        (lambda tmp: ["--batch-size", "0"], "--batch-size"),
    ],
    ids=[
        "missing-file",
        "empty-file",
        "jsonl-without-text",
        "threshold-range",
        "negative-entropy",
        "unknown-preset",
        "unknown-statistic",
        "bad-suffix",
        "batch-size",
    ],
)
def test_bad_input_is_one_clear_line(capsys, tmp_path, make_args, fragment):
    """Checked before any model loads (a load would print its loading and model lines first): one line on stderr,
    exit code ≠ 0, no traceback."""
    result = run_cli(capsys, "stats", "minilm", *make_args(tmp_path))
    assert_clean_error(result, fragment)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def _write(path, text):
    path.write_text(text)
    return path


def test_text_that_tokenises_to_nothing_is_refused_and_nothing_is_written(capsys, tmp_path, tiny_model_dirs):
    data = _write(tmp_path / "data.txt", "A real sentence.\n\u200b\u200b\n")
    out_json = _write(tmp_path / "old.json", "keep me")
    result = run_cli(capsys, "stats", str(tiny_model_dirs["bert"]), "--data", data, "--json", out_json)
    assert_clean_error(result, "tokenises to nothing")
    assert out_json.read_text() == "keep me"


def test_output_may_not_overwrite_the_data(capsys, tmp_path):
    data = _write(tmp_path / "data.csv", "hello there\n")
    result = run_cli(capsys, "stats", "minilm", "--data", data, "--csv", data)
    assert_clean_error(result, "overwrite")
    assert data.read_text() == "hello there\n"


def test_error_from_a_fresh_process(tmp_path, capsys):
    missing = tmp_path / "nope.txt"
    result = run_cli(capsys, "stats", "--data", missing, subprocess=True, timeout=120)
    assert result.exit_code != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0  # one line
    assert "does not exist" in result.stderr and str(missing) in result.stderr


def test_statistics_figure_marks_flagged_heads():
    """The renderer draws from tensors: one panel per statistic, one marker per flagged head."""
    from attnviz.render.stats_plots import evolution_figure, statistics_figure

    matrices = {name: torch.rand(3, 4) for name in STATISTIC_NAMES}
    matrices["entropy"][2, 3] = float("nan")  # a pruned head stays blank
    flags = {"collapsed": torch.zeros(3, 4, dtype=torch.bool), "first-token-sink": torch.zeros(3, 4, dtype=torch.bool)}
    flags["collapsed"][0, 1] = flags["collapsed"][2, 2] = True
    flags["first-token-sink"][1, 0] = True
    figure = statistics_figure(matrices, flags, title="t")
    panels = [ax for ax in figure.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == [name.replace("_", " ") for name in STATISTIC_NAMES]
    markers = {ax.get_title(): sum(len(c.get_offsets()) for c in ax.collections) for ax in panels}
    assert markers["entropy"] == 2 and markers["max weight"] == 2 and markers["first token"] == 1
    assert markers["diagonal"] == 0
    evolution = evolution_figure(["a", "b"], [matrices, matrices], [{"collapsed": 2}, {"collapsed": 1}])
    assert "flagged heads" in [ax.get_title() for ax in evolution.axes]


def test_terminal_tables_fit_narrow_terminals_and_show_the_library_numbers(tiny_model_dirs):
    from rich.console import Console

    from attnviz.stats import detect_heads
    from attnviz.stats.tables import COMPACT_STATISTICS, evolution_table, head_rows, head_table, table_statistics

    assert table_statistics(80) == COMPACT_STATISTICS and table_statistics(140) == STATISTIC_NAMES
    loaded = load_hf_model(str(tiny_model_dirs["gpt2"]), device="cpu")
    stats = compute_statistics(loaded, ["The cat sat on the mat.", "A dog barked."], progress=False)
    detection = detect_heads(stats)
    console = Console(width=80, record=True, color_system=None)
    console.print(head_table(stats, head_rows(stats, detection), statistics=table_statistics(80)))
    console.print(evolution_table([(stats, detection)], statistics=table_statistics(80)))
    lines = console.export_text().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    # the evolution row holds each statistic's mean over all heads
    row = next(line for line in lines if line.startswith(stats.model.rsplit("/", 1)[-1]))
    means = [f"{float(stats.matrix(name).nanmean()):.2f}" for name in COMPACT_STATISTICS]
    assert row.split()[1 : 1 + len(means)] == means


def test_text_file_is_read_whole_as_one_text(capsys, tmp_path, tiny_model_dirs):
    lines = ["the cat sat on the mat.", "a dog ran through the park.", "it rained all day."]
    book = tmp_path / "book.txt"
    book.write_text("\n".join(lines) + "\n")
    whole, per_line = tmp_path / "whole.json", tmp_path / "lines.json"
    model = str(tiny_model_dirs["gpt2"])
    assert run_cli(capsys, "stats", model, "--text-file", book, "--json", whole).exit_code == 0
    assert run_cli(capsys, "stats", model, "--data", book, "--json", per_line).exit_code == 0
    one, three = json.loads(whole.read_text()), json.loads(per_line.read_text())
    assert (one["num_examples"], three["num_examples"]) == (1, 3)
    # the same words in one text: one [CLS] … [SEP] pair (MiniLM's tokenizer) instead of three
    assert one["num_tokens"] == three["num_tokens"] - 2 * 2
    (tmp_path / "empty.txt").write_text("\n\n")
    result = run_cli(capsys, "stats", model, "--text-file", tmp_path / "empty.txt")
    assert_clean_error(result, "text file", "is empty: give a file with some text")
    result = run_cli(capsys, "stats", model, "--text-file", "-", "--data", "-", stdin="a b c\n", subprocess=True)
    assert_clean_error(result, "standard input ('-') can be read once")
