"""Data parallelism over processes, nodes and GPUs with ``torch.distributed``: the one place that knows about it.

A corpus pass (statistics, head importance, …) becomes data-parallel in three steps:

1. every process plans the same batches (deterministic, see :mod:`attnviz.models.batching`);
2. :meth:`DataParallel.shard` picks this process's share, balanced by cost;
3. after the local pass, :meth:`DataParallel.sum` adds the sufficient statistics
   (sums, sums of squares, counts) of every process, in float64.

So the merged result equals a one-process run up to the order of float64 additions.
Under ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the environment)
:func:`distributed_session` joins the process group (``gloo`` on CPU, ``nccl`` on
CUDA); without it everything is a single process and no collective runs::

    with distributed_session("auto") as parallel:
        device = parallel.device_for("auto")         # cuda:LOCAL_RANK under torchrun with GPUs
        mine = parallel.shard(costs)                  # indices of the items this process handles
        totals = parallel.sum([sums, squares, counts])  # float64, the same on every process
        if parallel.is_main: ...                      # only rank 0 prints and writes
"""

from __future__ import annotations

import contextlib
import heapq
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnviz.common.errors import DistributedError

#: Environment variables torchrun sets for every process it starts.
RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class DataParallel:
    """This process's place in a data-parallel run (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    #: where collectives run: ``cuda:N`` for ``nccl``, ``cpu`` for ``gloo``
    collective_device: str = "cpu"

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that prints and writes."""
        return self.rank == 0

    def device_for(self, device: str = "auto") -> str:
        """The device this process loads its model on: ``cuda``/``auto`` become ``cuda:LOCAL_RANK`` when distributed."""
        device = (device or "auto").lower()
        if not self.distributed or not torch.cuda.is_available():
            return device
        if device in ("auto", "cuda"):
            return f"cuda:{self.local_rank}"
        return device

    def shard(self, costs: Sequence[float]) -> list[int]:
        """Indices (ascending) of the items this process handles.

        Items go, most costly first, to the process with the least work so far (ties to the
        lowest rank): the same assignment on every process, and each item exactly once.
        """
        if not self.distributed:
            return list(range(len(costs)))
        loads = [(0.0, rank) for rank in range(self.world_size)]  # heap of (work so far, rank)
        mine = []
        for index in sorted(range(len(costs)), key=lambda i: -costs[i]):
            load, rank = heapq.heappop(loads)
            if rank == self.rank:
                mine.append(index)
            heapq.heappush(loads, (load + float(costs[index]), rank))
        return sorted(mine)

    def sum(self, tensors: Sequence[Tensor]) -> list[Tensor]:
        """Element-wise sums over all processes, as float64 CPU tensors of the same shapes (one collective)."""
        tensors = [tensor.detach().to("cpu", torch.float64) for tensor in tensors]
        if not self.distributed or not tensors:
            return tensors
        import torch.distributed as dist

        flat = torch.cat([tensor.reshape(-1) for tensor in tensors]).to(self.collective_device)  # [total]
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat = flat.cpu()
        out, start = [], 0
        for tensor in tensors:
            out.append(flat[start : start + tensor.numel()].view(tensor.shape))
            start += tensor.numel()
        return out

    def sum_numbers(self, numbers: Sequence[float]) -> list[float]:
        """:meth:`sum` for plain numbers."""
        if not self.distributed:
            return [float(number) for number in numbers]
        (summed,) = self.sum([torch.tensor([float(number) for number in numbers], dtype=torch.float64)])
        return summed.tolist()

    def from_main(self, numbers: Sequence[float] | None, count: int) -> list[float]:
        """The main process's ``count`` numbers, on every process; the others pass ``None``.

        For what is measured once rather than shared out (a latency, a check on one input):
        every process measuring it would be waste, and processes timing side by side on
        the same cores would disturb each other's timings. Exact: the others add zeros.
        """
        if not self.distributed:
            return [float(number) for number in numbers or []]
        if self.is_main and (numbers is None or len(numbers) != count):
            raise ValueError(f"the main process must give {count} numbers, not {numbers!r}")
        return self.sum_numbers(list(numbers) if self.is_main else [0.0] * count)

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()


#: The single-process run: shards are everything, sums are the local values.
SINGLE_PROCESS = DataParallel()


def launched_by_torchrun() -> bool:
    """Whether torchrun (or another launcher) set this process's rank and world size."""
    return all(name in os.environ for name in RANK_VARIABLES[:2])


