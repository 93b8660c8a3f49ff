"""The CLI side of data-parallel runs: join torchrun's process group, let only rank 0 speak.

Commands wrap their work in :func:`cli_session`; without torchrun it yields the
single-process :data:`attnviz.common.parallel.SINGLE_PROCESS` and changes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from attnviz.common.parallel import DataParallel, distributed_session


@contextlib.contextmanager
def cli_session(device: str = "auto", device_map=None) -> Iterator[DataParallel]:
    """Join torchrun's process group (if any); silence the console of every rank but 0."""
    from attnviz.cli.console import console
    from attnviz.common.errors import InputError

    with distributed_session(device) as parallel:
        if parallel.distributed and device_map is not None:
            import torch

            if torch.cuda.is_available():
                raise InputError(
                    "--device-map auto spreads one model over every GPU, but under torchrun each process "
                    "already has a GPU of its own: drop --device-map, or run one process"
                )
        quiet = console.quiet
        # Ranks other than 0 stay quiet to the end, error lines included: every rank meets the
        # same bad input, and one line of it is enough.
        console.quiet = quiet or not parallel.is_main
        yield parallel
        console.quiet = quiet


def throughput_line(stats) -> str:
    """``minilm: 12,345 tokens in 3.2 s, 3,858 tokens/s (2 processes)``."""
    processes = f" ({stats.processes} processes)" if stats.processes > 1 else ""
    rate = stats.tokens_per_second
    speed = f", {rate:,.0f} tokens/s" if rate is not None else ""
    seconds = f" in {stats.seconds:.2f} s" if stats.seconds is not None else ""
    return f"{stats.model}: {stats.num_tokens:,} tokens{seconds}{speed}{processes}"
