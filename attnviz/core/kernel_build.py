"""Building the fused kernel safely: one build folder per binary, an OS lock, a failure remembered.

:func:`attnviz.core.kernel.prepare_kernel` compiles the kernel with :mod:`torch.utils.cpp_extension`.
Three things there must not cost a user more than once:

* **environments sharing a machine.** The build folder is named by a hash of everything that changes
  the binary (:func:`build_inputs`: the kernel's source, the compiler flags, the compiler and its
  version, torch's version and installation, the Python ABI), so two virtual environments each keep
  their own build and switching between them rebuilds nothing (in one shared folder each rebuilt the
  other's, because the build command names torch's headers by path);
* **two processes building at once.** A build holds an OS lock (:func:`build_lock`: ``fcntl.flock``
  on an open descriptor of ``attnviz-build.lock``), which the operating system releases when the
  process ends, however it ends. So a live build is always waited for, never taken for stale, and a
  lock file torch's builder left behind (``lock``: its mere existence is torch's lock) can only be a
  dead build's, which :func:`remove_leftover_torch_lock` removes;
* **a failed build** (no C++ compiler, no ninja, a compile error) is written down in that folder with a
  fingerprint of the compiler; later processes read it and do not try again until the compiler changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: builds run unlocked
    fcntl = None  # type: ignore[assignment]

FAILURE_FILE = "attnviz-build-failed.json"
OWNER_FILE = "attnviz-build-owner.json"
#: the file whose ``flock`` a build holds (never deleted: deleting a locked file would split the lock)
LOCK_FILE = "attnviz-build.lock"
#: torch's own build lock in the same folder (a file whose existence is the lock)
TORCH_LOCK_FILE = "lock"
#: how long a process waits for another one's build before running on torch's operations (a build takes
#: a minute or two; a compiler stuck for longer is not waited on, and its lock is left alone)
WAIT_LIMIT_SECONDS = 15 * 60


def compiler_command() -> str:
    """The C++ compiler torch's extension builder calls (``$CXX``, else ``c++``)."""
    return os.environ.get("CXX", "c++")


def compiler_fingerprint() -> str:
    """What identifies the compiler and build tool here: their paths, sizes and modification times."""
    parts = []
    for tool in (compiler_command(), "ninja"):
        found = shutil.which(tool)
        if found is None:
            parts.append(f"{tool}: missing")
            continue
        info = os.stat(found)
        parts.append(f"{tool}: {os.path.realpath(found)} {info.st_size} {int(info.st_mtime)}")
    return "; ".join(parts)


@lru_cache(maxsize=8)
def _compiler_version(path: str) -> str:
    """The first line of ``path --version`` (e.g. ``g++ (Debian 12.2.0-14) 12.2.0``), or why there is none."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        return f"unknown ({type(error).__name__})"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else "unknown"


def compiler_identity() -> str:
    """The compiler a build would use: its resolved path and its ``--version`` line (``missing`` without one)."""
    found = shutil.which(compiler_command())
    if found is None:
        return f"{compiler_command()}: missing"
    path = os.path.realpath(found)
    return f"{path}: {_compiler_version(path)}"


def build_inputs(source: str, flags: list[str]) -> dict[str, str]:
    """Everything that changes the kernel's binary, by name: what the build folder's name is a hash of."""
    import torch

    return {
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "flags": " ".join(flags),
        "compiler": compiler_identity(),
        "torch": f"{torch.__version__} at {os.path.dirname(os.path.realpath(torch.__file__))}",
        "python": f"{sys.implementation.cache_tag} {sysconfig.get_config_var('SOABI') or ''}".strip(),
    }


def inputs_hash(inputs: dict[str, str]) -> str:
    """12 hex digits naming one combination of :func:`build_inputs`."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]


def extensions_root() -> Path:
    """Where kernels are built: ``$TORCH_EXTENSIONS_DIR``, else torch's default (``~/.cache/torch_extensions``)."""
    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    if configured:
        return Path(configured)
    from torch.utils.cpp_extension import get_default_build_root  # late: slow to import

    return Path(get_default_build_root())


