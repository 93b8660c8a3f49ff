"""The one rich console of attnviz's command line, and the reporter that draws on it.

Everything human-facing (progress bars, tables, warnings, notices) goes to stderr, so a
command's stdout stays clean for pipes and scripts: stdout carries only a command's product
(the paths it wrote, a document written to ``-``, the ``models`` table). When stderr is not a
terminal (a log file, CI) the spinners and bars become one plain line per phase, so a long run
is never silent. Only :mod:`attnviz.cli` uses this
module; the library reports through :mod:`attnviz.common.progress`, and the CLI installs
:class:`ConsoleReporter` for the whole run.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager as ContextManager
from typing import Any

from rich.console import Console, ConsoleDimensions, Group, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from attnviz.common.cells import wrap_spans
from attnviz.common.progress import Reporter
from attnviz.common.wording import plural

#: the width tables and views are laid out for on a stderr that is no terminal
LOG_LAYOUT_WIDTH = 200


class StderrConsole(Console):
    """The stderr console: on a terminal, as wide as the terminal; redirected (a log file, a pipe), text is never
    wrapped (a line stays one line, for grep) and tables and views are laid out for at least ``LOG_LAYOUT_WIDTH``
    columns."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if kwargs.get("soft_wrap") is None and not self.is_terminal and all(isinstance(o, str | Text) for o in objects):
            kwargs["soft_wrap"] = True  # text: one line as it was written
        if not self.is_terminal and any(isinstance(o, Table) for o in objects):
            kwargs.setdefault("crop", False)  # a caption stays whole on its one line (the table fits the width)
        super().print(*(self._with_own_captions(o) if isinstance(o, Table) else o for o in objects), **kwargs)

    def _with_own_captions(self, table: Table) -> RenderableType:
        """``table`` with its title above and caption below, wrapped at the console's width rather than the
        table's, never inside a quoted token or a formula (on a terminal; in a log each stays one line)."""
        if not table.title and not table.caption:
            return table
        parts: list[RenderableType] = []
        bare = copy.copy(table)
        bare.title = bare.caption = None
        if table.title:
            parts.append(self.wrapped(table.title, table.title_style or "table.title"))
        parts.append(bare)
        if table.caption:
            parts.append(self.wrapped(table.caption, table.caption_style or "table.caption"))
        return Group(*parts)

    def wrapped(self, text: str | Text, style: Any = "") -> Text:
        """``text`` broken into lines of at most the terminal's width at spaces outside quoted tokens and formulas
        (:func:`attnviz.common.cells.wrap_spans`); off a terminal, its own lines only."""
        text = self.render_str(text, style=style) if isinstance(text, str) else text
        if not self.is_terminal:
            text.no_wrap, text.overflow = True, "ignore"  # one line, however long: a log is read with grep
            return text
        lines: list[Text] = []
        for line in text.split("\n"):
            lines.extend(line[start:end] for start, end in wrap_spans(line.plain, self.width))
        joined = Text("\n", no_wrap=True).join(lines)
        joined.no_wrap = True
        return joined

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        rendered = super()._render_buffer(buffer)
        if self.is_terminal:
            return rendered
        return "\n".join(line.rstrip(" ") for line in rendered.split("\n"))  # a log keeps no padding

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)
        return size if self.is_terminal else ConsoleDimensions(max(size.width, LOG_LAYOUT_WIDTH), size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


console = StderrConsole(stderr=True)


def product_console() -> Console:
    """A console on stdout for a command whose product is a table (``attnviz models``).

    Off a terminal (a file, a pipe) lines are wide enough that paths are not folded.
    """
    stdout = Console()
    return stdout if stdout.is_terminal else Console(width=max(stdout.width, 200))


def view_console() -> Console:
    """A console on stdout for a view the user asked to see in the terminal (``--terminal``): the view is the
    command's product, so ``> file`` keeps it; at the terminal's width (80 columns in a file, or ``COLUMNS``)."""
    return Console()


def in_colour(view: Console) -> bool:
    """Whether ``view`` shows colour (a colour terminal, no ``NO_COLOR``): a view without it must carry its
    numbers in characters (shades, digits), since its background colours are dropped."""
    return view.color_system is not None and not view.no_color


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
        console.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)  # one line in logs


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


def _main_process() -> bool:
    """Under torchrun only rank 0 prints information and phase lines (every rank would print the same)."""
    return os.environ.get("RANK", "0") == "0"


def phase_line(message: str) -> None:
    """One plain line on stderr naming the phase that starts (for logs: stderr is not a terminal)."""
    if _main_process():
        console.print(f"{message} …", highlight=False, markup=False, soft_wrap=True)


class PhaseLines(Progress):
    """A progress display for logs: a line as each task starts, then a line per step instead of a bar redrawn
    in place (at most one every :data:`STEP_LINE_SECONDS` per task, and always the last step)."""

    #: the least time between two step lines of one task (a corpus of thousands of sentences stays readable)
    STEP_LINE_SECONDS = 2.0

    def __init__(self) -> None:
        super().__init__(console=console, disable=True)
        self._last_line: dict[TaskID, tuple[float, float]] = {}  # task -> (time, steps done) of its last line

    def add_task(
        self,
        description: str,
        start: bool = True,
        total: float | None = 100.0,
        completed: int = 0,
        visible: bool = True,
        **fields: Any,
    ) -> TaskID:
        steps = f" ({plural(int(total), 'step')})" if total else ""
        phase_line(f"{description}{steps}")
        return super().add_task(description, start=start, total=total, completed=completed, visible=visible, **fields)

    def update(self, task_id: TaskID, **changes: Any) -> None:
        super().update(task_id, **changes)
        self._step_line(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._step_line(task_id)

    def _step_line(self, task_id: TaskID) -> None:
        task = self._tasks[task_id]
        now = time.monotonic()
        last = self._last_line.get(task_id)  # None: no step line yet (the first step always gets one)
        if last is not None and task.completed == last[1]:
            return  # nothing new done (a status change alone)
        finished = task.total is not None and task.completed >= task.total
        if last is not None and not finished and now - last[0] < self.STEP_LINE_SECONDS:
            return
        self._last_line[task_id] = (now, task.completed)
        done = f"{task.completed:,.0f}/{task.total:,.0f}" if task.total else f"{task.completed:,.0f}"
        status = task.fields.get("status", "")
        if _main_process():
            line = f"{task.description}: {done}" + (f" · {status}" if status else "")
            console.print(line, highlight=False, markup=False, soft_wrap=True)


class ConsoleReporter(Reporter):
    """Warnings, notices, information, status lines and progress bars on the shared stderr console.

    On a terminal status lines are spinners and progress bars redraw in place; elsewhere each
    is one plain line as its phase starts.
    """

    def warning(self, message: str) -> None:
        warn(message)

    def notice(self, message: str) -> None:
        console.print(f"[cyan]note:[/cyan] {message}", highlight=False, soft_wrap=True)

    def info(self, message: str) -> None:
        if _main_process():
            console.print(message, style="dim", highlight=False, markup=False, soft_wrap=True)

    def status(self, message: str) -> ContextManager[object]:
        if console.is_terminal:
            return console.status(message)
        phase_line(message)
        return contextlib.nullcontext()

    def progress(self) -> Progress:
        return progress_bar() if console.is_terminal else PhaseLines()
