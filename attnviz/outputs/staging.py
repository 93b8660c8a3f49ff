"""Temporary files, all-or-nothing commits and the inputs a run must never overwrite.

The public entry points live in :mod:`attnviz.outputs.files`; this module holds the machinery:

* every temporary file or directory attnviz creates is named
  ``.attnviz-tmp-<pid>_<start>-<random>-<name>`` (:data:`TEMP_PREFIX`), so one left
  behind by a killed process is recognised and removed by the next run that writes
  into the same directory (:func:`remove_stale_temporaries`);
* a :class:`Session` (one per command run) collects the outputs staged while it is
  open and renames them all into place at its end, rolling back the ones already
  renamed when a later one fails; it also holds the paths the run reads, which no
  output may be, lie inside, or contain.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from attnviz.common.errors import OutputError

#: prefix of every temporary file and directory attnviz creates
TEMP_PREFIX = ".attnviz-tmp-"
#: errno values that mean "the device is full" (disk or quota)
_FULL = {errno.ENOSPC, errno.EDQUOT}


# -- temporary names ---------------------------------------------------------------------------------


def _process_start(pid: int | str = "self") -> str:
    """The kernel's start time of ``pid`` (Linux ``/proc``), so a reused pid is not mistaken for the writer."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "0"
    # Field 22 counts from the end of "(command name)", which may itself hold spaces.
    return stat.rsplit(")", 1)[-1].split()[19]


_OWN_TAG = f"{os.getpid()}_{_process_start()}"


def _own_tag() -> str:
    global _OWN_TAG
    if not _OWN_TAG.startswith(f"{os.getpid()}_"):  # forked since import
        _OWN_TAG = f"{os.getpid()}_{_process_start()}"
    return _OWN_TAG


def temp_prefix() -> str:
    """``.attnviz-tmp-<pid>_<start>-``: the prefix of this process's temporaries."""
    return f"{TEMP_PREFIX}{_own_tag()}-"


def _writer_alive(name: str) -> bool:
    """Whether the process that created the temporary ``name`` still runs."""
    tag = name[len(TEMP_PREFIX) :].split("-", 1)[0]
    pid_text, _, start = tag.partition("_")
    if not pid_text.isdigit():
        return False
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return not start or start == "0" or _process_start(pid) == start


