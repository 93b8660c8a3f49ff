"""Every option is checked before any model runs, whatever other options come with it.

Each case replaces the step that would run a model (or load one, where the option needs no model) with one
that fails the test: the command must refuse the option with one ``error:`` line before reaching it, and print
nothing on stdout (no table of a comparison that should not have run).
"""

from __future__ import annotations

import pytest
from cli_helpers import assert_clean_error, run_cli

TEXT = "The cat sat on the mat."


def _never(name):
    def ran(*args, **kwargs):
        raise AssertionError(f"{name} ran before the options were checked")

    return ran


@pytest.fixture
def no_runs(monkeypatch):
    """Comparisons, statistics, probes and captures fail the test if they start."""
    import attnviz.captures.query_rows
    import attnviz.cli.capturing
    import attnviz.compare.inputs
    import attnviz.compare.models
    import attnviz.heads
    import attnviz.stats.measure

    monkeypatch.setattr(attnviz.compare.inputs, "compare_inputs", _never("compare_inputs"))
    monkeypatch.setattr(attnviz.compare.models, "compare_models", _never("compare_models"))
    monkeypatch.setattr(attnviz.stats.measure, "measure_model", _never("measure_model"))
    monkeypatch.setattr(attnviz.heads, "head_functions", _never("head_functions"))
    monkeypatch.setattr(attnviz.captures.query_rows, "capture_query_rows", _never("capture_query_rows"))
    monkeypatch.setattr(attnviz.cli.capturing, "capture_text", _never("capture_text"))


def test_diff_against_refuses_a_layer_before_comparing(capsys, no_runs, tiny_dirs):
    result = run_cli(capsys, "diff", tiny_dirs["bert"], "--text", TEXT, "--against", "The dog sat on the mat.",
                     "--layer", "9")  # fmt: skip
    assert_clean_error(result, "--layer 9", "0–1")
    assert not result.stdout.strip()


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--head", "4"], ["--head 4", "0–3"]),
        (["--layer", "-1"], ["--layer -1"]),
        (["--stack", "cross"], ["--stack cross", "self"]),
    ],
)
def test_diff_against_refuses_a_view_the_model_lacks(capsys, no_runs, tiny_dirs, args, fragments):
    result = run_cli(capsys, "diff", tiny_dirs["bert"], "--text", TEXT, "--against", "A dog.", *args)
    assert_clean_error(result, *fragments)


def test_diff_of_two_models_refuses_layer_head_and_stack(capsys, no_runs, tiny_dirs):
    result = run_cli(capsys, "diff", tiny_dirs["bert"], tiny_dirs["bert"], "--text", TEXT, "--layer", "0")
    assert_clean_error(result, "--layer and --head", "--against")
    result = run_cli(capsys, "diff", tiny_dirs["bert"], tiny_dirs["bert"], "--text", TEXT, "--stack", "decoder")
    assert_clean_error(result, "--stack decoder")
    assert not result.stdout.strip()


def test_heatmap_query_refuses_a_bad_size_before_loading(capsys, monkeypatch):
    import attnviz.models.specs

    monkeypatch.setattr(attnviz.models.specs, "load_model", _never("load_model"))
    result = run_cli(capsys, "heatmap", TEXT, "--query", "last", "--max-bytes", "5XB", "--terminal")
    assert_clean_error(result, "--max-bytes", "5XB")


def test_heatmap_image_refuses_its_options_before_loading(capsys, monkeypatch, tmp_path):
    from PIL import Image

    import attnviz.models.specs

    monkeypatch.setattr(attnviz.models.specs, "load_model", _never("load_model"))
    picture = tmp_path / "grey.png"
    Image.new("RGB", (32, 32), (128, 128, 128)).save(picture)
    out = tmp_path / "h.png"
    result = run_cli(capsys, "heatmap", "--image", picture, "--model", "toy-odd-patch", "--query", "1,x", "--out", out)
    assert_clean_error(result, "--query '1,x'")
    result = run_cli(capsys, "heatmap", "--image", picture, "--model", "toy-odd-patch", "--words", "--out", out)
    assert_clean_error(result, "--words")


@pytest.mark.parametrize("command", [["stats", "--text", TEXT], ["heads"]])
def test_a_stack_the_model_lacks_is_refused_before_it_runs(capsys, no_runs, tiny_dirs, command):
    name, *rest = command
    result = run_cli(capsys, name, tiny_dirs["bert"], *rest, "--stack", "decoder")
    assert_clean_error(result, "no decoder attention")
