"""Streaming per-head statistics: an observer that reduces each block of a pattern as it is computed.

The attention core hands :class:`StatisticsAccumulator` every block of every
layer's pattern while the model runs (``[b, h, blk, c]``: ``blk`` query rows,
the first ``c`` keys). :func:`block_statistics` turns the block into per-query
statistics ``[S, b, h, blk]`` with a handful of vectorised passes, and the
accumulator adds those of the queries that count into per-head running sums
(and sums of squares, for the standard deviations). Nothing of the pattern is kept, so memory stays at one block however long
the corpus or the input.

Which queries and keys count:

* padding is excluded as queries (their rows get weight 0) and as keys (the
  model's mask already gives them weight exactly 0, and the per-example lengths
  bound every distance and count), so a sentence's statistics do not depend on
  the batch it is padded into;
* in a causal stack query ``i`` may see keys ``0 … i``: that is the count the
  normalised entropy divides by, and keys ``> i`` are not even read.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from attnviz.common.parallel import DataParallel
from attnviz.common.resources import clamp
from attnviz.core import AttentionSite
from attnviz.core.kernel_calls import RowSummary
from attnviz.core.stacks import is_causal_stack
from attnviz.models.base import EncodedBatch
from attnviz.stats.by_position import PositionSums, recent_share, summary_recent_share
from attnviz.stats.definitions import STATISTIC_NAMES
from attnviz.stats.geometry import BlockLayout, StackGeometry
from attnviz.stats.row_values import (
    band_reach_needed,
    block_statistics,
    special_mass,
    summary_columns_mass,
    summary_covers,
    summary_statistics,
)

#: devices on which the sites of a batch are reduced together at its end rather than one by one (see ``_flush``);
#: on the CPU each site is reduced as soon as it is done, which keeps one site's summaries in memory, not a batch's
DEFERRED_DEVICES: tuple[str, ...] = ("cuda",)
#: the most the sites set aside may hold (bytes): past it they are reduced at once. Setting aside pays where a layer
#: is short (the host launching operations is the cost); a long input's layer dwarfs its reduction anyway
DEFERRED_BYTES = 256 * 2**20


class _SummarisedRows:
    """One site's blocks that came with a kernel summary, kept until the site's last block.

    Reducing a whole layer at once takes a handful of operations where a block at a time takes
    them for every block (about twenty blocks per layer at 2048 tokens): per block, only the
    summary and two columns are copied. Memory: ``[4 + 2·r + 2, b, h, q]`` float32 per site.
    """

    def __init__(self, site: AttentionSite, stack_key: tuple, query_start: int) -> None:
        self.site, self.stack_key, self.query_start = site, stack_key, query_start
        self.next_start = query_start  # the first query of the block that would continue these
        # [4 + 2·r, b, h, capacity], filled up to `filled`: one buffer grown by doubling, not a copy per block
        # (hundreds of small copies per layer at 8k tokens leave the C heap fragmented: +0.3 GB resident)
        self.summaries: Tensor | None = None
        self.filled = 0
        self.first: list[Tensor] = []  # each [b, h, blk]
        self.special: list[Tensor | None] = []  # each [b, h, blk]; None: no special token in reach
        self.sink_share: list[Tensor] = []  # each [b, h, blk]; empty: the site has no attention sinks

    @property
    def nbytes(self) -> int:
        """The memory the kept rows take."""
        kept = [self.summaries, *self.first, *self.special, *self.sink_share]
        return sum(tensor.numel() * tensor.element_size() for tensor in kept if tensor is not None)

    def add(self, summary: RowSummary, first: Tensor, special: Tensor | None, sink_share: Tensor | None) -> None:
        values = summary.fields  # [4 + 2·r, b, h, blk]; the core reuses this buffer for the next block
        end = self.filled + values.shape[-1]
        if self.summaries is None or end > self.summaries.shape[-1]:
            grown = values.new_empty(*values.shape[:-1], max(end, 2 * self.filled))
            if self.summaries is not None:
                grown[..., : self.filled] = self.summaries[..., : self.filled]
            self.summaries = grown
        self.summaries[..., self.filled : end] = values
        self.filled = end
        self.first.append(first.clone())
        self.special.append(special)
        if sink_share is not None:  # the core reuses this buffer too
            self.sink_share.append(sink_share.clone())
        self.next_start += summary.values.shape[-1]

    def rows(self) -> tuple[RowSummary, Tensor, Tensor | None, Tensor | None]:
        """(summary, first, special, sink share) of every query kept, ``[…, q]``; special is None if 0 throughout,
        sink share None without sinks."""
        special = None
        if any(mass is not None for mass in self.special):
            special = torch.cat(
                [torch.zeros_like(first) if mass is None else mass for mass, first in zip(self.special, self.first)], -1
            )
        assert self.summaries is not None  # a pending site has at least one block
        sink_share = torch.cat(self.sink_share, dim=-1) if self.sink_share else None
        return RowSummary(self.summaries[..., : self.filled]), torch.cat(self.first, dim=-1), special, sink_share


class StatisticsAccumulator:
    """An attention observer that keeps per-head running sums of every statistic.

    Call :meth:`begin_batch` before each forward pass (it needs the lengths and special
    tokens of the batch); then :meth:`HeadStatistics.from_accumulator
    <attnviz.stats.result.HeadStatistics.from_accumulator>` turns the sums into means.
    """

    #: reads each block only during ``observe`` and accepts the keys that can carry weight
    #: (see :class:`attnviz.core.AttentionObserver`): causal blocks arrive without their future.
    accepts_key_prefix = True
    #: takes the softmax input as well, to compute the entropy without a logarithm pass
    accepts_scores = True
    #: takes the fused kernel's row summary: max weight, entropy, distance and the weights near the
    #: diagonal (diagonal, previous, local window) without a pass or a gather of their own
    accepts_summary = True
    #: with a summary that holds the weights on key 0 and the special tokens (``summary_columns``), it needs no
    #: pattern at all: the core may then run attention tile by tile without ever writing one (``pattern=None``)
    accepts_summary_only = True
    #: takes each row's weight on its head's attention sink, where the model has sinks (``sink_share``)
    accepts_sink_share = True

    def __init__(self, *, causal: bool, local_window: int = 2, by_position: PositionSums | None = None):
        self.causal = causal  # the model is decoder-only causal (its "self" stack is causal)
        self.by_position = by_position  # sums by query position (attnviz.stats.by_position), if asked for
        self.local_window = local_window  # w of local_ratio, as asked
        self._window = local_window  # w used on the current batch: at most its longest sequence − 1 (the same sums)
        self._totals: dict[AttentionSite, Tensor] = {}  # site -> [2, S, h] float64: Σ value, Σ value² (counted queries)
        self._counts: dict[AttentionSite, Tensor] = {}  # site -> [S] float64: queries counted
        self.num_examples = 0
        self.num_tokens = 0  # real tokens of the first stack (source side)
        self._batch: EncodedBatch | None = None
        self._geometry: dict[tuple, StackGeometry] = {}  # per (stack, device), for the current batch
        self._layouts: dict[tuple, BlockLayout] = {}  # per ((stack, device), query_start, rows, width), current batch
        self._scratch: Tensor | None = None  # reused elementwise temporary (see block_statistics)
        self._pending: _SummarisedRows | None = None  # summarised blocks of the site in progress
        self._set_aside: list[_SummarisedRows] = []  # finished sites on a GPU, reduced together (see _flush)

    @property
    def summary_band_reach(self) -> int:
        """How far either side of the diagonal the kernel's summary should read weights (the core asks for it)."""
        # by position: the band also holds recent_share's keys (|i − j| ≤ 15), so it needs no gather
        return max(band_reach_needed(self._window), self.by_position.reach if self.by_position else 0)

    def summary_columns(self, site: AttentionSite) -> list[int]:
        """Key positions whose weights the statistics read: key 0 and every special token of the batch."""
        if self._batch is None:
            return [0]
        geometry = self._geometry_of(site, (site.stack, torch.device("cpu")), torch.device("cpu"))
        return [0, *geometry.special_columns]

    @property
    def totals(self) -> dict[AttentionSite, Tensor]:
        """site -> ``[2, S, h]`` float64: sum and sum of squares of each statistic over the counted queries."""
        self._flush()
        return self._totals

    @property
    def counts(self) -> dict[AttentionSite, Tensor]:
        """site -> ``[S]`` float64: how many queries each statistic counted."""
        self._flush()
        return self._counts

    def begin_batch(self, batch: EncodedBatch) -> None:
        """Announce the batch whose patterns come next."""
        self._flush()  # with the previous batch's geometry
        self._batch = batch
        self._geometry = {}
        self._layouts = {}
        self.num_examples += len(batch)
        self.num_tokens += sum(batch.lengths)
        # A window reaching past the longest sequence covers every key: the statistic is the same with the
        # window cut to the sequence, and the band (2w + 1 columns) stays as small as the input.
        longest = max([*batch.lengths, *(batch.target_lengths or [])], default=1)
        self._window = clamp(self.local_window, max(longest - 1, 0))
        if self.by_position is not None:
            self.by_position.begin_batch(longest)

    def observe(
        self,
        site: AttentionSite | None,
        pattern: Tensor | None,
        query_start: int,
        scores: Tensor | None = None,
        summary: RowSummary | None = None,
        sink_share: Tensor | None = None,
    ) -> None:
        """``pattern`` ``[b, h, blk, c]``, or None when ``summary`` holds key 0 and the special tokens;
        ``sink_share`` ``[b, h, blk]``: each row's weight on its head's attention sink (None: no sinks)."""
        if site is None:
            return
        if self._batch is None:
            raise RuntimeError("StatisticsAccumulator.begin_batch(batch) must be called before the forward pass")
        # Keyed by device too: with a device map (--device-map auto) layers run on different GPUs.
        device = pattern.device if pattern is not None else summary.values.device if summary is not None else None
        if device is None:
            raise ValueError("an observation needs a pattern or a summary")
        stack_key = (site.stack, device)
        geometry = self._geometry_of(site, stack_key, device)
        pending = self._pending
        if pending is not None and (pending.site != site or pending.next_start != query_start):
            if pending.stack_key[1].type in DEFERRED_DEVICES:  # reduced with the batch's other sites, at its end
                self._set_aside.append(pending)
                self._pending = None
                if sum(rows.nbytes for rows in self._set_aside) > DEFERRED_BYTES:
                    self._flush()
            else:
                self._flush()
        reach = self.by_position.reach if self.by_position else 0
        if summary is not None and summary_covers(summary, max(self._window, reach)):
            if self._pending is None:
                self._pending = _SummarisedRows(site, stack_key, query_start)
            if pattern is None:
                first, special = summary_columns_mass(summary, geometry)
            else:
                first, special = pattern[..., 0], special_mass(pattern, geometry)
            self._pending.add(summary, first, special, sink_share)
            return
        if pattern is None:
            raise ValueError("a summary without the band or columns the statistics need, and no pattern")
        key = (stack_key, query_start, pattern.shape[2], pattern.shape[3])
        layout = self._layouts.get(key)
        if layout is None:
            layout = BlockLayout.build(geometry, query_start, pattern.shape[2], pattern.shape[3], self._window)
            self._layouts[key] = layout
        if self._scratch is None or self._scratch.numel() < pattern.numel() or self._scratch.device != pattern.device:
            self._scratch = torch.empty(pattern.numel(), dtype=torch.float32, device=pattern.device)
        values = block_statistics(
            pattern, layout, geometry, self._scratch, scores, summary, sink_share
        )  # [S, b, h, blk]
        self._add(site, values, layout)
        if self.by_position is not None:
            self.by_position.add(site, values, layout, recent_share(pattern, layout, self.by_position.reach))

    def _geometry_of(self, site: AttentionSite, stack_key: tuple, device: torch.device) -> StackGeometry:
        geometry = self._geometry.get(stack_key)
        if geometry is None:
            causal = is_causal_stack(site.stack, self.causal)
            assert self._batch is not None  # set by begin_batch before the forward pass
            geometry = StackGeometry.from_batch(self._batch, site.stack, causal, device)
            self._geometry[stack_key] = geometry
        return geometry

    def _flush(self) -> None:
        """Reduce the summarised blocks kept: the site in progress, and the sites set aside on a GPU.

        Sites of one shape (stack, queries, summary fields) are reduced as one: their summaries side by side along
        the heads, so that a GPU pass launches one reduction per batch, not one per layer (on a GPU a short input's
        pass is bound by the host launching operations, layer after layer)."""
        waiting = self._set_aside + ([self._pending] if self._pending is not None else [])
        self._pending, self._set_aside = None, []
        groups: dict[tuple, list[_SummarisedRows]] = {}
        for rows in waiting:
            assert rows.summaries is not None  # a kept site has at least one block
            shape = (rows.stack_key, rows.query_start, rows.filled, rows.summaries.shape[0], bool(rows.sink_share))
            groups.setdefault(shape, []).append(rows)
        for members in groups.values():
            self._reduce(members)

    def _reduce(self, members: list[_SummarisedRows]) -> None:
        """Statistics of the kept rows of ``members`` (sites of one shape), added to each site's sums."""
        parts = [rows.rows() for rows in members]  # (summary [F, b, h, q], first, special, sink share [b, h, q])
        first_member = members[0]
        heads = [first.shape[1] for _, first, _, _ in parts]
        if len(parts) == 1:
            summary, first, special, sink_share = parts[0]
        else:  # side by side along the heads: [F, b, Σh, q], then [b, Σh, q] each
            summary = RowSummary(torch.cat([part[0].values for part in parts], dim=2))
            first = torch.cat([part[1] for part in parts], dim=1)
            special = None
            if any(part[2] is not None for part in parts):
                special = torch.cat([torch.zeros_like(f) if m is None else m for _, f, m, _ in parts], dim=1)
            shares = [part[3] for part in parts if part[3] is not None]  # all or none: sites are grouped by it
            sink_share = torch.cat(shares, dim=1) if shares else None
        key = (first_member.stack_key, first_member.query_start, "rows", first.shape[-1])
        layout = self._layouts.get(key)
        if layout is None:
            geometry = self._geometry[first_member.stack_key]
            layout = BlockLayout.rows(geometry, first_member.query_start, first.shape[-1], self._window)
            self._layouts[key] = layout
        values = summary_statistics(summary, first, special, layout, sink_share)  # [S, b, Σh, q]
        self._add_sites([rows.site for rows in members], heads, values, layout)
        if self.by_position is not None:  # the kernel's band reaches by_position.reach (summary_band_reach)
            recent = summary_recent_share(summary, self.by_position.reach)  # [b, Σh, q]
            start = 0
            for rows, count in zip(members, heads):
                picked = slice(start, start + count)
                self.by_position.add(rows.site, values[:, :, picked], layout, recent[:, picked])
                start += count

    def _add(self, site: AttentionSite, values: Tensor, layout: BlockLayout) -> None:
        """Add per-query ``values`` ``[S, b, h, q]`` of the queries ``layout`` counts to ``site``'s sums."""
        self._add_sites([site], [values.shape[2]], values, layout)

    def _add_sites(self, sites: list[AttentionSite], heads: list[int], values: Tensor, layout: BlockLayout) -> None:
        """:meth:`_add` for ``values`` ``[S, b, Σh, q]`` of several sites side by side (``heads`` of each)."""
        # float64 sums: the variance is E[x²] − E[x]², which float32 would round away
        values = torch.where(layout.counted, values, 0.0).double()  # padding rows may hold anything, even NaN
        sums = values.sum(dim=(1, 3))  # [S, Σh]
        all_totals = torch.stack((sums, values.square_().sum(dim=(1, 3))))  # [2, S, Σh]
        for site, totals in zip(sites, all_totals.split(heads, dim=-1)):  # [2, S, h] each
            if site in self._totals:
                self._totals[site] += totals
                self._counts[site] += layout.counts
            else:
                self._totals[site], self._counts[site] = totals.clone(), layout.counts.clone()

    def merge_across(self, parallel: DataParallel, layout: Mapping[AttentionSite, int]) -> None:
        """Replace the local sums by the sums over every process of a data-parallel run (float64).

        ``layout`` (site -> heads, the same on every process) fixes what is exchanged, so a process
        that saw no batch still takes part; sites no process observed stay absent, as in one process.
        """
        if not parallel.distributed:
            return
        self._flush()
        sites = sorted(layout)
        statistics = len(STATISTIC_NAMES)
        local = []
        for site in sites:
            local.append(self._totals.get(site, torch.zeros(2, statistics, layout[site], dtype=torch.float64)))
            local.append(self._counts.get(site, torch.zeros(statistics, dtype=torch.float64)))
        seen = torch.tensor([float(site in self._totals) for site in sites], dtype=torch.float64)  # [sites]
        examples_tokens = torch.tensor([self.num_examples, self.num_tokens], dtype=torch.float64)  # [2]
        *merged, seen, examples_tokens = parallel.sum([*local, seen, examples_tokens])
        self._totals, self._counts = {}, {}
        for number, site in enumerate(sites):
            if seen[number] > 0:
                self._totals[site], self._counts[site] = merged[2 * number], merged[2 * number + 1]
        self.num_examples, self.num_tokens = (int(value) for value in examples_tokens.tolist())
        if self.by_position is not None:
            self.by_position.merge_across(parallel, dict(layout))

    @property
    def sums(self) -> dict[AttentionSite, Tensor]:
        """site -> ``[S, h]`` float64 sum of each statistic over the counted queries."""
        return {site: totals[0] for site, totals in self.totals.items()}

    @property
    def squares(self) -> dict[AttentionSite, Tensor]:
        """site -> ``[S, h]`` float64 sum of squares of each statistic over the counted queries."""
        return {site: totals[1] for site, totals in self.totals.items()}
