"""The library reports through the current reporter: Python warnings by default, rich lines on the CLI."""

from __future__ import annotations

import warnings

import pytest
from cli_helpers import run_cli
from figure_helpers import read_svg

from attnviz.common.progress import AttnvizWarning, Reporter, progress_bar, status, use_reporter, warn


class Collecting(Reporter):
    def __init__(self) -> None:
        self.messages: list[str] = []

    def warning(self, message: str) -> None:
        self.messages.append(message)


def test_default_reporter_warns_and_stays_silent(capsys):
    with pytest.warns(AttnvizWarning, match="truncated"):
        warn("3 texts were truncated")
    with status("working"), progress_bar() as bar:
        task = bar.add_task("loop", total=2, status="")
        bar.update(task, advance=2)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_installed_reporter_receives_notices_and_is_restored():
    collecting = Collecting()
    with use_reporter(collecting), warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing may reach the warnings module meanwhile
        warn("one")
        warn("two")
    assert collecting.messages == ["one", "two"]
    with pytest.warns(AttnvizWarning):
        warn("three")
    assert collecting.messages == ["one", "two"]


def test_cli_prints_library_warnings_as_one_line(tmp_path, capsys):
    long_text = " ".join(["word"] * 40)
    result = run_cli(capsys, "heatmap", long_text, "--max-length", "8", "--out", tmp_path / "h.svg")
    assert result.exit_code == 0, result.stderr
    warning_lines = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warning_lines == ["warning: 1 text longer than 8 tokens was truncated to 8"]
    assert read_svg(tmp_path / "h.svg").texts[:8] == ["[CLS]", *["word"] * 6, "[SEP]"]  # the 8 tokens drawn


def test_off_a_terminal_progress_prints_a_line_per_step_at_most_every_few_seconds(capsys, monkeypatch):
    """stderr in a log: the phase's first line, then a line per step (throttled), and always the last step."""
    from attnviz.cli.console import PhaseLines

    monkeypatch.setattr(PhaseLines, "STEP_LINE_SECONDS", 0.0)
    with PhaseLines() as bar:
        task = bar.add_task("statistics · m · layers", total=3, status="")
        for _ in range(3):
            bar.advance(task)
        bar.update(task, status="12 tokens")  # a status alone adds no line
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "statistics · m · layers (3 steps) …",
        "statistics · m · layers: 1/3",
        "statistics · m · layers: 2/3",
        "statistics · m · layers: 3/3",
    ]
    monkeypatch.setattr(PhaseLines, "STEP_LINE_SECONDS", 3600.0)
    with PhaseLines() as bar:
        task = bar.add_task("rows", total=30, status="")
        for _ in range(30):
            bar.update(task, advance=1, status="layer")
    assert capsys.readouterr().err.splitlines() == ["rows (30 steps) …", "rows: 1/30 · layer", "rows: 30/30 · layer"]
