"""The one rich console of attnviz.

Everything human-facing (progress bars, tables, warnings) goes to stderr, so a
command's stdout stays clean for pipes and scripts.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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