def _environment_int(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    try:
        return int(value)
    except ValueError as exc:
        raise DistributedError(
            f"the environment variable {name}={value!r} is not an integer: launch with torchrun"
        ) from exc


#: Environment variable: CPU threads of each process of a distributed run (see :func:`cpu_threads_per_process`).
THREADS_VARIABLE = "ATTNVIZ_THREADS_PER_PROCESS"


def physical_cores() -> int:
    """Physical cores this process may run on: the intra-op thread count torch picks by default."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores, processor, physical = set(), None, "0"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "processor":
                    processor = int(value)
                elif key == "physical id":
                    physical = value
                elif key == "core id" and processor in allowed:
                    cores.add((physical, value))
    except (OSError, ValueError):
        cores = set()
    return max(1, len(cores) or len(allowed))


#: value of :data:`THREADS_VARIABLE` that gives each process as many threads as one process would use
MATCH_ONE_PROCESS = "match"


def cpu_threads_per_process() -> int:
    """Intra-op CPU threads of each process of a distributed CPU run.

    By default each process takes its share of the machine's physical cores (cores divided by the
    processes torchrun started on this node, ``LOCAL_WORLD_SIZE``), so the processes never
    oversubscribe the cores; ``OMP_NUM_THREADS`` set above 1 says otherwise (torchrun sets it to 1
    itself when it is not set, so 1 is read as "not set"). The statistics then equal a one-process
    run's to float32 rounding: matrix products split their sums by thread count.
    ``ATTNVIZ_THREADS_PER_PROCESS=N`` fixes the count; ``=match`` gives each process as many threads
    as one process would use, which makes the merged statistics equal a one-process run's bit for
    bit (up to the order of float64 additions) at the price of oversubscribing the cores.
    """
    value = os.environ.get(THREADS_VARIABLE)
    if value is None:
        requested = os.environ.get("OMP_NUM_THREADS", "")
        if requested.isdigit() and int(requested) > 1:
            return int(requested)
        processes_here = max(1, _environment_int("LOCAL_WORLD_SIZE", 1))
        return max(1, physical_cores() // processes_here)
    if value.strip().lower() == MATCH_ONE_PROCESS:
        return physical_cores()
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        raise DistributedError(
            f"{THREADS_VARIABLE}={value!r} must be a positive integer, e.g. 1, or {MATCH_ONE_PROCESS!r}"
        )
    return threads


def join_from_environment(device: str = "auto") -> DataParallel:
    """Join the process group torchrun describes in the environment; a single process without it.

    The backend is ``nccl`` when this process runs on CUDA, ``gloo`` otherwise (where the
    process gets :func:`cpu_threads_per_process` threads).
    """
    if not launched_by_torchrun():
        return SINGLE_PROCESS
    rank = _environment_int("RANK", 0)
    world_size = _environment_int("WORLD_SIZE", 1)
    local_rank = _environment_int("LOCAL_RANK", 0)
    if world_size <= 1:
        return SINGLE_PROCESS
    import torch.distributed as dist

    uses_cuda = torch.cuda.is_available() and (device or "auto").lower() in ("auto", "cuda")
    backend = "nccl" if uses_cuda else "gloo"
    collective_device = "cpu"
    if uses_cuda:
        if local_rank >= torch.cuda.device_count():
            raise DistributedError(
                f"local rank {local_rank} has no GPU of its own ({torch.cuda.device_count()} visible): "
                "start at most as many processes per node as there are GPUs"
            )
        torch.cuda.set_device(local_rank)
        collective_device = f"cuda:{local_rank}"
    else:
        torch.set_num_threads(cpu_threads_per_process())  # its share of the cores (torchrun set 1)
    if not dist.is_initialized():
        try:
            dist.init_process_group(backend)
        except (RuntimeError, ValueError) as exc:
            raise DistributedError(
                f"cannot join the {backend} process group ({str(exc).splitlines()[0]}): launch with torchrun, "
                "e.g. torchrun --standalone --nproc-per-node 2 -m attnviz ..."
            ) from exc
    return DataParallel(rank, world_size, local_rank, collective_device)


@contextlib.contextmanager
def distributed_session(device: str = "auto") -> Iterator[DataParallel]:
    """:func:`join_from_environment`, leaving the process group at the end if this session joined it."""
    import torch.distributed as dist

    was_initialized = dist.is_available() and dist.is_initialized()
    parallel = join_from_environment(device)
    try:
        yield parallel
    finally:
        if parallel.distributed and not was_initialized and dist.is_initialized():
            dist.destroy_process_group()
