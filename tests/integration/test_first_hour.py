"""A new user's first hour: the model named is the model run, products on stdout, honest latency, true summaries.

Every command runs through the one harness (``cli_helpers.run_cli``), mostly in-process: there stderr is not a
terminal, as in a log or CI, so the phase lines are what a user of such a run sees.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli

from attnviz.captures.attention_capture import AttentionCapture, capture
from attnviz.common.errors import ModelSpecError
from attnviz.common.wording import layers_and_heads, plural
from attnviz.models.specs import load_model, resolve_spec

REVERSE_INPUT = ("3 1 4 1 5", "5 1 4 1 3")


def _cross_patterns(path: Path) -> torch.Tensor:
    """``[layer, head, query, key]`` cross-attention of a capture file."""
    loaded = AttentionCapture.load(path)
    return torch.stack(loaded.patterns["cross"])


def test_a_trained_model_is_analysed_by_the_name_the_readme_gives_it(capsys, tmp_path, monkeypatch):
    """``attnviz train reverse --out toy-reverse`` then ``--model toy-reverse``: the trained weights, not the shipped."""
    monkeypatch.chdir(tmp_path)
    trained = run_cli(capsys, "train", "reverse", "--out", "toy-reverse", "--seed", "3", "--steps", "5")
    assert trained.exit_code == 0, trained.stderr
    assert trained.stdout.splitlines() == ["toy-reverse"]  # the product: the path written
    assert "--model ./toy-reverse" in " ".join(trained.stderr.split())

    text, target = REVERSE_INPUT
    by_name = run_cli(capsys, "capture", text, "--model", "toy-reverse", "--target", target, "--out", "a.safetensors")
    assert by_name.exit_code == 0, by_name.stderr
    stderr = " ".join(by_name.stderr.split())
    notices = [line for line in by_name.stderr.splitlines() if "a shipped model's name" in line]
    expected = (
        "note: 'toy-reverse' is a path here and a shipped model's name: loading the path ./toy-reverse "
        "(for the shipped model, run from another directory)"
    )
    assert notices == [expected]  # one line
    assert "./toy-reverse (encoder-decoder)" in stderr  # and the summary line says which

    from_directory = capture(load_model(str(tmp_path / "toy-reverse")), text, target=target)
    monkeypatch.chdir(tmp_path.parent)  # from elsewhere the short name is the shipped checkpoint
    shipped = capture(load_model("toy-reverse"), text, target=target)
    patterns = _cross_patterns(tmp_path / "a.safetensors")
    assert torch.allclose(patterns, torch.stack(from_directory.patterns["cross"]), atol=1e-6)
    assert (patterns - torch.stack(shipped.patterns["cross"])).abs().max() > 0.05  # not the shipped weights

    monkeypatch.chdir(tmp_path)
    default = run_cli(capsys, "train", "sort", "--steps", "2")
    assert default.exit_code == 0, default.stderr
    assert default.stdout.splitlines() == ["toy-sort-trained"]  # never a shipped model's name
    assert resolve_spec("toy-sort").kind == "named" and resolve_spec("toy-sort-trained").kind == "path"


def test_spec_resolution_prefers_an_existing_path_and_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_spec("toy-copy").kind == "named" and resolve_spec("toy-copy").source.startswith("named model")
    (tmp_path / "toy-copy").mkdir()
    resolved = resolve_spec("toy-copy")
    assert (resolved.kind, resolved.shadows, resolved.name) == ("path", True, "./toy-copy")
    assert resolved.source == "directory ./toy-copy"
    assert resolve_spec("./toy-copy").name == "./toy-copy" and not resolve_spec("MiniLM").shadows
    with pytest.raises(ModelSpecError, match="unknown model 'org/model-name'"):  # not in the local cache
        resolve_spec("org/model-name")


def test_layers_and_heads_wording():
    assert layers_and_heads([12] * 6) == "6 layers × 12 heads"
    assert layers_and_heads([4]) == "1 layer × 4 heads"
    assert layers_and_heads([1, 1]) == "2 layers × 1 head"
    assert layers_and_heads([12, 8, 11, 12, 12, 9]) == "6 layers, 8–12 heads (64 in all)"
    assert plural(1, "token") == "1 token" and plural(1024, "token") == "1,024 tokens"


def test_models_table_is_on_stdout(capsys):
    result = run_cli(capsys, "models")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    lines = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 2}
    assert "toy-reverse" in lines and "minilm" in lines
    assert "1 layer × 4 heads" in lines["toy-previous-token"]  # the one-layer toy, in the singular


def test_no_help_shows_a_bool_placeholder(capsys):
    from attnviz.cli.app import app

    commands = [[info.name] for info in app.registered_commands] + [["cache"], ["cache", "clear"], []]
    for command in commands:
        result = run_cli(capsys, *command, "--help")
        assert result.exit_code == 0, (command, result.stderr)
        assert "Usage:" in result.stdout
        assert "<bool>" not in result.stdout, command
    assert "--preset" in (help_text := run_cli(capsys, "stats", "--help").stdout)
    assert "absolute" in help_text and "seed (" not in help_text


def _paths(stdout: str) -> set[Path]:
    return {Path(line).resolve() for line in stdout.splitlines() if line.strip()}


def test_every_writing_command_prints_exactly_its_paths_on_stdout(capsys, tmp_path, tiny_dirs, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bert = str(tiny_dirs["bert"])
    text = "The cat sat on the mat."
    runs = {
        "heatmap": (["heatmap", text, "--model", bert, "--out", "h.svg"], ["h.svg"]),
        "capture": (["capture", text, "--model", bert, "--out", "c.safetensors"], ["c.safetensors"]),
        "stats": (
            ["stats", bert, "--text", text, "--json", "s.json", "--csv", "s.csv", "--plot", "s.png", "--no-table"],
            ["s.json", "s.csv", "s.png"],
        ),
        "heads": (["heads", bert, "--json", "f.json", "--plot", "f.png", "--no-table"], ["f.json", "f.png"]),
        "prune": (
            ["prune", bert, "--count", "3", "--importance", "entropy", "--text", text, "--out", "p", "--json", "p.json"]
            + ["--latency-tokens", "8", "--latency-repeats", "2"],
            ["p", "p.json"],
        ),
        "report": (["report", "toy-previous-token", "--out", "r.html", "--examples", "1"], ["r.html"]),
    }
    for name, (args, expected) in runs.items():
        result = run_cli(capsys, *args)
        assert result.exit_code == 0, (name, result.stderr)
        assert _paths(result.stdout) == {(tmp_path / path).resolve() for path in expected}, (name, result.stdout)
        assert all((tmp_path / path).exists() for path in expected)
        if name in ("stats", "report"):  # stderr is no terminal here: a line per phase, not silence
            assert " …" in result.stderr, result.stderr

    # the pruned tiny BERT keeps different head counts per layer: the summary says so
    pruned_layout = load_model(str(tmp_path / "p")).layout()
    counts = [pruned_layout[site] for site in sorted(pruned_layout)]
    assert min(counts) != max(counts)
    result = run_cli(capsys, "heatmap", text, "--model", "p", "--out", "pruned.png")
    assert result.exit_code == 0, result.stderr
    assert f"self attention: {layers_and_heads(counts)}" in " ".join(result.stderr.split())


def test_prune_under_load_reports_no_slowdown_that_is_noise(capsys, tmp_path, tiny_dirs):
    """Two busy loops (one per core) while ``prune`` times the original and the pruned model."""
    busy = "import time\nend = time.time() + 240\nwhile time.time() < end:\n    pass\n"  # bounded in time
    loops = [subprocess.Popen([sys.executable, "-c", busy]) for _ in range(2)]
    try:
        time.sleep(0.5)
        result = run_cli(
            capsys,
            "prune",
            str(tiny_dirs["llama"]),
            "--count",
            "2",
            "--importance",
            "entropy",
            "--text",
            "The cat sat on the mat because it was tired.",
            "--out",
            tmp_path / "p",
            "--json",
            tmp_path / "p.json",
            "--no-transformers-copy",
            "--latency-tokens",
            "64",
            "--latency-repeats",
            "10",
        )
        still_loaded = all(loop.poll() is None for loop in loops)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    assert result.exit_code == 0, result.stderr
    assert still_loaded  # the measurement ran under the load
    report = json.loads((tmp_path / "p.json").read_text())
    low, high = report["latency_before_ms_range"]
    assert low == report["latency_before_ms"] <= high and report["latency_rounds"] == 10
    assert report["latency_after_ms_range"][0] == report["latency_after_ms"]
    slowdown = report["latency_after_ms"] > report["latency_before_ms"]
    assert not (report["latency_conclusive"] and slowdown), report  # no significant slowdown reported
    stderr = " ".join(result.stderr.split())
    if not report["latency_conclusive"]:
        assert "no clear difference" in stderr


def test_a_flat_stats_panel_says_why(tmp_path):
    """A statistic 0 for every head (no special tokens in the texts) is no silent black panel."""
    from figure_helpers import read_svg

    from attnviz.render.stats_plots import save_figure, statistics_figure

    matrices = {
        "entropy": torch.linspace(0.1, 2.0, 12).reshape(3, 4),  # [layer, head], varies: nothing to explain
        "special_tokens": torch.zeros(3, 4),  # softmax weights are never 0: no special key was seen
        "first_token": torch.full((3, 4), 0.25),
        "diagonal": torch.full((3, 4), float("nan")),
    }
    path = save_figure(statistics_figure(matrices), tmp_path / "s.svg")
    texts = read_svg(path).texts
    joined = " ".join(texts)
    assert "0 for every head:" in joined and "no special tokens" in joined
    assert "0.25 for every head" in joined and "no values:" in joined
    assert joined.count("for every head") == 2  # the entropy panel, which varies, says nothing


def test_gguf_conversion_progress_is_attnvizs_and_transformers_settings_come_back():
    from transformers import modeling_gguf_pytorch_utils as gguf_reader
    from transformers.utils import logging as transformers_logging

    from attnviz.common.progress import Reporter, use_reporter
    from attnviz.models.gguf import _quiet_transformers, _tensor_progress

    class Recording(Reporter):
        def __init__(self):
            self.tasks = []

        def progress(self):
            from rich.progress import Progress

            reporter = self

            class Recorded(Progress):
                def add_task(self, description, *args, **kwargs):
                    reporter.tasks.append((description, kwargs.get("total")))
                    return super().add_task(description, *args, **kwargs)

            return Recorded(disable=True)

    original = gguf_reader.tqdm
    transformers_logging.enable_progress_bar()
    verbosity = transformers_logging.get_verbosity()
    reporter = Recording()
    with use_reporter(reporter), _quiet_transformers():
        assert gguf_reader.tqdm is _tensor_progress
        assert not transformers_logging.is_progress_bar_enabled()
        assert list(gguf_reader.tqdm(range(5), desc="Converting and de-quantizing GGUF tensors...")) == [0, 1, 2, 3, 4]
    assert reporter.tasks == [("de-quantising the GGUF tensors", 5)]
    assert gguf_reader.tqdm is original
    assert transformers_logging.is_progress_bar_enabled() and transformers_logging.get_verbosity() == verbosity


def test_loading_a_model_names_its_source_in_one_line(capsys, tmp_path):
    """The line docs/first-steps.md shows: ``model: named model toy-reverse (/…/sample_data/toy/reverse)``."""
    from attnviz.common.texts import sample_data_path

    text, target = REVERSE_INPUT
    result = run_cli(capsys, "capture", text, "--model", "toy-reverse", "--target", target, "--out", tmp_path / "a.c")
    assert result.exit_code != 0  # an unsupported suffix: refused before anything loads, so no model line
    assert "model:" not in result.stderr
    result = run_cli(
        capsys, "capture", text, "--model", "toy-reverse", "--target", target, "--out", tmp_path / "a.safetensors"
    )
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("model:")]
    assert lines == [f"model: named model toy-reverse ({sample_data_path('toy', 'reverse')})"]


def test_counts_of_one_are_singular(capsys):
    """One pluralising helper words every count people read: ``(1 step)``, ``1 text``, ``1 example``."""
    import re

    from attnviz.cli.console import PhaseLines

    PhaseLines().add_task("scoring", total=1)
    PhaseLines().add_task("statistics", total=44)
    stderr = capsys.readouterr().err
    assert "scoring (1 step) …" in stderr and "statistics (44 steps) …" in stderr
    # no count of texts, examples or steps is written with a bare placeholder and a fixed plural, nor as "(s)"
    package = Path(__file__).resolve().parents[2] / "attnviz"
    slips = [
        f"{path.relative_to(package)}: {match.group(0)}"
        for path in package.rglob("*.py")
        for match in re.finditer(
            r"\{(?!batch\})[^{}]+\} (steps|texts|examples)\b|(model|checkpoint|text)\(s\)", path.read_text()
        )
    ]
    assert slips == [], slips
