"""``attnviz heatmap`` and ``attnviz capture`` as a user runs them."""

from __future__ import annotations

import os

import pytest
from cli_helpers import assert_clean_error, run_cli
from figure_helpers import distinct_colours, png_pixels, read_svg

from attnviz.captures.attention_capture import AttentionCapture

SENTENCE = "The cat sat on the mat because it was tired."


def test_readme_command_end_to_end(tmp_path, capsys):
    """The README's first command, in a fresh process, offline, with no other flag."""
    result = run_cli(capsys, "heatmap", SENTENCE, subprocess=True, cwd=tmp_path, timeout=300)
    assert result.exit_code == 0, result.stderr
    path = tmp_path / "heatmap.png"
    assert result.stdout.strip().endswith("heatmap.png")
    assert "6 layers × 12 heads" in result.stderr
    pixels = png_pixels(path)  # [height, width, RGBA]
    assert pixels.shape[0] > 500 and pixels.shape[1] > 500 and distinct_colours(pixels) > 100


def test_help_explains_every_option_with_examples(capsys):
    result = run_cli(capsys, "--help")
    assert result.exit_code == 0 and "heatmap" in result.stdout and "Examples" in result.stdout
    result = run_cli(capsys, "heatmap", "--help")
    assert result.exit_code == 0
    text = result.stdout
    for option in (
        "--model",
        "--layer",
        "--head",
        "--out",
        "--annotate",
        "--words",
        "--cross",
        "--target",
        "--from-capture",
        "--device",
        "--dtype",
        "--max-length",
        "--no-truncate",
    ):
        assert option in text, option
    assert text.count("Example") >= 10


def test_capture_then_render_without_model(capsys, tmp_path):
    out = tmp_path / "cat.safetensors"
    result = run_cli(capsys, "capture", SENTENCE, "--out", out)
    assert result.exit_code == 0, result.stderr
    capture = AttentionCapture.load(out)
    assert capture.model == "minilm" and capture.tokens[2] == "cat"
    figure = tmp_path / "from-capture.svg"
    result = run_cli(capsys, "heatmap", "--from-capture", out, "--layer", "0", "--head", "mean", "--out", figure)
    assert result.exit_code == 0, result.stderr
    assert figure.read_bytes().lstrip().startswith((b"<?xml", b"<svg"))


def test_words_option_and_single_head(capsys, tmp_path):
    out = tmp_path / "words.svg"
    result = run_cli(
        capsys, "heatmap", "Unbelievably tokenized sentence.", "--words", "--layer", "1", "--head", "2", "--out", out
    )
    assert result.exit_code == 0, result.stderr
    figure = read_svg(out)
    words = ["[CLS]", "unbelievably", "tokenized", "sentence", ".", "[SEP]"]
    assert figure.texts[: len(words)] == words and figure.texts.count("unbelievably") == 2  # keys and queries
    assert figure.texts[-1].endswith("layer 1, head 2") and figure.images == 2  # one panel and its colour bar
    # one annotated weight per (query word, key word): each row of the word-level pattern sums to 1
    weights = figure.annotations()
    assert len(weights) == len(words) ** 2
    for row in range(len(words)):
        assert sum(weights[row * len(words) : (row + 1) * len(words)]) == pytest.approx(1.0, abs=0.04)


def test_cross_attention_heatmap(capsys, tmp_path, tiny_model_dirs):
    out = tmp_path / "cross.svg"
    result = run_cli(
        capsys,
        "heatmap",
        "The cat sat.",
        "--model",
        tiny_model_dirs["t5"],
        "--cross",
        "--target",
        "Le chat.",
        "--out",
        out,
    )
    assert result.exit_code == 0, result.stderr
    figure = read_svg(out)
    # T5's last cross-attention layer, all 4 heads: the 5 target tokens (queries) attend to the 6 source tokens
    assert "6 tokens → 5 target tokens" in " ".join(result.stderr.split())  # rich may wrap the line
    assert figure.panel_titles() == [(1, head) for head in range(4)] and figure.images == 4 + 1  # and a colour bar
    assert {"le", "chat", "the", "cat", "sat"} <= set(figure.texts) and "cross-attention layer 1" in figure.texts[-2]
    result = run_cli(capsys, "heatmap", "The cat sat.", "--model", tiny_model_dirs["t5"], "--cross", "--out", out)
    assert_clean_error(result, "--target")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["heatmap", SENTENCE, "--model", "no-such-model-anywhere"], "unknown model"),
        (["heatmap", SENTENCE, "--model", "./missing/dir"], "does not exist"),
        (["heatmap", "   "], "empty"),
        (["heatmap", SENTENCE, "--layer", "6"], "out of range"),
        (["heatmap", SENTENCE, "--head", "12"], "out of range"),
        (["heatmap", SENTENCE, "--layer", "x"], "not a number"),
        (["heatmap", SENTENCE, "--out", "{tmp}/missing/out.png"], "does not exist"),
        (["heatmap", SENTENCE, "--out", "{tmp}/out.jpg"], "unsupported output file type"),
        (["heatmap", SENTENCE, "--device", "tpu"], "unknown device"),
        (["heatmap", "--from-capture", "{tmp}/nothing.safetensors"], "does not exist"),
        (["heatmap", SENTENCE, "--cross"], "--target"),
        (["capture", SENTENCE, "--out", "{tmp}/cap.png"], "unsupported output file type"),
    ],
)
def test_bad_input_gives_one_clear_line(capsys, tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = run_cli(capsys, *args)
    assert_clean_error(result, message)
    # at most the loading line and the model line before the one error line
    assert len(result.stderr.strip().splitlines()) <= 3
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob("*.tmp*"))


def test_unwritable_directory(capsys, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root)")
        result = run_cli(capsys, "heatmap", SENTENCE, "--out", locked / "x.png")
        assert_clean_error(result, "not writable")
    finally:
        locked.chmod(0o700)


def test_long_text_is_truncated_with_warning_or_refused(capsys, tmp_path):
    long_text = " ".join(["word"] * 600)
    out = tmp_path / "long.png"
    result = run_cli(capsys, "heatmap", long_text, "--layer", "0", "--head", "0", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert "truncated to 512" in " ".join(result.stderr.split())
    result = run_cli(capsys, "heatmap", long_text, "--no-truncate", "--out", tmp_path / "refused.png")
    assert_clean_error(result, "more than the limit of 512")
    assert not (tmp_path / "refused.png").exists()
