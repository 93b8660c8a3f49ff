"""The fused softmax kernel of the attention core: built once per machine, optional, with a fallback.

:func:`attnviz.core.attention.attend` computes, for each block of queries, ``Q Kᵀ`` into a
reused buffer, then scales, masks and softmaxes it, and the statistics observer reduces the
pattern row by row. In torch each of those steps is a separate pass over the ``[b, h, blk, c]``
block (eight to twelve in all). ``kernels/softmax_rows.cpp`` does scale, mask and softmax in
three passes over one row at a time, a row that stays in the L1 cache, and, while the
exponentials are at hand, reduces each row to a :class:`~attnviz.core.kernel_calls.RowSummary` (max weight, entropy, mean
distance, the weights on the keys around the query), so that the statistics need no pass of their own.

The kernel is compiled with :mod:`torch.utils.cpp_extension` (a C++ compiler and ninja are
needed) into a folder of torch's extension cache (``$TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``) named by everything that changes the binary (source, flags, compiler,
torch, Python ABI: :mod:`attnviz.core.kernel_build`), so once per environment; later processes load it
in well under a second, and a build in progress is waited for under an OS lock. A forward pass uses it when its :class:`AttentionContext` says so
(:attr:`~attnviz.core.attention.AttentionContext.fused_softmax`) and :func:`prepare_kernel` has loaded it: the corpus passes
(statistics, head probes) do both, because there the build (about a minute on two cores) pays
for itself. Captures and views keep torch's softmax (the kernel is optional; their numbers must not
depend on whether it built). Without a compiler, on a CPU without AVX2 (or not x86), or with
``ATTNVIZ_KERNEL=0``, everything runs on torch's operations, with the same patterns and the
statistics to float32 rounding (≤ 1e-5).

The kernel's patterns are torch's softmax bit for bit: it computes ``exp`` as SLEEF's
``expf_u10`` does (the function torch's CPU softmax calls), in torch's vector lanes, and adds in
torch's order. So the statistics drift from transformers' eager attention no more than on torch's
operations. Whether the kernel runs is chosen per forward pass, never by who observes. How it runs a
call does follow the observers: when none of them reads the pattern itself (the statistics take the
row summary, ``accepts_summary_only``), ``attend_rows_`` computes attention tile by tile of keys with a
running maximum (flash attention's scheme) and never writes the pattern; otherwise blocks of whole
rows are computed and handed over. The two give the same outputs to float32 rounding (within 2e-6
in the tests); the calls themselves are in :mod:`attnviz.core.kernel_calls`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Literal

import torch

from attnviz.common.progress import notice, status, warn
from attnviz.core.kernel_build import (
    BuildLockTimeout,
    build_inputs,
    build_lock,
    extensions_root,
    forget_failure,
    inputs_hash,
    lock_holder,
    missing_tools,
    remember_failure,
    remembered_failure,
    remove_leftover_torch_lock,
)

#: environment variable: "0" keeps the core on torch's operations (no build, no load)
KERNEL_VARIABLE = "ATTNVIZ_KERNEL"

#: shown (through the caller's reporter) while the kernel is being compiled
BUILD_NOTICE = (
    "building attnviz's fused attention kernel (once per environment and compiler, about a minute; "
    "ATTNVIZ_KERNEL=0 skips it)"
)
#: what a user can do about a kernel that did not build
REMEDY = (
    "attnviz runs on torch's operations instead (same results, slower corpus passes) and will not try again "
    "until the compiler changes; install a C++ compiler and ninja (e.g. apt-get install g++), or set "
    "ATTNVIZ_KERNEL=0 to skip the kernel"
)

KernelState = Literal["unloaded", "loaded", "disabled", "unavailable"]

_lock = threading.Lock()
_module = None  # the loaded extension
_state: KernelState = "unloaded"
_failure = ""  # why the kernel is unavailable
_build_seconds = 0.0  # time the last prepare_kernel spent building or loading


#: the kernel's C++ files, compiled as one source in this order (each uses what the earlier ones define)
SOURCES = ("kernels/softmax_rows.cpp", "kernels/tile_products.cpp", "kernels/attend_blocks.cpp")


def _source() -> str:
    folder = resources.files("attnviz.core")
    return "\n".join(folder.joinpath(name).read_text(encoding="utf-8") for name in SOURCES)


def _compiler_flags(capability: str) -> list[str]:
    """-O3 with AVX2/FMA, and AVX-512 where this CPU (as torch sees it) has it."""
    # -fopenmp: at::parallel_for splits the rows over torch's OpenMP threads (the library torch ships
    # is already loaded, with the soname the extension asks for, so no second runtime comes in).
    flags = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-mavx2", "-mfma"]
    return flags + (["-mavx512f"] if capability == "AVX512" else [])


#: CPU capabilities (``torch.backends.cpu.get_cpu_capability()``) the kernel is written for
VECTOR_CAPABILITIES = ("AVX2", "AVX512")


def kernel_disabled() -> bool:
    return os.environ.get(KERNEL_VARIABLE, "").strip() == "0"


def prepare_kernel(*, build: bool = True) -> bool:
    """Load the kernel into this process, building it first if needed and ``build`` is true.

    Returns whether the core now uses it. Failures are remembered (see :func:`kernel_status`);
    they never raise: the core then stays on torch's operations.
    """
    global _state, _failure, _build_seconds
    with _lock:
        if _state == "loaded":
            return True
        if kernel_disabled():
            _state = "disabled"
            return False
        if _state == "unavailable" or not build:
            return False
        capability = torch.backends.cpu.get_cpu_capability()
        if capability not in VECTOR_CAPABILITIES:  # elsewhere torch's own vectorised softmax is the faster one
            _state, _failure = "unavailable", f"the kernel needs AVX2; this CPU offers {capability}"
            return False
        start = time.perf_counter()
        try:
            return _build_and_load(capability)
        finally:
            _build_seconds = time.perf_counter() - start


def _build_and_load(capability: str) -> bool:
    """Build (if needed) and load the kernel; on failure remember why, here and on disk, and say so once."""
    global _module, _state, _failure
    from torch.utils import cpp_extension  # imported late: it is slow to import

    flags = _compiler_flags(capability)
    source = _source()
    name = kernel_name(capability)
    directory = build_directory(name)
    library = directory / f"{name}.so"
    reason = None
    if not library.exists():
        earlier = remembered_failure(directory)
        if earlier is not None:  # said when it happened; `attnviz env` shows it
            _state, _failure = "unavailable", f"{earlier} (an earlier build here failed; not tried again)"
            return False
        reason = missing_tools()
    if reason is None:
        try:
            with build_lock(directory, on_wait=_waiting_for):
                if remove_leftover_torch_lock(directory):  # no live build holds it: we hold the lock
                    warn(
                        "removed a stale build lock of attnviz's kernel (its build process is gone); building it again"
                    )
                before = _modified(library)
                announced = before is None  # another process may have built it while we waited
                if announced:
                    notice(build_notice(directory))  # one line, not also a status line of the same words
                _module = cpp_extension.load_inline(
                    name=name,
                    cpp_sources=[source],
                    extra_cflags=flags,
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(directory),
                    verbose=False,
                )
                if not announced and _modified(library) != before:  # ninja found the binary out of date
                    notice(f"attnviz's fused attention kernel was rebuilt in {directory}")
        except BuildLockTimeout as exc:  # another build runs on: not a failure to remember
            _state, _failure = "unavailable", f"{exc}; this run uses torch's operations"
            warn(f"attnviz's fused attention kernel is unavailable for this run: {_failure}")
            return False
        except Exception as exc:  # noqa: BLE001 (a build error, a broken toolchain, …): stay on torch
            reason = f"the build failed ({type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]})"
    if reason is not None:
        _state, _failure = "unavailable", reason
        remember_failure(directory, reason)
        warn(f"attnviz's fused attention kernel is unavailable: {reason}. {REMEDY}")
        return False
    forget_failure(directory)
    _state = "loaded"
    return True


def _modified(path: Path) -> float | None:
    """``path``'s modification time, or None if it does not exist."""
    try:
        return path.stat().st_mtime
    except OSError:
        return None


