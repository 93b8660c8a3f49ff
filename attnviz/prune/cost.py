"""Cost of a model: parameter count and forward latency, measured side by side.

Latency is the median wall time of ``repeats`` forward passes (no gradients,
no observers, after warm-up passes) on one input of a fixed length (the model's
:meth:`~attnviz.models.base.LoadedModel.timing_batch`). Models
compared are timed in alternation, round after round, so that drift of the
machine (frequency scaling, other processes) affects them alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
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


def measure_latency(
    models: Sequence[LoadedModel], batch: EncodedBatch, *, repeats: int = 5, warmup: int = 2
) -> list[float]:
    """Median forward latency in milliseconds of each model on ``batch``, timed in alternation."""
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
    for _ in range(repeats):
        for index, loaded in enumerate(models):
            timings[index].append(run(loaded))
    return [statistics.median(values) for values in timings]
