"""Safe file output: check the destination early, never touch an input, write atomically.

A half-written file never replaces a good one: each writer writes to a temporary file
(or directory) named ``.attnviz-tmp-…`` next to the destination and renames it into place.
How a command uses this module (the CLI does the first two steps for every command)::

    with output_session():                       # outputs of the run: all or nothing
        protect_inputs(model_dir, data_file)     # what the run reads
        check_outputs([out_png, out_json])       # refuses outputs that are/lie in/contain an input
        ...load, compute...
        with atomic_path(out_png) as tmp: ...    # staged; renamed into place when the session ends
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from attnviz.common.cache import cache_root
from attnviz.common.encoding import read_text
from attnviz.common.errors import OutputError
from attnviz.outputs import staging

TEMP_PREFIX = staging.TEMP_PREFIX


@contextlib.contextmanager
def output_session() -> Iterator[None]:
    """One run: the outputs written inside are renamed into place together when the block succeeds.

    If the block fails (or a later rename fails) no output changes and every temporary is
    removed. Inputs registered with :func:`protect_inputs` inside it are refused as outputs;
    attnviz's cache is always protected. Nested sessions join the outer one.
    """
    with staging.session() as current:
        current.protect(cache_root(), "attnviz's cache")
        yield


def protect_inputs(paths: Iterable[str | os.PathLike | None], what: str = "input") -> None:
    """Record files or directories the current run reads: no output may be, lie inside or contain them.

    Outside :func:`output_session` this does nothing (library callers check with :func:`check_outputs`).
    """
    current = staging.current_session()
    if current is None:
        return
    for path in paths:
        if path is not None and Path(path).expanduser().exists():
            current.protect(Path(path), what)


def check_outputs(outputs: Iterable[str | os.PathLike | None], inputs: Iterable[str | os.PathLike | None] = ()) -> None:
    """Refuse outputs that are, lie inside, or contain an input, or that name the same place twice.

    Paths are compared after following symlinks. ``inputs`` adds to those of the open session.
    Raises :class:`OutputError`; call it before any model loads.
    """
    extra = [(staging.resolved(p), "input") for p in inputs if p is not None and Path(p).expanduser().exists()]
    current = staging.current_session() or staging.Session()
    seen: dict[Path, str] = {}
    for output in outputs:
        if output is None or str(output) == "-":  # "-" is standard output, not a file
            continue
        refuse_special_file(Path(output))
        current.refuse_if_input(output, extra)
        target = staging.resolved(output)
        for other, name in seen.items():
            if staging.touches(target, other):
                raise OutputError(f"outputs {name} and {output} overlap: give each output its own path")
        seen[target] = str(output)


def _refuse_if_input(path: Path) -> None:
    current = staging.current_session()
    if current is not None:
        current.refuse_if_input(path)


def check_output_path(path: str | os.PathLike, allowed_suffixes: tuple[str, ...] | None = None) -> Path:
    """Validate an output path before any expensive work starts.

    Raises :class:`OutputError` for a missing or unwritable directory, a path
    that is a directory, a suffix not in ``allowed_suffixes``, or (inside a
    session) a path that touches an input of the run.
    """
    path = Path(path).expanduser()
    if allowed_suffixes is not None and path.suffix.lower() not in allowed_suffixes:
        raise OutputError(
            f"unsupported output file type {path.suffix or '(none)'!r} for {path}: "
            f"use one of {', '.join(allowed_suffixes)}"
        )
    if path.is_dir():
        raise OutputError(f"{path} is a directory: give a file name")
    refuse_special_file(path)
    _refuse_if_input(path)
    check_output_parent(path)
    return path


def refuse_special_file(path: Path) -> None:
    """Refuse an output path that exists as something other than a file or directory (a device, a pipe):
    attnviz replaces outputs by renaming, which would remove the device node itself."""
    target = staging.resolved(path)
    if target.exists() and not target.is_file() and not target.is_dir():
        raise OutputError(f"{path} is a device, pipe or socket, not a file: give an ordinary file path")


def check_output_parent(path: Path) -> None:
    """Raise :class:`OutputError` unless the directory that will hold ``path`` exists and is writable."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"directory {parent} does not exist: create it first or choose another path")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"directory {parent} is not writable: choose another path")


def through_link(path: Path) -> Path:
    """Where an output named ``path`` is written: a symbolic link the user made is followed, never replaced.

    A link whose target does not exist yet (a dangling link) gets the output at its target, as long as
    the target's folder exists; otherwise :class:`OutputError`.
    """
    if not path.is_symlink():
        return path
    target = staging.resolved(path)
    if not target.parent.is_dir():
        raise OutputError(
            f"{path} is a symbolic link to {target}, whose folder does not exist: "
            "create that folder, remove the link, or name another path"
        )
    if not os.access(target.parent, os.W_OK):
        raise OutputError(f"{path} is a symbolic link into {target.parent}, which is not writable: name another path")
    return target


@contextlib.contextmanager
def staged_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh directory next to ``path``; when the block succeeds it replaces ``path``.

    What to write goes into the yielded directory. An existing ``path`` is moved aside
    only once the new directory is complete, and put back if the final rename fails; on
    any error nothing at ``path`` changes and no temporary directory is left behind.
    Inside :func:`output_session` the rename waits for the end of the session.
    The caller has checked ``path`` (:func:`check_output_parent` at least).
    """
    with _staged(path, staging.new_temp_dir) as stage:
        yield stage


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it onto ``path``.

    On error the temporary file is removed and ``path`` is left untouched. A replaced
    file keeps its mode; a new one gets the mode the umask gives. Inside
    :func:`output_session` the rename waits for the end of the session.
    """
    with _staged(path, staging.new_temp_file) as tmp:
        yield tmp


@contextlib.contextmanager
def _staged(path: str | os.PathLike, make: Callable[[Path, str], Path]) -> Iterator[Path]:
    """The body of :func:`atomic_dir` and :func:`atomic_path`: ``make(parent, name)`` makes the temporary."""
    path = through_link(Path(path).expanduser())
    _refuse_if_input(path)
    parent = path.parent if str(path.parent) else Path(".")
    staging.remove_stale_temporaries(parent)
    stage = _create(lambda: make(parent, path.name), path)
    with _writing(path, stage):
        yield stage
    staging.stage(staging.Staged(stage, path))


def _create(make, path: Path) -> Path:
    try:
        return make()
    except OSError as exc:
        raise (staging.output_error(exc, path) or exc) from exc


@contextlib.contextmanager
def _writing(path: Path, tmp: Path) -> Iterator[None]:
    """Remove ``tmp`` when the block fails; I/O failures become one :class:`OutputError` line."""
    try:
        yield
    except BaseException as exc:
        staging.remove_path(tmp)
        error = None if isinstance(exc, OutputError) else staging.output_error(exc, path)
        if error is not None:
            raise error from exc
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def read_text_file(path: str | os.PathLike, what: str = "file") -> str:
    """Read a UTF-8 text file (:func:`attnviz.common.encoding.read_text`) and protect it as an input of the run."""
    path = Path(path).expanduser()
    if path.is_file():
        protect_inputs([path], what)
    return read_text(path, what)