def remove_stale_temporaries(directory: Path) -> None:
    """Remove temporaries in ``directory`` left by attnviz processes that no longer run (e.g. killed)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith(TEMP_PREFIX) and not _writer_alive(entry.name):
            remove_path(Path(entry.path))


#: temporaries this process created and has not yet renamed or removed (for a last-resort clean-up)
live_temporaries: set[Path] = set()


def remove_live_temporaries() -> None:
    """Remove every temporary this process still holds (used when it must exit at once)."""
    for path in list(live_temporaries):
        remove_path(path)


def remove_path(path: Path) -> None:
    """Remove a file, link or directory tree; missing is fine."""
    live_temporaries.discard(path)
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


def new_temp_file(directory: Path, name: str) -> Path:
    """A fresh empty temporary file in ``directory`` for the output ``name`` (keeps its suffix)."""
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(), suffix=f"-{name[-80:]}", dir=directory)
    os.close(fd)
    live_temporaries.add(Path(tmp))
    return Path(tmp)


def new_temp_dir(directory: Path, name: str) -> Path:
    """A fresh empty temporary directory in ``directory`` for the output ``name``."""
    path = Path(tempfile.mkdtemp(prefix=temp_prefix(), suffix=f"-{name[-80:]}", dir=directory))
    live_temporaries.add(path)
    return path


def _backup_name(path: Path) -> Path:
    directory = new_temp_dir(path.parent, path.name + ".old")
    os.rmdir(directory)  # only its unique name is wanted
    return directory


# -- modes -------------------------------------------------------------------------------------------


def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def ordinary_permissions(path: Path, keep_mode_of: Path | None = None) -> None:
    """Give a staged file or tree the modes ``open``/``mkdir`` would (mkstemp makes 0600, mkdtemp 0700).

    When ``keep_mode_of`` exists (the file being replaced), the top entry takes its mode instead.
    """
    umask = current_umask()
    entries = [path, *path.rglob("*")] if path.is_dir() else [path]
    for entry in entries:
        if not entry.is_symlink():
            entry.chmod((0o777 if entry.is_dir() else 0o666) & ~umask)
    if keep_mode_of is not None and keep_mode_of.exists() and keep_mode_of.is_dir() == path.is_dir():
        path.chmod(keep_mode_of.stat().st_mode & 0o7777)


# -- errors ------------------------------------------------------------------------------------------


def output_error(exc: BaseException, path: Path) -> OutputError | None:
    """The one-line :class:`OutputError` for a failed write of ``path``, or None if ``exc`` is no I/O failure.

    Also recognises errors that libraries wrap without an errno (safetensors' ``No space left on device``).
    """
    number = exc.errno if isinstance(exc, OSError) else None
    text = str(exc)
    if number in _FULL or "No space left on device" in text or "os error 28" in text or "Disk quota" in text:
        return OutputError(f"no space left on device writing {path}: free some space or choose another place")
    if number == errno.EFBIG or "File too large" in text or "os error 27" in text:
        return OutputError(f"file too large writing {path}: the file system or the file size limit refuses it")
    if number == errno.EIO or "Input/output error" in text or "os error 5)" in text:
        return OutputError(f"input/output error writing {path}: the device failed; choose another place")
    if number in (errno.EACCES, errno.EPERM, errno.EROFS):
        return OutputError(f"permission denied writing {path}: choose a writable place")
    if isinstance(exc, OSError):
        return OutputError(f"could not write {path}: {exc.strerror or exc}")
    return None


# -- inputs the outputs must not touch ---------------------------------------------------------------


def resolved(path: str | os.PathLike) -> Path:
    """Absolute path with ``~`` expanded and every symlink (also a dangling last one) followed."""
    return Path(os.path.realpath(Path(path).expanduser()))


def touches(output: Path, source: Path) -> bool:
    """Whether writing ``output`` (a file or a directory tree) could change ``source``, both resolved."""
    return output == source or source in output.parents or output in source.parents


# -- sessions ----------------------------------------------------------------------------------------


@dataclass
class Staged:
    """One output written to ``tmp`` that becomes ``destination`` at commit."""

    tmp: Path
    destination: Path


@dataclass
class Session:
    """What one run reads (``inputs``) and the outputs it has staged so far."""

    inputs: dict[Path, str] = field(default_factory=dict)  # resolved path -> what it is, for messages
    staged: list[Staged] = field(default_factory=list)

    def protect(self, path: Path, what: str) -> None:
        self.inputs.setdefault(resolved(path), what)

    def refuse_if_input(self, output: str | os.PathLike, extra: Iterable[tuple[Path, str]] = ()) -> None:
        """Raise :class:`OutputError` when ``output`` is, lies inside, or contains an input."""
        target = resolved(output)
        for source, what in [*self.inputs.items(), *extra]:
            if touches(target, source):
                raise OutputError(
                    f"{output} would overwrite the input {source} ({what}) that this run reads: "
                    "choose another output path"
                )


_session: Session | None = None


def current_session() -> Session | None:
    return _session


@contextlib.contextmanager
def session() -> Iterator[Session]:
    """Open a run; nested calls join the open one. Staged outputs are committed together when it ends."""
    global _session
    if _session is not None:
        yield _session
        return
    _session = Session()
    try:
        yield _session
        commit(_session.staged)
    finally:
        for item in _session.staged:
            remove_path(item.tmp)
        _session = None


def commit(items: list[Staged]) -> None:
    """Rename every staged output into place, or none: a failure restores what the earlier renames replaced."""
    done: list[tuple[Staged, Path | None]] = []
    item = None
    try:
        for item in items:
            if _session is not None:
                _session.refuse_if_input(item.destination)
            target = resolved(item.destination)
            if target.exists() and not target.is_file() and not target.is_dir():
                raise OutputError(f"{item.destination} is a device, pipe or socket, not a file: give an ordinary path")
            ordinary_permissions(item.tmp, keep_mode_of=item.destination)
            backup = None
            if item.destination.exists() or item.destination.is_symlink():
                backup = _backup_name(item.destination)
                os.replace(item.destination, backup)
                live_temporaries.add(backup)
            try:
                os.replace(item.tmp, item.destination)
                live_temporaries.discard(item.tmp)
            except BaseException:
                if backup is not None:
                    os.replace(backup, item.destination)
                    live_temporaries.discard(backup)
                raise
            done.append((item, backup))
    except BaseException as exc:
        for finished, backup in reversed(done):
            remove_path(finished.destination)
            if backup is not None:
                os.replace(backup, finished.destination)
                live_temporaries.discard(backup)
        if item is not None and isinstance(exc, OSError):
            raise (output_error(exc, item.destination) or exc) from exc
        raise
    finally:
        for _, backup in done:
            if backup is not None:
                remove_path(backup)


def stage(item: Staged) -> None:
    """Commit ``item`` now, or at the end of the open session (all outputs of a run together)."""
    if _session is not None:
        _session.staged.append(item)
    else:
        commit([item])
