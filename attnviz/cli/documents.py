"""``--json`` and ``--csv`` documents that may go to standard output (``-``): checked before a model loads, written
after it ran, and the files written named where they do not mix with a document on stdout (``stats``, ``diff``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: ``--json -`` / ``--csv -``: the document goes to standard output
STDOUT = Path("-")

#: how one document is made: (its text, for stdout; the writer of its file, which returns the path written)
DocumentFormat = tuple[Callable[[Any], str], Callable[[Path, Any], Path]]


def check_outputs(
    json_path: Path | None, csv_path: Path | None, others: Iterable[tuple[Path | None, tuple[str, ...]]] = ()
) -> None:
    """Refuse, before any model loads, ``--json -`` together with ``--csv -``, and any output file that
    :func:`~attnviz.outputs.files.check_output_path` refuses; ``others``: more ``(path, suffixes)``, such as a figure's."""
    from attnviz.common.errors import InputError
    from attnviz.outputs.files import check_output_path

    if json_path == STDOUT and csv_path == STDOUT:
        raise InputError("only one of --json and --csv can write to stdout ('-')")
    for path, suffixes in ((json_path, (".json",)), (csv_path, (".csv",)), *others):
        if path is not None and path != STDOUT:
            check_output_path(path, suffixes)


def write_documents(
    record: Any, json_path: Path | None, csv_path: Path | None, *, as_json: DocumentFormat, as_csv: DocumentFormat
) -> list[Path]:
    """Write ``record`` as the JSON and CSV documents asked for: ``-`` writes the document itself to stdout, any
    other path its file. Returns the files written."""
    written = []
    for path, (text_of, writer) in ((json_path, as_json), (csv_path, as_csv)):
        if path == STDOUT:  # the document itself is stdout; tables and paths stay off it
            sys.stdout.write(text_of(record))
        elif path is not None:
            written.append(writer(path, record))
    return written


def name_written(written: Iterable[Path], json_path: Path | None, csv_path: Path | None) -> None:
    """Each file written on stdout (the product); in the terminal instead when stdout holds a document."""
    for path in written:
        if STDOUT in (json_path, csv_path):  # stdout holds the document: the paths go to the terminal
            from attnviz.cli.console import console

            console.print(f"wrote {path}", highlight=False)
        else:
            print(path)
