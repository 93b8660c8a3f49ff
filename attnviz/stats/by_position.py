"""Statistics along the input: per head, how attention changes with the query's position, in buckets.

For every head and every bucket of query positions (``[start, start + bucket_size)``), the mean
over the bucket's real queries of every text of:

* ``sink_mass``: ``Aᵢ₀``, the weight on the first token (padding is always on the right, so
  position 0 is each text's first real token);
* ``entropy``: ``−Σⱼ Aᵢⱼ ln Aᵢⱼ`` in nats;
* ``mean_distance``: ``Σⱼ Aᵢⱼ |i − j|`` in tokens (``i − j`` in a causal stack);
* ``recent_share``: ``Σ_{|i − j| ≤ 15} Aᵢⱼ``, the weight on the 16 most recent tokens in a causal
  stack (the query and the 15 before it); in a bidirectional stack the 15 on either side as well.

:class:`PositionSums` is fed by :class:`~attnviz.stats.accumulator.StatisticsAccumulator` from
the per-query values it already computes for each block (entropy, distance, first-token weight)
plus the recent share, taken from the fused kernel's band of weights around the diagonal or, without
it, gathered from the block (31 columns per row). Memory: ``4 × heads × buckets`` float64 per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attnviz.common.errors import ParameterError
from attnviz.common.parallel import DataParallel
from attnviz.core import AttentionSite
from attnviz.core.kernel_calls import RowSummary
from attnviz.stats.definitions import STATISTIC_INDEX
from attnviz.stats.geometry import BlockLayout

#: the per-bucket values, in the order of every ``[M, …]`` tensor here
POSITION_METRICS: tuple[str, ...] = ("sink_mass", "entropy", "mean_distance", "recent_share")
#: recent_share counts the keys ``j`` with ``|i − j| ≤ RECENT_TOKENS − 1``
RECENT_TOKENS = 16
#: the default bucket size gives at most this many buckets over the longest input …
TARGET_BUCKETS = 32
#: … and is a power of two of at least this many positions
MIN_AUTO_BUCKET = 16
#: at most this many buckets (memory ``4 × heads × buckets`` per layer stays small at any length)
MAX_BUCKETS = 4096
#: larger sizes are used as this (one bucket for any input a model can take; no integer overflow)
LARGEST_BUCKET = 2**40

# where each metric comes from in the accumulator's [S, b, h, q] per-query values
_FROM_VALUES = (STATISTIC_INDEX["first_token"], STATISTIC_INDEX["entropy"], STATISTIC_INDEX["mean_distance"])
_COUNTED = STATISTIC_INDEX["entropy"]  # counts every real query, as all four metrics do


def auto_bucket_size(longest: int) -> int:
    """The default bucket size: the smallest power of two ≥ 16 giving at most 32 buckets (256 at 8,192 tokens)."""
    size = MIN_AUTO_BUCKET
    while size * TARGET_BUCKETS < longest:
        size *= 2
    return size


def check_bucket_size(bucket_size: object) -> int | None:
    """``bucket_size`` as a usable int (None: the default), or a :class:`ParameterError`."""
    if bucket_size is None:
        return None
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, int):
        raise ParameterError("bucket_size", f"{{bucket_size}} must be a whole number, got {bucket_size!r}", bucket_size)
    if bucket_size < 1:
        raise ParameterError("bucket_size", f"{{bucket_size}} must be at least 1, got {bucket_size}", bucket_size)
    return min(bucket_size, LARGEST_BUCKET)


def recent_reach(longest: int) -> int:
    """How far from the diagonal recent_share reads: 15, or less for inputs that short (the same sum)."""
    return min(RECENT_TOKENS - 1, max(longest - 1, 0))


def recent_share(pattern: Tensor, layout: BlockLayout, reach: int) -> Tensor:
    """``[b, h, blk]``: each query's weight on keys within ``reach`` of it, from ``pattern`` ``[b, h, blk, k']``."""
    width = layout.width
    offsets = torch.arange(-reach, reach + 1, device=pattern.device)  # [o]
    keys = layout.query.long()[:, None] - offsets[None, :]  # [blk, o]
    valid = ((keys >= 0) & (keys < width)).to(pattern.dtype)  # [blk, o]
    rows, columns = keys.shape
    band = pattern.gather(-1, keys.clamp(0, width - 1).expand(*pattern.shape[:2], rows, columns))  # [b, h, blk, o]
    return (band * valid).sum(-1)


def summary_recent_share(summary: RowSummary, reach: int) -> Tensor:
    """``[b, h, q]``: the same from the fused kernel's band (``summary.band_reach ≥ reach``)."""
    middle = summary.band_reach
    return summary.band[middle - reach : middle + reach + 1].sum(0)


