"""Safe file output: check the destination early, write atomically.

A half-written file never replaces a good one: each writer writes to a
temporary file (or directory) next to the destination and renames it into place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from attnviz.errors import InputError, OutputError


def check_output_path(path: str | os.PathLike, allowed_suffixes: tuple[str, ...] | None = None) -> Path:
    """Validate an output path before any expensive work starts.

    Raises :class:`OutputError` for a missing or unwritable directory, a path
    that is a directory, or a suffix not in ``allowed_suffixes``.
    """
    path = Path(path).expanduser()
    if allowed_suffixes is not None and path.suffix.lower() not in allowed_suffixes:
        raise OutputError(
            f"unsupported output file type {path.suffix or '(none)'!r} for {path}: "
            f"use one of {', '.join(allowed_suffixes)}"
        )
    if path.is_dir():
        raise OutputError(f"{path} is a directory: give a file name")
    check_output_parent(path)
    return path


def check_output_parent(path: Path) -> None:
    """Raise :class:`OutputError` unless the directory that will hold ``path`` exists and is writable."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"directory {parent} does not exist: create it first or choose another path")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"directory {parent} is not writable: choose another path")


@contextlib.contextmanager
def staged_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh directory next to ``path``; when the block succeeds it replaces ``path``.

    What to write goes into the yielded directory. An existing ``path`` is moved aside
    only once the new directory is complete, and put back if the final rename fails; on
    any error nothing at ``path`` changes and no temporary directory is left behind.
    The caller has checked ``path`` (:func:`check_output_parent` at least).
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    stage = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent))
    old = None
    try:
        yield stage
        _ordinary_permissions(stage)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=parent))
            os.rmdir(old)  # only its unique name is wanted
            os.replace(path, old)
        os.replace(stage, path)
    except OSError as exc:
        if old is not None and old.exists() and not path.exists():
            os.replace(old, path)
        raise OutputError(f"could not write {path}: {exc.strerror or exc}") from exc
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
        if old is not None and old.exists():
            shutil.rmtree(old, ignore_errors=True)


def _ordinary_permissions(directory: Path) -> None:
    """Give ``directory`` and its contents the permissions plain ``mkdir``/``open`` would (mkdtemp uses 0700)."""
    umask = os.umask(0)
    os.umask(umask)
    for entry in [directory, *directory.rglob("*")]:
        entry.chmod((0o777 if entry.is_dir() else 0o666) & ~umask)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it onto ``path``.

    On error the temporary file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent or ".")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(f"could not write {path}: {exc.strerror or exc}") from exc
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def read_text_file(path: str | os.PathLike, what: str = "file") -> str:
    """Read a UTF-8 text file, turning OS errors into :class:`InputError`."""
    path = Path(path).expanduser()
    if not path.exists():
        raise InputError(f"{what} {path} does not exist")
    if path.is_dir():
        raise InputError(f"{what} {path} is a directory, not a file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
