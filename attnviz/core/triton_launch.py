"""How the GPU tile kernel is launched, and which launch each GPU gets: timed on the GPU itself, the first time.

The fastest tile shape, warps and pipeline depth depend on the GPU, the input's dtype and head size, which statistics
the pass computes, and the length (how many programs fill the GPU). A table measured on one GPU chooses badly on
another (on an H200, LLaMA-8B's float32 heads at 8,192 tokens took 147.4 ms a layer with the default launch and
117.8 ms with the fastest), so the first call of each kind on a GPU times :data:`CANDIDATE_LAUNCHES` with the
call's own tensors, keeps the fastest, and writes it to ``gpu-launches.json`` in attnviz's cache, where later
processes find it. A kind is a :class:`CallKind`: the GPU's name, Triton's version and the kernel's source are in it,
so that a new GPU, Triton or kernel is timed again.

Timing runs the kernel a few more times on the call's own tensors: it only writes its outputs (never adds to them),
so the call's result is the chosen launch's, as on every later call. ``ATTNVIZ_GPU_TUNING=0`` turns the timing off:
launches then come from :data:`LAUNCH_CONFIGS` or the default. Calls made while a CUDA graph is captured or
``torch.compile`` traces are never timed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch

from attnviz.common.cache import cache_root


@dataclass(frozen=True)
class LaunchConfig:
    """How the kernel is launched: ``block_m`` queries per program, keys in tiles of ``block_n``, and Triton's
    ``num_warps`` and ``num_stages`` (software pipelining of the key/value loads).

    ``float32_products``: how float32 inputs are multiplied. ``"tf32x3"`` as three TF32 products on the GPU's
    tensor cores: each input split into a TF32 part (10 of float32's 23 mantissa bits) and the rest, and
    ``big·big + (small·big + big·small)`` summed in float32, which keeps float32's precision (as sdpa's
    memory-efficient float32 kernel does: CUTLASS's "fast F32"); ``"ieee"`` in float32 on the CUDA cores, nearly
    four times the instructions. ``"auto"`` (the default) is ``"tf32x3"`` where the installed Triton adds the
    remainders' products apart from the running sum (3.2 and later, :func:`~attnviz.core.triton_rows.precise_tf32x3`),
    else ``"ieee"``. ``benchmarks/bench_stats_gpu.py --tune`` times both and prints how far apart they lie.
    """

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    float32_products: Literal["auto", "ieee", "tf32x3"] = "auto"

    @property
    def label(self) -> str:
        return f"{self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}"


#: the launch per input dtype and head size (a power of two ≥ 16) where timing is off or impossible and the default
#: is not the fastest; measured by ``benchmarks/bench_stats_gpu.py --tune``
LAUNCH_CONFIGS: dict[tuple[torch.dtype, int], LaunchConfig] = {
    # LLaMA-8B's heads of 128 in float32 (full-precision products), on an H200: 117.8 ms a layer at 8,192 tokens
    # against 147.4 by default
    (torch.float32, 128): LaunchConfig(block_m=64, block_n=32, num_warps=4, num_stages=3),
}

DEFAULT_LAUNCH = LaunchConfig()

#: the launches timed on a GPU, the default first: those that ran fastest on an H200 (64 queries by 64 or 32 keys
#: on 4 warps) and 128 queries on 8 warps, as flash-attention kernels launch on Hopper. Compiled for Hopper with
#: every statistic, none of them spills more than 72 bytes a thread in bfloat16; 128 × 128 tiles, left out, spill
#: 304 (heads of 64) and 576 (128) (``benchmarks/bench_kernel_compiled.py --all-launches``). Each is compiled once
#: for each kind of call (seconds; Triton keeps the code on disk)
CANDIDATE_LAUNCHES: tuple[LaunchConfig, ...] = (
    DEFAULT_LAUNCH,
    LaunchConfig(64, 64, 4, 3),
    LaunchConfig(64, 32, 4, 3),
    LaunchConfig(128, 64, 8, 2),
    LaunchConfig(128, 64, 8, 3),
)

#: calls with fewer query-key pairs (batch × heads × queries × keys) take the table's launch: the kernel then takes
#: a small part of the pass, and compiling every candidate would cost more than the fastest saves (SmolLM2's 9
#: heads reach it at 1,366 tokens, LLaMA-8B's 32 at 725)
LEAST_TIMED_PAIRS = 1 << 24

#: where the launches are kept, in attnviz's cache (``attnviz env`` lists it)
LAUNCH_FILE = "gpu-launches.json"


def table_launch(dtype: torch.dtype, head_size: int) -> LaunchConfig:
    """The launch of :data:`LAUNCH_CONFIGS` for ``dtype`` and ``head_size`` (a power of two), or the default."""
    return LAUNCH_CONFIGS.get((dtype, head_size), DEFAULT_LAUNCH)


def tuning_enabled() -> bool:
    """Whether a GPU times the candidate launches (``ATTNVIZ_GPU_TUNING=0`` says no)."""
    return os.environ.get("ATTNVIZ_GPU_TUNING", "1").strip().lower() not in ("0", "false", "no", "off")


def launches_path() -> Path:
    """The file that keeps each kind of call's fastest launch."""
    return cache_root() / LAUNCH_FILE


@dataclass(frozen=True)
class CallKind:
    """What the fastest launch depends on. Lengths and the programs per query block (batch × heads) are rounded up
    to powers of two, so that a corpus of texts of many lengths is timed a few times, not once per length."""

    device: str  # the GPU's name and compute capability
    software: str  # Triton's version and a digest of the kernel's source
    dtype: str
    head_size: int  # a power of two ≥ 16: the larger of the query's and the value's
    statistics: bool  # the row summary or the carriers' sums (registers per thread)
    keys_shown: str  # "causal", "mask", "all" ... with "+window", "+padding", "+sinks"
    queries: int
    keys: int
    programs: int

    @property
    def label(self) -> str:
        return " | ".join(str(value) for value in asdict(self).values())


def call_kind(query: torch.Tensor, key: torch.Tensor, head_size: int, *, statistics: bool, keys_shown: str) -> CallKind:
    """The kind of a call with ``query`` ``[b, h, q, d]`` and ``key`` ``[b, kvh, k, d]`` on their GPU."""
    batch, heads, query_len = query.shape[:3]
    return _kind(query.device, query.dtype, head_size, statistics, keys_shown, query_len, key.shape[2], batch * heads)


@functools.lru_cache(maxsize=1024)  # every layer of a pass makes the same call: its kind is made once
def _kind(
    device: torch.device, dtype: torch.dtype, head_size: int, statistics: bool, keys_shown: str, query_len: int,
    key_len: int, programs: int,
) -> CallKind:  # fmt: skip
    return CallKind(
        device=_device_name(device),
        software=_software(),
        dtype=str(dtype).removeprefix("torch."),
        head_size=head_size,
        statistics=statistics,
        keys_shown=keys_shown,
        queries=power_of_two(query_len),
        keys=power_of_two(key_len),
        programs=power_of_two(programs),
    )


#: a call that runs the kernel once with a launch
Launcher = Callable[[LaunchConfig], None]
#: milliseconds a call takes (what :func:`gpu_milliseconds` measures)
Clock = Callable[[Callable[[], None]], float]


class LaunchTuner:
    """The fastest launch of each kind of call: in memory, in ``path`` (a JSON file), or timed by ``clock``."""

    def __init__(self, path: Path | None, clock: Clock, candidates: Sequence[LaunchConfig] = CANDIDATE_LAUNCHES):
        self.path = path
        self.clock = clock
        self.candidates = tuple(candidates)
        self.chosen: dict[CallKind, LaunchConfig] = {}
        self.timings: dict[CallKind, dict[str, float | None]] = {}  # launch label -> ms (None: it failed)
        self._read = False

    def known(self, kind: CallKind) -> LaunchConfig | None:
        """The launch kept for ``kind`` (in memory, or in the file), or None: it has not been timed."""
        if kind not in self.chosen and not self._read:
            self._load()
        return self.chosen.get(kind)

    def launch_for(self, kind: CallKind, launch: Launcher, fallback: LaunchConfig = DEFAULT_LAUNCH) -> LaunchConfig:
        """The fastest launch for ``kind``; the first time, ``fallback`` and each candidate are run by ``launch``
        and timed. What ``fallback`` raises is raised; a candidate that raises (a tile that needs more shared memory
        or registers than the GPU has) is left out."""
        chosen = self.known(kind)
        if chosen is None:
            chosen = self._time(kind, launch, fallback)
        return chosen

    def _time(self, kind: CallKind, launch: Launcher, fallback: LaunchConfig) -> LaunchConfig:
        timings: dict[str, float | None] = {}
        fastest, best = self.clock(lambda: launch(fallback)), fallback
        timings[fallback.label] = round(fastest, 4)
        for candidate in self.candidates:
            if candidate == fallback:
                continue
            try:
                milliseconds = self.clock(lambda candidate=candidate: launch(candidate))  # type: ignore[misc]
            except Exception:  # noqa: BLE001  # the launch does not fit this GPU: not a candidate here
                timings[candidate.label] = None
                continue
            timings[candidate.label] = round(milliseconds, 4)
            if milliseconds < fastest:
                fastest, best = milliseconds, candidate
        self.chosen[kind], self.timings[kind] = best, timings
        self._save(kind, best, timings)
        return best

    def _load(self) -> None:
        """Read the kept launches once (a missing or unreadable file, or record, counts as none)."""
        self._read = True
        if self.path is None:
            return
        for record in _read_records(self.path).values():
            with contextlib.suppress(TypeError, ValueError, KeyError, AttributeError):
                kind, chosen = CallKind(**record["kind"]), LaunchConfig(**record["launch"])
                timings = dict(record.get("milliseconds") or {})
                self.chosen.setdefault(kind, chosen)
                self.timings.setdefault(kind, timings)

    def _save(self, kind: CallKind, chosen: LaunchConfig, timings: dict[str, float | None]) -> None:
        """Add ``kind``'s launch to the file, atomically (best effort: an unwritable cache only costs timing again in
        the next process; the kinds another process wrote meanwhile are kept)."""
        if self.path is None:
            return
        records = _read_records(self.path)
        records[kind.label] = {"kind": asdict(kind), "launch": asdict(chosen), "milliseconds": timings}
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(records, indent=1, ensure_ascii=False), encoding="utf-8")
            os.replace(temporary, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                temporary.unlink()


def _read_records(path: Path) -> dict[str, dict]:
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return (
        {label: record for label, record in records.items() if isinstance(record, dict)}
        if isinstance(records, dict)
        else {}
    )


def gpu_milliseconds(call: Callable[[], None]) -> float:
    """The time ``call`` takes on the current GPU stream: one run to compile and warm up, one timed, and up to four
    more where that one took less than 5 ms (the fastest average is kept)."""
    call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    once = start.elapsed_time(end)
    repeats = min(4, int(5.0 / max(once, 1e-3)))
    if repeats == 0:
        return once
    start.record()
    for _ in range(repeats):
        call()
    end.record()
    end.synchronize()
    return min(once, start.elapsed_time(end) / repeats)


def shared_tuner() -> LaunchTuner:
    """The tuner that keeps its launches in attnviz's cache: one per cache folder, found by the variables that name
    it (working the path out takes ~15 µs, too long for every layer's call)."""
    return _tuner_for(*(os.environ.get(name) for name in ("ATTNVIZ_CACHE", "XDG_CACHE_HOME", "HOME")))


@functools.lru_cache(maxsize=4)
def _tuner_for(*_variables: str | None) -> LaunchTuner:
    return LaunchTuner(launches_path(), gpu_milliseconds)


def may_time(device: torch.device, pairs: int) -> bool:
    """Whether a call on ``device`` over ``pairs`` query-key pairs may be timed now: a CUDA device, timing on, a
    long enough call (:data:`LEAST_TIMED_PAIRS`), no graph capture or tracing."""
    if device.type != "cuda" or not tuning_enabled() or pairs < LEAST_TIMED_PAIRS:
        return False
    if torch.compiler.is_compiling():
        return False
    with torch.cuda.device(device):
        return not torch.cuda.is_current_stream_capturing()


@functools.lru_cache(maxsize=16)
def _device_name(device: torch.device) -> str:
    if device.type != "cuda":
        return device.type
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} sm{major}{minor}"


@functools.cache
def _software() -> str:
    import triton

    source = Path(__file__).with_name("triton_kernel.py").read_bytes()
    return f"triton {triton.__version__} kernel {hashlib.sha256(source).hexdigest()[:12]}"


@functools.lru_cache(maxsize=256)
def power_of_two(value: int, least: int = 1) -> int:
    """The least power of two ≥ ``value`` and ≥ ``least``."""
    return max(least, 1 << max(0, value - 1).bit_length())