class PositionSums:
    """Per site, running sums ``[M, h, B]`` (float64) of each metric over the real queries of each bucket.

    ``bucket_size`` None: :func:`auto_bucket_size` of ``longest``, or of the first batch's longest
    sequence when ``longest`` is not known in advance.
    """

    def __init__(self, bucket_size: int | None = None, longest: int | None = None) -> None:
        self.bucket_size = check_bucket_size(bucket_size)
        if self.bucket_size is None and longest is not None:
            self.bucket_size = auto_bucket_size(longest)
        # buckets known in advance (every process of a data-parallel run must agree on the shapes)
        self.num_buckets = 0 if longest is None else self._buckets_for(longest)
        self.reach = recent_reach(longest or RECENT_TOKENS)  # for the current batch
        self.sums: dict[AttentionSite, Tensor] = {}  # site -> [M, h, B] float64
        self.counts: dict[AttentionSite, Tensor] = {}  # site -> [B] float64: real queries per bucket

    def begin_batch(self, longest: int) -> None:
        """Announce a batch whose longest sequence (either side) has ``longest`` tokens."""
        if self.bucket_size is None:
            self.bucket_size = auto_bucket_size(longest)
        self.reach = recent_reach(longest)
        self.num_buckets = max(self.num_buckets, self._buckets_for(longest))

    def _buckets_for(self, longest: int) -> int:
        assert self.bucket_size is not None
        buckets = max(1, -(-longest // self.bucket_size))
        if buckets > MAX_BUCKETS:
            raise ParameterError(
                "bucket_size",
                f"{{bucket_size}} {self.bucket_size} would split {longest} tokens into {buckets} buckets; "
                f"at most {MAX_BUCKETS} are kept (memory): use at least {-(-longest // MAX_BUCKETS)}",
                self.bucket_size,
            )
        return buckets

    def add(self, site: AttentionSite, values: Tensor, layout: BlockLayout, recent: Tensor) -> None:
        """Add the real queries of one block: ``values`` ``[S, b, h, q]`` (the accumulator's), ``recent`` ``[b, h, q]``."""
        assert self.bucket_size is not None  # set by begin_batch at the latest
        counted = layout.counted[_COUNTED]  # [b, 1, q] bool
        picked = torch.cat([values[list(_FROM_VALUES)], recent[None]])  # [M, b, h, q]
        per_query = torch.where(counted, picked, 0.0).double().sum(1)  # [M, h, q] (padding rows may hold NaN)
        buckets = torch.div(layout.query.long(), self.bucket_size, rounding_mode="floor")  # [q]
        queries = counted[:, 0].double().sum(0)  # [q] real queries at each position
        sums, counts = self._site(site, per_query.shape[1], per_query.device)
        sums.index_add_(2, buckets, per_query)
        counts.index_add_(0, buckets, queries)

    def _site(self, site: AttentionSite, heads: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """The sums of ``site``, created or widened to the buckets known so far."""
        sums, counts = self.sums.get(site), self.counts.get(site)
        if sums is None or counts is None:
            sums = torch.zeros(len(POSITION_METRICS), heads, self.num_buckets, dtype=torch.float64, device=device)
            counts = torch.zeros(self.num_buckets, dtype=torch.float64, device=device)
        elif counts.shape[0] < self.num_buckets:  # a later batch was longer (batches given in any order)
            extra = self.num_buckets - counts.shape[0]
            sums = torch.nn.functional.pad(sums, (0, extra))
            counts = torch.nn.functional.pad(counts, (0, extra))
        self.sums[site], self.counts[site] = sums, counts
        return sums, counts

    def merge_across(self, parallel: DataParallel, layout: dict[AttentionSite, int]) -> None:
        """Replace the local sums by those over every process (shapes fixed by ``longest`` and ``layout``)."""
        if not parallel.distributed:
            return
        sites = sorted(layout)
        local = []
        for site in sites:
            sums, counts = self._site(site, layout[site], torch.device("cpu"))
            local += [sums, counts]
        merged = parallel.sum(local)
        for number, site in enumerate(sites):
            if merged[2 * number + 1].sum() > 0:
                self.sums[site], self.counts[site] = merged[2 * number], merged[2 * number + 1]
            else:  # no process observed this site (as in one process: absent)
                del self.sums[site], self.counts[site]

    def result(self) -> PositionStatistics:
        """Means per bucket (NaN where a bucket has no query)."""
        size = self.bucket_size or 1
        buckets = max([self.num_buckets, *(counts.shape[0] for counts in self.counts.values())])
        sites, counts = {}, {}
        for site in sorted(self.sums):
            site_sums, site_counts = self._site(site, self.sums[site].shape[1], self.sums[site].device)
            site_counts = torch.nn.functional.pad(site_counts.cpu(), (0, buckets - site_counts.shape[0]))
            site_sums = torch.nn.functional.pad(site_sums.cpu(), (0, buckets - site_sums.shape[2]))
            means = site_sums / site_counts.clamp(min=1)  # [M, h, B]
            sites[site] = means.masked_fill(site_counts == 0, math.nan)
            counts[site] = site_counts
        return PositionStatistics(
            bucket_size=size, bucket_starts=[size * b for b in range(buckets)], sites=sites, counts=counts
        )


@dataclass
class PositionStatistics:
    """The statistics by query position of one model: ``sites[site]`` is ``[M, h, B]`` float64.

    ``M`` follows :data:`POSITION_METRICS`, ``B`` the buckets (bucket ``b`` holds the queries at
    positions ``bucket_starts[b] … bucket_starts[b] + bucket_size − 1``); NaN where a bucket has no query.
    """

    bucket_size: int
    bucket_starts: list[int]
    sites: dict[AttentionSite, Tensor]  # site -> [M, h, B] float64 means
    counts: dict[AttentionSite, Tensor]  # site -> [B] float64 real queries in each bucket (all texts)
    recent_tokens: int = RECENT_TOKENS

    def layers(self, stack: str = "self") -> list[AttentionSite]:
        return sorted(site for site in self.sites if site.stack == stack)

    def curves(self, metric: str, stack: str = "self") -> Tensor:
        """``[layer, head, B]`` float64 values of ``metric``; NaN where a layer has fewer heads or a bucket no query."""
        index = metric_index(metric)
        layers = self.layers(stack)
        heads = max((self.sites[site].shape[1] for site in layers), default=0)
        rows = max((site.layer for site in layers), default=-1) + 1  # the model's layer numbers (hybrid: NaN rows)
        out = torch.full((rows, heads, len(self.bucket_starts)), math.nan, dtype=torch.float64)
        for site in layers:
            values = self.sites[site][index]  # [h, B]
            out[site.layer, : values.shape[0]] = values
        return out

    def layer_means(self, metric: str, stack: str = "self") -> Tensor:
        """``[layer, B]``: the mean over each layer's heads (NaN where a bucket has no query)."""
        return self.curves(metric, stack).nanmean(dim=1)


def metric_index(name: str) -> int:
    """Position of ``name`` in :data:`POSITION_METRICS`; a clear error listing them otherwise."""
    from attnviz.common.errors import InputError

    if name not in POSITION_METRICS:
        raise InputError(f"unknown by-position statistic {name!r}: use one of {', '.join(POSITION_METRICS)}")
    return POSITION_METRICS.index(name)
