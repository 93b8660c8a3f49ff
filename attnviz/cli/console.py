"""The one rich console of attnviz's command line, and the reporter that draws on it.

Everything human-facing (progress bars, tables, warnings) goes to stderr, so a
command's stdout stays clean for pipes and scripts. Only :mod:`attnviz.cli` uses this
module; the library reports through :mod:`attnviz.common.progress`, and the CLI installs
:class:`ConsoleReporter` for the whole run.
"""

from __future__ import annotations

from contextlib import AbstractContextManager as ContextManager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from attnviz.common.progress import Reporter

console = Console(stderr=True)


#: warnings of the running command, printed when it ends: after its output when it succeeds, folded
#: into its one ``error:`` line when it fails (a warning that led to the failure explains it there)
_pending_warnings: list[str] = []


def warn(message: str) -> None:
    """A one-line warning, printed when the command ends (see :func:`flush_warnings`)."""
    if message not in _pending_warnings:
        _pending_warnings.append(message)


def flush_warnings() -> None:
    """Print the warnings of the command that succeeded."""
    for message in take_warnings():
        console.print(f"[yellow]warning:[/yellow] {message}", highlight=False)


def take_warnings() -> list[str]:
    """The warnings not yet printed (and forget them): a failing command folds them into its error line."""
    taken = list(_pending_warnings)
    _pending_warnings.clear()
    return taken


def progress_bar(**kwargs) -> Progress:
    """A rich progress bar on the shared console (hidden when stderr is not a terminal)."""
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
        transient=True,
        disable=not console.is_terminal,
        **kwargs,
    )


class ConsoleReporter(Reporter):
    """Warnings, status lines and progress bars on the shared stderr console."""

    def warning(self, message: str) -> None:
        warn(message)

    def status(self, message: str) -> ContextManager[object]:
        return console.status(message)

    def progress(self) -> Progress:
        return progress_bar()
