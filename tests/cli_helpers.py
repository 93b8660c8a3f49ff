"""Running the ``attnviz`` entry point in-process, as a user would from a shell."""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(capsys, *args: str) -> CliResult:
    """Call ``attnviz.cli.app.main`` with ``args`` and return its exit code and output."""
    from attnviz.cli.app import main

    capsys.readouterr()
    old_argv = sys.argv
    sys.argv = ["attnviz", *map(str, args)]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = old_argv
    out = capsys.readouterr()
    return CliResult(code, out.out, out.err)


def assert_clean_error(result: CliResult, *fragments: str) -> None:
    """Non-zero exit, no traceback, and the message contains ``fragments``."""
    assert result.exit_code != 0, result
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    message = " ".join(result.stderr.split())
    for fragment in fragments:
        assert fragment.lower() in message.lower(), message
