"""Cost of a model: parameter count and forward latency, measured side by side.

Latency is measured on one input of a fixed length (the model's
:meth:`~attnviz.models.base.LoadedModel.timing_batch`), forward passes without gradients or
observers, after warm-up passes. The models compared are timed in alternation, round after
round, so that drift of the machine (frequency scaling, other processes) affects them alike.

Each model's latency is the **fastest** of its rounds: other work on the machine only ever adds
time, so the fastest pass is the one least disturbed. With it comes the range (fastest,
slowest), and :func:`compare_latencies` says whether the difference is *conclusive*:

* every round gives one paired ratio ``after / before`` (the two passes ran back to back). A
  sign test on those pairs must reject "either is as likely to be faster" at the 5 % level
  (with 10 rounds: 9 of them must agree), in the direction of the fastest-of-N change;
* the change of the fastest times must be at least :data:`SMALLEST_DIFFERENCE` (2 %), and larger
  than the noise: how far each model's median round lies above its fastest.

Otherwise the two cannot be told apart on this machine now (a busy machine spreads the rounds),
and that is what is reported instead of a slowdown or a speed-up that is noise.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnviz.models.base import EncodedBatch, LoadedModel, parameter_count  # noqa: F401 (re-exported)


def output_tensor(outputs: Any) -> Tensor:
    """The main output tensor of a forward pass: logits, else the last hidden state, else the first entry."""
    if isinstance(outputs, Tensor):
        return outputs
    for name in ("logits", "last_hidden_state"):
        value = getattr(outputs, name, None)
        if isinstance(value, Tensor):
            return value
    if isinstance(outputs, dict):
        for name in ("logits", "last_hidden_state"):
            if isinstance(outputs.get(name), Tensor):
                return outputs[name]
    return outputs[0]


def forward_output(loaded: LoadedModel, batch: EncodedBatch, context=None) -> Tensor:
    """``loaded``'s main output on ``batch`` (logits for LMs), without gradients."""
    with torch.no_grad():
        outputs = loaded.forward(batch, context, logits=True)
    return output_tensor(outputs).double()


#: a latency change smaller than this is never called a difference
SMALLEST_DIFFERENCE = 0.02
#: the sign test's level: the chance that rounds agree this often although neither model is faster
SIGN_TEST_LEVEL = 0.05


@dataclass(frozen=True)
class Timings:
    """One model's forward times in milliseconds, one per round, in the order measured."""

    milliseconds: tuple[float, ...]

    @property
    def fastest(self) -> float:
        return min(self.milliseconds)

    @property
    def slowest(self) -> float:
        return max(self.milliseconds)

    @property
    def range(self) -> tuple[float, float]:
        """``(fastest, slowest)``."""
        return self.fastest, self.slowest

    @property
    def noise(self) -> float:
        """How far the median round lies above the fastest, as a fraction of the fastest (0: no spread)."""
        return statistics.median(self.milliseconds) / self.fastest - 1.0 if self.fastest > 0 else math.inf


@dataclass(frozen=True)
class LatencyComparison:
    """Two models timed round after round: their fastest times, their ranges, and whether they differ."""

    before: Timings
    after: Timings
    #: the difference is larger than the noise and the rounds agree on its direction (see the module docstring)
    conclusive: bool
    #: chance of rounds agreeing this often on the direction if neither model were faster (two-sided sign test)
    sign_test_p: float

    @property
    def change(self) -> float:
        """``after / before − 1`` of the fastest times: −0.1 is 10 % faster."""
        return self.after.fastest / self.before.fastest - 1.0

    @property
    def rounds(self) -> int:
        return len(self.before.milliseconds)


def sign_test(wins: int, rounds: int) -> float:
    """Two-sided p-value of ``wins`` of ``rounds`` going one way when both ways are equally likely."""
    if rounds == 0:
        return 1.0
    extreme = max(wins, rounds - wins)
    tail = sum(math.comb(rounds, k) for k in range(extreme, rounds + 1)) / 2**rounds
    return min(1.0, 2 * tail)


def compare_latencies(before: Sequence[float], after: Sequence[float]) -> LatencyComparison:
    """Decide whether ``after`` is faster or slower than ``before`` (paired rounds, milliseconds).

    ``before[i]`` and ``after[i]`` are round ``i``'s two passes, run back to back.
    """
    if len(before) != len(after) or not before:
        raise ValueError("give one time of each model per round, at least one round")
    timings_before, timings_after = Timings(tuple(before)), Timings(tuple(after))
    change = timings_after.fastest / timings_before.fastest - 1.0
    faster_after = sum(a < b for a, b in zip(after, before, strict=True))
    slower_after = sum(a > b for a, b in zip(after, before, strict=True))
    agreeing = faster_after if change < 0 else slower_after
    p_value = sign_test(agreeing, faster_after + slower_after)
    noise = max(timings_before.noise, timings_after.noise)
    conclusive = p_value < SIGN_TEST_LEVEL and abs(change) >= max(SMALLEST_DIFFERENCE, noise)
    return LatencyComparison(timings_before, timings_after, conclusive, p_value)


def time_forward_passes(
    models: Sequence[LoadedModel], batch: EncodedBatch, *, repeats: int = 10, warmup: int = 2
) -> list[Timings]:
    """Each model's forward time in milliseconds on ``batch``, ``repeats`` rounds timed in alternation."""
    timings: list[list[float]] = [[] for _ in models]

    def run(loaded: LoadedModel) -> float:
        if loaded.device.type == "cuda":
            torch.cuda.synchronize(loaded.device)
        start = time.perf_counter()
        with torch.no_grad():
            loaded.forward(batch)
        if loaded.device.type == "cuda":
            torch.cuda.synchronize(loaded.device)
        return (time.perf_counter() - start) * 1000.0

    for _ in range(warmup):
        for loaded in models:
            run(loaded)
    for round_index in range(repeats):
        # alternate which model goes first, so neither always runs on a cache the other warmed
        order = list(enumerate(models))
        if round_index % 2:
            order.reverse()
        for index, loaded in order:
            timings[index].append(run(loaded))
    return [Timings(tuple(values)) for values in timings]


def measure_latency(
    before: LoadedModel, after: LoadedModel, batch: EncodedBatch, *, repeats: int = 10, warmup: int = 2
) -> LatencyComparison:
    """Time ``before`` and ``after`` in alternation on ``batch`` and compare them (:func:`compare_latencies`)."""
    timings_before, timings_after = time_forward_passes([before, after], batch, repeats=repeats, warmup=warmup)
    return compare_latencies(timings_before.milliseconds, timings_after.milliseconds)
