"""Bounded resources: every size a caller asks for is checked against the memory it needs *before* allocating.

One place for the idea, so every size-like parameter behaves the same:

* :func:`require_memory` refuses a size whose estimated memory exceeds what this process can still
  get (the free memory of the machine, and the address-space limit ``ulimit -v`` when one is set),
  with a :class:`~attnviz.common.errors.ParameterError` naming the parameter;
* :func:`blame_memory` turns an out-of-memory failure inside a block (``MemoryError``, torch's
  ``can't allocate memory``, ``std::bad_alloc``, CUDA out of memory) into the same error, so the
  message names the parameter that caused it, not a generic list;
* :func:`is_out_of_memory` recognises those failures (the command line's last resort uses it).

Estimates are deliberately rough (within a small factor): their job is to refuse a request
that cannot fit by orders of magnitude, not to plan memory to the byte.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator

from attnviz.common.errors import ParameterError

#: bytes one token costs while held by attnviz around a forward pass: the token string, its
#: flags and word id in Python lists, its id, mask and label in int64 tensors, the activations
#: (measured: a toy decoder on 50,000 examples holds about 40 KB per 18-token example)
BYTES_PER_TOKEN = 400
#: what the forward pass of one token costs in one layer, per head and key: a float32 weight
#: plus its score, with room for the temporaries of the softmax
BYTES_PER_ATTENTION_WEIGHT = 24
#: texts of out-of-memory failures that libraries raise as RuntimeError (torch on CPU and CUDA, C++)
_OUT_OF_MEMORY_TEXTS = ("can't allocate memory", "not enough memory", "out of memory", "bad_alloc")


def _memory_available() -> int | None:
    """Bytes of RAM the kernel says can still be handed out (``MemAvailable``), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _address_space_left() -> int | None:
    """Bytes of address space left under ``RLIMIT_AS`` (``ulimit -v``), None without a limit."""
    try:
        limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError):
        return None
    if limit == resource.RLIM_INFINITY:
        return None
    used = 0
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    used = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return max(0, limit - used)


def available_memory() -> int | None:
    """Bytes this process can still allocate (the smaller of free RAM and the address-space limit); None: unknown."""
    known = [value for value in (_memory_available(), _address_space_left()) if value is not None]
    return min(known) if known else None


def format_bytes(size: float) -> str:
    """``1.5 GB``, ``300 MB``, … (decimal units, as ``ls -h --si`` and disk makers count)."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(size) < 1000 or unit == "PB":
            return f"{size:.0f} {unit}" if unit in ("B", "KB") else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} PB"


def require_memory(parameter: str, value: object, needed: float, what: str) -> None:
    """Refuse ``parameter`` = ``value`` when ``what`` needs an estimated ``needed`` bytes that this process cannot get.

    Raises :class:`~attnviz.common.errors.ParameterError` (the command line names the option).
    Does nothing when the free memory is unknown.
    """
    available = available_memory()
    if available is None or needed <= available:
        return
    raise ParameterError(
        parameter,
        f"{{{parameter}}} {value} needs about {format_bytes(needed)} of memory for {what}, more than the "
        f"{format_bytes(available)} available: give a smaller {{{parameter}}}",
        value,
    )


def batch_memory(examples: int, tokens: int, *, heads: int = 1) -> float:
    """Estimated bytes to hold ``examples`` sequences of ``tokens`` tokens and run one attention layer over them."""
    examples, tokens = max(0, examples), max(0, tokens)
    return float(examples) * tokens * (BYTES_PER_TOKEN + BYTES_PER_ATTENTION_WEIGHT * max(1, heads) * tokens)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure to allocate memory (Python's, torch's on CPU or CUDA, a C++ ``bad_alloc``)."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return any(marker in text for marker in _OUT_OF_MEMORY_TEXTS)
    return False


@contextlib.contextmanager
def blame_memory(parameter: str, value: object, what: str) -> Iterator[None]:
    """Running out of memory inside the block raises a :class:`ParameterError` naming ``parameter``."""
    try:
        yield
    except (MemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        raise ParameterError(
            parameter, f"out of memory for {what} with {{{parameter}}} {value}: give a smaller {{{parameter}}}", value
        ) from None


def clamp(value: int, most: int) -> int:
    """``value``, or ``most`` when it asks for more than can be used (a window wider than the sequence, …)."""
    return min(value, most)


__all__ = [
    "available_memory",
    "batch_memory",
    "blame_memory",
    "clamp",
    "format_bytes",
    "is_out_of_memory",
    "require_memory",
]
