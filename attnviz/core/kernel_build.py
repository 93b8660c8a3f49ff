"""Building the fused kernel safely: a failure remembered per machine, and no wait on a stale build lock.

:func:`attnviz.core.kernel.prepare_kernel` compiles the kernel with :mod:`torch.utils.cpp_extension`
into a build directory of torch's extension cache (one per kernel source, compiler flags and torch
version). Two things there must not cost a user more than once:

* **a failed build** (no C++ compiler, no ninja, a compile error) is written down in that directory
  together with a fingerprint of the compiler; later processes read it and do not try again until
  the compiler changes (a new source or torch version has a build directory of its own);
* **a build killed mid-way** leaves torch's ``lock`` file behind, and torch then waits for it forever.
  Each build writes its owner (host and process id) beside the lock; a lock whose owner is gone, or
  that is older than :data:`STALE_AFTER_SECONDS`, is removed (and said so) instead of waited on.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

#: a build lock older than this is stale whatever its owner file says (a build takes a minute or two)
STALE_AFTER_SECONDS = 15 * 60
FAILURE_FILE = "attnviz-build-failed.json"
OWNER_FILE = "attnviz-build-owner.json"


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


@dataclass(frozen=True)
class LockCheck:
    """What :func:`clear_stale_lock` found: whether it removed a lock, and why."""

    removed: bool
    why: str = ""


def _owner_alive(build_directory: Path) -> bool | None:
    """Whether the process that took the lock still runs (None: unknown, e.g. another host or no owner file)."""
    try:
        owner = json.loads((build_directory / OWNER_FILE).read_text(encoding="utf-8"))
        pid, host = int(owner["pid"]), str(owner["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clear_stale_lock(build_directory: Path, *, poll_seconds: float = 1.0) -> LockCheck:
    """Wait while a live build holds the lock; remove a lock no live build holds. Never waits forever."""
    lock = build_directory / "lock"
    while lock.exists():
        try:
            age = time.time() - lock.stat().st_mtime
        except OSError:  # released while we looked
            break
        alive = _owner_alive(build_directory)
        if alive is False or age > STALE_AFTER_SECONDS:
            why = "its build process is gone" if alive is False else f"it is {age / 60:.0f} minutes old"
            try:
                lock.unlink()
            except FileNotFoundError:
                pass
            return LockCheck(True, why)
        time.sleep(poll_seconds)  # a build in another process: it takes a minute or two
    return LockCheck(False)


def write_owner(build_directory: Path) -> None:
    """Say which process builds now, so a process that finds the lock can tell whether the build still runs."""
    try:
        build_directory.mkdir(parents=True, exist_ok=True)
        (build_directory / OWNER_FILE).write_text(
            json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}), encoding="utf-8"
        )
    except OSError:
        pass
