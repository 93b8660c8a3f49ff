"""At 80 columns ``--help`` shows every option name whole, and redirected stderr is never wrapped."""

from __future__ import annotations

import re
import shutil

import pytest
from cli_helpers import run_cli
from rich.cells import cell_len


def _commands() -> list[tuple[list[str], object]]:
    """Every command and group of the CLI, as the words that name it, with its Click command."""
    import typer

    from attnviz.cli.app import app

    found = []
    pending: list[tuple[list[str], object]] = [([], typer.main.get_command(app))]
    while pending:
        words, command = pending.pop()
        found.append((words, command))
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            pending.append(([*words, name], sub))
    return found


COMMANDS = _commands()


@pytest.mark.parametrize(
    ("words", "command"), COMMANDS, ids=lambda value: " ".join(value) if isinstance(value, list) else ""
)
def test_help_at_80_columns_shows_every_option_name_whole(capsys, monkeypatch, words, command):
    monkeypatch.setenv("COLUMNS", "80")
    result = run_cli(capsys, *words, "--help")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    names = [name for param in command.params for name in (*param.opts, *param.secondary_opts) if name.startswith("-")]
    assert "--help" in result.stdout
    for name in names:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", result.stdout), f"{words} --help cuts {name}"
    assert not re.search(r"--[\w-]+…", result.stdout), "an option name cut short"


def test_redirected_stderr_keeps_each_line_whole(tmp_path, tiny_dirs):
    model = tmp_path / (
        "a-model-folder-with-a-name-long-enough-that-its-summary-line-is-far-wider-than-eighty-columns" * 2
    )
    shutil.copytree(tiny_dirs["gpt2"], model)
    result = run_cli(
        None,
        "capture",
        "The cat sat on the mat.",
        "--model",
        model,
        "--out",
        tmp_path / "c.safetensors",
        subprocess=True,
        env={"COLUMNS": None},
    )  # stderr is a pipe here, as in `attnviz … 2> log`
    assert result.exit_code == 0, result.stderr
    summary = [line for line in result.stderr.splitlines() if "self attention:" in line]
    assert len(summary) == 1 and str(model) in summary[0], result.stderr
    assert summary[0].endswith("self attention: 2 layers × 4 heads") and len(summary[0]) > 200
