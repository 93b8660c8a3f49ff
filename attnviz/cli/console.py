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


def warn(message: str) -> None:
    """Print a one-line warning."""
    console.print(f"[yellow]warning:[/yellow] {message}", highlight=False)


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

    def notice(self, message: str) -> None:
        console.print(f"[cyan]note:[/cyan] {message}", highlight=False)

    def status(self, message: str) -> ContextManager[object]:
        return console.status(message)

    def progress(self) -> Progress:
        return progress_bar()