def missing_tools() -> str | None:
    """Why no build can start here (no compiler or no ninja), or None."""
    if shutil.which(compiler_command()) is None:
        return f"no C++ compiler ({compiler_command()!r} is not on PATH)"
    from torch.utils import cpp_extension  # late: slow to import

    if not cpp_extension.is_ninja_available():
        return "ninja is not installed"
    return None


def remembered_failure(build_directory: Path) -> str | None:
    """The reason an earlier build failed here with the same compiler, or None (then try)."""
    try:
        record = json.loads((build_directory / FAILURE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("compiler") != compiler_fingerprint():
        return None  # the compiler changed since: worth another try
    return str(record.get("reason", "an earlier build failed"))


def remember_failure(build_directory: Path, reason: str) -> None:
    """Write the failure down for later processes (best effort: an unwritable cache only costs retries)."""
    record = {"reason": reason, "compiler": compiler_fingerprint(), "time": time.time()}
    try:
        build_directory.mkdir(parents=True, exist_ok=True)
        temporary = build_directory / f".{FAILURE_FILE}.{os.getpid()}"
        temporary.write_text(json.dumps(record), encoding="utf-8")
        os.replace(temporary, build_directory / FAILURE_FILE)
    except OSError:
        pass


def forget_failure(build_directory: Path) -> None:
    try:
        (build_directory / FAILURE_FILE).unlink()
    except OSError:
        pass


class BuildLockTimeout(RuntimeError):
    """Another process held the build lock longer than :data:`WAIT_LIMIT_SECONDS`."""


def lock_holder(build_directory: Path) -> int | None:
    """The process id of a live build in ``build_directory`` (0 if its id is unknown), or None when none runs."""
    path = build_directory / LOCK_FILE
    if fcntl is None:
        return None
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return None  # never built here, or unreadable
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _owner_pid(build_directory)
    except OSError:
        return None
    finally:
        os.close(descriptor)  # closing releases a lock we took
    return None


def _owner_pid(build_directory: Path) -> int:
    try:
        return int(json.loads((build_directory / OWNER_FILE).read_text(encoding="utf-8"))["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


@contextlib.contextmanager
def build_lock(
    build_directory: Path,
    *,
    on_wait: Callable[[int], contextlib.AbstractContextManager[object]] | None = None,
    poll_seconds: float = 0.5,
    wait_limit: float = WAIT_LIMIT_SECONDS,
) -> Iterator[None]:
    """Hold the build folder's OS lock inside the ``with`` block, waiting while another process holds it.

    ``on_wait(pid)`` is entered while waiting (a status line: another build of process ``pid`` runs).
    The lock is released when the block ends, and by the operating system if the process dies. Raises
    :class:`BuildLockTimeout` after ``wait_limit`` seconds of waiting (the other build is left alone).
    """
    build_directory.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(build_directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _try_lock(descriptor):
            waiting = on_wait(_owner_pid(build_directory)) if on_wait else contextlib.nullcontext()
            with waiting:
                deadline = time.monotonic() + wait_limit
                while not _try_lock(descriptor):
                    if time.monotonic() > deadline:
                        raise BuildLockTimeout(
                            f"another process (pid {_owner_pid(build_directory)}) has been building attnviz's "
                            f"kernel in {build_directory} for over {wait_limit / 60:.0f} minutes"
                        )
                    time.sleep(poll_seconds)
        _write_owner(build_directory)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _try_lock(descriptor: int) -> bool:
    if fcntl is None:
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def remove_leftover_torch_lock(build_directory: Path) -> bool:
    """Remove torch's ``lock`` file, which a killed build leaves behind (torch would wait on it forever).

    Call it only while holding :func:`build_lock`: every live build of this folder holds that lock, so a
    ``lock`` file found then belongs to a build that is gone. Returns whether there was one.
    """
    try:
        (build_directory / TORCH_LOCK_FILE).unlink()
    except FileNotFoundError:
        return False
    return True


def _write_owner(build_directory: Path) -> None:
    """Say which process holds the lock, so that a waiting process can name it."""
    try:
        (build_directory / OWNER_FILE).write_text(
            json.dumps({"pid": os.getpid(), "time": time.time()}), encoding="utf-8"
        )
    except OSError:
        pass
