"""The ``attnviz`` command: a thin Typer layer over the library.

Each command lives in its own module and adds itself with ``register(app)``.
:func:`main` turns attnviz's typed errors into one line on stderr and a
non-zero exit code.
"""

from __future__ import annotations

import os
import sys

import typer

from attnviz import __version__
from attnviz.cli import guard
from attnviz.cli.plain_flags import use_plain_flags

app = typer.Typer(
    name="attnviz",
    help=(
        "See what a transformer's attention heads do, and which of them matter.\n\n"
        "Examples:\n\n"
        '  attnviz heatmap "The cat sat on the mat because it was tired."\n\n'
        "  attnviz stats smollm2 --json stats.json\n\n"
        "  attnviz prune minilm --ratio 0.3 --out pruned-minilm"
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"attnviz {__version__}")
        raise typer.Exit()


_debug = {"enabled": bool(os.environ.get("ATTNVIZ_DEBUG"))}


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    debug: bool = typer.Option(
        False, "--debug", help="Show the traceback of an unexpected internal error. Example: attnviz --debug stats"
    ),
) -> None:
    """See what a transformer's attention heads do, and which of them matter."""
    from attnviz.cli.console import ConsoleReporter
    from attnviz.common.progress import use_reporter

    _debug["enabled"] = _debug["enabled"] or debug
    # The library reports progress and notices through the current reporter; for the whole
    # command that is the rich one on stderr (released when the command's context closes).
    ctx.with_resource(use_reporter(ConsoleReporter()))


def _register_commands() -> None:
    from attnviz.cli import (
        align_cmd,
        capture_cmd,
        circuit_cmd,
        diff_cmd,
        env_cmd,
        explain_cmd,
        heads_cmd,
        heatmap_cmd,
        models_cmd,
        patch_cmd,
        prune_cmd,
        report_cmd,
        samples_cmd,
        stats_cmd,
        train_cmd,
    )

    for module in (
        heatmap_cmd,
        capture_cmd,
        stats_cmd,
        diff_cmd,
        heads_cmd,
        patch_cmd,
        circuit_cmd,
        prune_cmd,
        train_cmd,
        report_cmd,
        explain_cmd,
        align_cmd,
        models_cmd,
        samples_cmd,
        env_cmd,
    ):
        module.register(app)


_register_commands()
use_plain_flags(app)  # no <bool> placeholders in --help
# Every command: checked arguments, protected inputs, all-or-nothing outputs (attnviz.cli.guard).
guard.guard_commands(app)


def main() -> None:
    """Console-script entry point: every failure is one ``error:`` line and a non-zero exit (see cli/guard.py)."""
    _debug["enabled"] = bool(os.environ.get("ATTNVIZ_DEBUG"))
    code = guard.run(app, debug=lambda: _debug["enabled"])
    if code:
        sys.exit(code)
