"""``--help`` that shows every option name whole, however narrow the terminal.

Typer draws each help panel as a table with one column per part of an option (long name, short name, ``--no-…``
form, type) beside its help. At 80 columns those columns do not fit and rich cuts them (``--no-transformers-…``).
:func:`format_help` draws the same help, but a panel whose names would not fit is redrawn with two columns: the
option's names and its type, one per line, in a column exactly as wide as the longest name, and the help beside it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

#: the narrowest help column that reads as prose (the widest option name mentioned in a help text fits)
MIN_HELP_WIDTH = 32
#: columns a panel's border and the help table's padding take
_PANEL_BORDERS = 4


def format_help(command: Any, ctx: Any, formatter: Any, format_help_as_typer: Any) -> None:
    """``command``'s help as Typer draws it (``format_help_as_typer(ctx, formatter)``), its panels fitted."""
    try:
        from typer import rich_utils
    except ImportError:  # no rich: Click's plain help wraps names whole already
        format_help_as_typer(ctx, formatter)
        return
    with _fitting_consoles(rich_utils):
        format_help_as_typer(ctx, formatter)


@contextlib.contextmanager
def _fitting_consoles(rich_utils: Any) -> Iterator[None]:
    """Typer's help console, while the help is drawn, is a :class:`FittingConsole` of the same settings."""
    make_console = getattr(rich_utils, "_get_rich_console", None)
    if make_console is None:
        yield
        return

    def fitting_console(*args: Any, **kwargs: Any) -> Console:
        console = make_console(*args, **kwargs)
        console.__class__ = FittingConsole  # the same console (theme, width, stream), drawing fitted panels
        return console

    rich_utils._get_rich_console = fitting_console
    try:
        yield
    finally:
        rich_utils._get_rich_console = make_console


class FittingConsole(Console):
    """A console that redraws an options panel whose names would be cut at its width (see the module docstring)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(fitted_examples(fitted_panel(item, self), self.width) for item in objects), **kwargs)


#: a shell word: a quoted string (spaces and all) or a run of other characters
_SHELL_WORD = re.compile(r"""(?:"[^"]*"|'[^']*'|[^\s"'])+""")
#: the first words of the example commands in a help text
_COMMANDS = ("attnviz", "torchrun", "python", "python3")
#: columns of the help text's padding, left and right
_TEXT_PADDING = 2


def fitted_examples(renderable: Any, width: int) -> Any:
    """The command description with each example command that is wider than the terminal broken at spaces between
    shell words, every line but the last ending in `` \\`` (one command, copied as it is) and the next indented."""
    align = getattr(renderable, "renderable", None)
    group = getattr(align, "renderable", None)
    items = getattr(group, "renderables", None)
    if not isinstance(items, list):
        return renderable
    room = width - _TEXT_PADDING
    for index, item in enumerate(items):
        if not isinstance(item, Text):
            continue
        lines = item.plain.split("\n")
        long = [line.startswith("  ") and line.split()[0] in _COMMANDS and len(line) > room for line in lines]
        if any(long):
            fitted = [part for line, wide in zip(lines, long) for part in (_continued(line, room) if wide else [line])]
            items[index] = Text("\n".join(fitted), style=item.style, justify=item.justify)
    return renderable


def _continued(command: str, room: int) -> list[str]:
    indent = command[: len(command) - len(command.lstrip())]
    lines: list[str] = []
    line = indent
    for word in _SHELL_WORD.findall(command):
        candidate = word if line.strip() == "" else f"{line} {word}"
        if line.strip() and len(candidate) + 2 > room:  # room for " \"
            lines.append(line + " \\")
            line = indent + "    " + word
        else:
            line = candidate if line.strip() else indent + word
    return [*lines, line]


def fitted_panel(renderable: Any, console: Console) -> Any:
    """``renderable`` itself, or, for an options panel whose name columns leave the help too narrow, the panel
    with each option's names and type stacked in one column as wide as its longest name."""
    if not isinstance(renderable, Panel) or not isinstance(renderable.renderable, Table):
        return renderable
    table = renderable.renderable
    if len(table.columns) < 3 or table.show_header:  # not an options table (the commands list has two columns)
        return renderable
    *name_columns, help_column = table.columns
    widths = [max((_width(cell, console) for cell in column._cells), default=0) for column in name_columns]
    # the help column must hold its longest word (an option name mentioned in the help) whole too
    longest_word = max((_longest_word(cell) for cell in help_column._cells), default=0)
    # every column is padded by one cell each side, an empty one too
    needed = sum(width + 2 for width in widths) + max(MIN_HELP_WIDTH, longest_word) + 2 + _PANEL_BORDERS
    if needed <= console.width:
        return renderable
    rows = []
    for index, help_cell in enumerate(help_column._cells):
        parts = [column._cells[index] for column in name_columns]
        lines = [part if isinstance(part, Text) else Text(str(part)) for part in parts]
        rows.append((Text("\n").join(line for line in lines if line.plain.strip()), help_cell))
    # as wide as the longest name (a long type folds under it), leaving the help at least MIN_HELP_WIDTH
    name_width = max(widths[:-1], default=1)
    name_width = min(name_width, max(console.width - MIN_HELP_WIDTH - _PANEL_BORDERS - 2, 8))
    stacked = Table(show_header=False, expand=True, box=None, padding=(0, 1), pad_edge=False, highlight=True)
    stacked.add_column(width=name_width, overflow="fold")
    stacked.add_column(ratio=1, overflow="fold")
    for names, help_cell in rows:
        stacked.add_row(names, help_cell)
    return Panel(
        stacked,
        border_style=renderable.border_style,
        title=renderable.title,
        title_align=renderable.title_align,
    )


def _width(cell: Any, console: Console) -> int:
    """The widest line of a name cell (a ``Text``; a required marker may be a plain string)."""
    if isinstance(cell, Text):
        return max((line.cell_len for line in cell.split("\n")), default=0)
    return console.measure(cell).maximum if cell else 0


def _longest_word(cell: Any) -> int:
    """Cells of the longest word of a help cell (Typer's ``Columns`` of texts, or a text)."""
    texts = getattr(cell, "renderables", [cell])
    words = [word for text in texts if isinstance(text, Text) for word in text.plain.split()]
    return max((Text(word).cell_len for word in words), default=0)