@contextmanager
def _waiting_for(pid: int) -> Iterator[None]:
    """A status line while another process builds the kernel."""
    who = f"process {pid}" if pid else "another process"
    with status(f"waiting for {who} to finish building attnviz's fused attention kernel"):
        yield


def build_notice(directory: Path) -> str:
    """What every build says as it starts (through the caller's reporter)."""
    return f"{BUILD_NOTICE}, in {directory}"


def kernel_name(capability: str) -> str:
    """The extension's name for this CPU capability: a hash of everything that changes the binary (the source,
    the flags, the compiler and its version, torch's version and installation, the Python ABI:
    :func:`~attnviz.core.kernel_build.build_inputs`), so that every combination has a build of its own and
    none rebuilds another's (two virtual environments on one machine, a new compiler, a new attnviz)."""
    return f"attnviz_softmax_rows_{inputs_hash(build_inputs(_source(), _compiler_flags(capability)))}"


def build_directory(name: str) -> Path:
    """The build folder of extension ``name``: ``name`` under the extension cache (``$TORCH_EXTENSIONS_DIR``)."""
    return extensions_root() / name


def describe_kernel() -> tuple[str, str, Path | None]:
    """``(state, why, build folder)`` for a bug report, without building or loading anything.

    States: ``loaded`` (in this process), ``built`` (a binary for exactly this source, compiler, torch and
    Python is in the folder: it loads in well under a second), ``building`` (another process holds the
    folder's build lock now), ``not built`` (builds on the first corpus pass), ``disabled``
    (``ATTNVIZ_KERNEL=0``), ``unavailable`` (with why). The folder is the one this environment uses.
    """
    if kernel_disabled() or _state == "disabled":
        return "disabled", f"{KERNEL_VARIABLE}=0", None
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in VECTOR_CAPABILITIES:
        return "unavailable", f"the kernel needs AVX2; this CPU offers {capability}", None
    name = kernel_name(capability)
    directory = build_directory(name)
    if _state == "loaded":
        return "loaded", f"{capability} lanes", directory
    if _state == "unavailable" and _failure:
        return "unavailable", _failure, directory
    holder = lock_holder(directory)
    if holder is not None:
        return "building", f"process {holder or '?'} is building it now", directory
    if (directory / f"{name}.so").exists():
        return "built", f"{capability} lanes", directory
    earlier = remembered_failure(directory)
    if earlier is not None:
        return "unavailable", f"{earlier}; not tried again until the compiler changes", directory
    missing = missing_tools()
    if missing is not None:
        return "unavailable", f"{missing}: the first corpus pass will say so once", directory
    return "not built", "builds on the first corpus pass (about a minute)", directory


def kernel_status() -> tuple[KernelState, str, float]:
    """(state, why it is unavailable or "", seconds the last :func:`prepare_kernel` took)."""
    return _state, _failure, _build_seconds


@contextmanager
def kernel_suspended() -> Iterator[None]:
    """Run the enclosed code on torch's operations even though the kernel is loaded (benchmarks, tests)."""
    global _module
    module, _module = _module, None
    try:
        yield
    finally:
        _module = module
