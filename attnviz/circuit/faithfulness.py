"""Exact measurements with edges patched: circuits (faithfulness) and path patching (``verify``).

A circuit keeps some edges: the clean prompt runs, and every edge *not* kept carries the sender's corrupt
activation to its receiver (:class:`~attnviz.circuit.trace.EdgePatch`). Its faithfulness is
``(M_circuit − M_corrupt) / (M_clean − M_corrupt)``: 1 for the whole graph (nothing patched: the clean run),
0 for the empty circuit (every receiver reads the corrupt stream: the corrupt run).

Path patching of one edge runs the corrupt prompt and lets the sender's clean activation reach that receiver
alone; its effect ``M_patched − M_corrupt`` is what the edge's attribution estimates.

Many circuits (or edges) run as one batch: row ``t·b + i`` is circuit ``t`` on pair ``i``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from attnviz.circuit.attribution import Reference, Setting, metric_of
from attnviz.circuit.pairs import PairGroup, tile
from attnviz.circuit.trace import EdgePatch


def patched_metrics(
    setting: Setting,
    groups: Sequence[tuple[PairGroup, Reference]],
    drops: Tensor,
    *,
    source: Literal["clean", "corrupt"],
    advance=lambda done: None,
) -> Tensor:
    """``[n]`` float64: the metric averaged over every pair, for each of ``n`` patchings ``drops`` ``[n, S, R]``
    (True where the edge carries the other run's activation); the ``source`` prompt runs. Each process of a
    data-parallel run measures its own pairs; the sums are shared."""
    total = torch.zeros(drops.shape[0], dtype=torch.float64)
    local = sum(len(group) for group, _ in groups)
    for group, reference in groups:
        size = len(group)
        per_chunk = max(1, setting.batch_size // size)
        for start in range(0, drops.shape[0], per_chunk):
            chunk = drops[start : start + per_chunk]
            times = chunk.shape[0]
            target = reference.corrupt_acts if source == "clean" else reference.clean_acts  # [S, b, q, w]
            patch = EdgePatch(
                drop=chunk.to(device=target.device, dtype=target.dtype).repeat_interleave(size, dim=0),
                target=target.repeat(1, times, 1, 1),
            )
            batch = tile(group.clean if source == "clean" else group.corrupt, times)
            with torch.no_grad():
                logits = setting.trace(patch=patch).run(batch)
            values = metric_of(logits, group, setting.metric, reference.clean_logprobs, times)
            total[start : start + times] += values.double().cpu().view(times, size).sum(1)
            advance(times)
    (total,) = setting.parallel.sum([total])
    (pairs,) = setting.parallel.sum_numbers([local])
    return total / pairs


def keep_top(ranking: Tensor, edges: Tensor, counts: Sequence[int]) -> Tensor:
    """``[n, S, R]`` drops of the circuits that keep the ``counts[i]`` best-ranked edges (``ranking`` ``[S, R]``:
    0 for the best edge; ``edges``: the graph's ``[S, R]`` bool)."""
    kept = ranking[None] < torch.as_tensor(list(counts), dtype=torch.long)[:, None, None]  # [n, S, R]
    return edges[None] & ~kept


def ranking_of(scores: Tensor, edges: Tensor) -> Tensor:
    """``[S, R]`` long: each edge's rank by ``|score|`` (0: the largest); non-edges rank after every edge."""
    flat = scores.abs().masked_fill(~edges, -1.0).flatten()
    order = torch.argsort(flat, descending=True, stable=True)
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(order.numel())
    return ranks.view(scores.shape)


def curve_counts(total: int, points: int) -> list[int]:
    """Edge counts from 0 to ``total``, spaced evenly on a log scale (about ``points`` of them)."""
    if total == 0:
        return [0]
    steps = torch.logspace(0, torch.log10(torch.tensor(float(total))), max(2, points - 1)).round().long()
    return sorted({0, total, *(int(value) for value in steps)})


def normalized(values: Tensor, clean: float, corrupt: float) -> list[float]:
    """``(M − M_corrupt) / (M_clean − M_corrupt)`` of each value."""
    return ((values - corrupt) / (clean - corrupt)).tolist()


def smallest_reaching(
    setting: Setting,
    groups: Sequence[tuple[PairGroup, Reference]],
    ranking: Tensor,
    edges: Tensor,
    curve: list[tuple[int, float]],
    target: float,
    clean: float,
    corrupt: float,
) -> tuple[int, float, int]:
    """The fewest top edges whose circuit reaches ``target`` faithfulness: the first curve point that does, then
    bisection down to the previous point (faithfulness taken as growing between them). Returns (edges,
    faithfulness, circuits run); the whole graph when no point reaches it."""
    above = [index for index, (_, value) in enumerate(curve) if value >= target]
    if not above:
        return curve[-1][0], curve[-1][1], 0
    first = above[0]
    if first == 0:
        return curve[0][0], curve[0][1], 0
    low, high, best = curve[first - 1][0], curve[first][0], curve[first][1]
    runs = 0
    while high - low > 1:
        middle = (low + high) // 2
        value = normalized(
            patched_metrics(setting, groups, keep_top(ranking, edges, [middle]), source="clean"), clean, corrupt
        )[0]
        runs += 1
        if value >= target:
            high, best = middle, value
        else:
            low = middle
    return high, best, runs
