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
from attnviz.stats import deferral
from attnviz.stats.by_position import PositionSums, recent_share, summary_recent_share
from attnviz.stats.definitions import STATISTIC_NAMES
from attnviz.stats.geometry import BlockLayout, StackGeometry
from attnviz.stats.kept_rows import SummarisedRows, blocks_side_by_side
from attnviz.stats.row_values import (
    band_reach_needed,
    block_statistics,
    special_mass,
    summary_columns_mass,
    summary_covers,
    summary_statistics,
)


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
        # (sites, their heads, "totals"|"counts") -> [2, S, Σh] | [S]: sums of sites reduced side by side, not yet
        # split per site (see _fold)
        self._grouped = deferral.GroupSums()
        self.num_examples = 0
        self.num_tokens = 0  # real tokens of the first stack (source side)
        self._batch: EncodedBatch | None = None
        self._geometry: dict[tuple, StackGeometry] = {}  # per (stack, device), for the current batch
        self._layouts: dict[tuple, BlockLayout] = {}  # per ((stack, device), query_start, rows, width), current batch
        self._scratch: Tensor | None = None  # reused elementwise temporary (see block_statistics)
        self._pending: SummarisedRows | None = None  # summarised blocks of the site in progress
        self._set_aside: list[SummarisedRows] = []  # finished sites on a GPU, reduced together (see _flush)
        self._set_aside_bytes = 0  # what they hold

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
        self._fold()
        return self._totals

    @property
    def counts(self) -> dict[AttentionSite, Tensor]:
        """site -> ``[S]`` float64: how many queries each statistic counted."""
        self._flush()
        self._fold()
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
        owned: bool = False,
    ) -> None:
        """``pattern`` ``[b, h, blk, c]``, or None when ``summary`` holds key 0 and the special tokens;
        ``sink_share`` ``[b, h, blk]``: each row's weight on its head's attention sink (None: no sinks);
        ``owned``: the summary and sink shares are this observer's to keep (see :meth:`keeps_summary`)."""
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
            if deferral.defers(pending.stack_key[1]):  # reduced with the batch's other sites, at its end
                self._set_aside.append(pending)
                self._set_aside_bytes += pending.nbytes
                self._pending = None
                if self._set_aside_bytes > deferral.DEFERRED_BYTES:
                    self._flush()
            else:
                self._flush()
        reach = self.by_position.reach if self.by_position else 0
        if summary is not None and summary_covers(summary, max(self._window, reach)):
            if self._pending is None:
                self._pending = SummarisedRows(site, stack_key, query_start)
            if owned and pattern is None:  # key 0 and the special tokens are read with the batch's other sites
                self._pending.keep(summary, sink_share)
                return
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

    def keeps_summary(self, device: torch.device) -> bool:
        """Whether it keeps the summaries of calls on ``device`` until the batch ends (:mod:`attnviz.stats.deferral`):
        the core then hands it tensors of its own."""
        return deferral.defers(device)

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
        self._pending, self._set_aside, self._set_aside_bytes = None, [], 0
        groups: dict[tuple, list[SummarisedRows]] = {}
        for rows in waiting:
            kept = rows.whole.values if rows.whole is not None else rows.summaries
            assert kept is not None  # a kept site has at least one block
            columns = rows.whole.columns if rows.whole is not None else None  # None: kept block by block
            shape = (rows.stack_key, rows.query_start, rows.filled, kept.shape[0], bool(rows.sink_share), columns)
            groups.setdefault(shape, []).append(rows)
        for members in groups.values():
            self._reduce(members)

    def _reduce(self, members: list[SummarisedRows]) -> None:
        """Statistics of the kept rows of ``members`` (sites of one shape), added to each site's sums."""
        first_member = members[0]
        if first_member.whole is not None:  # whole calls: key 0 and the special tokens read side by side too
            summary, first, special, sink_share, heads = self._whole_rows(members)
        else:
            summary, first, special, sink_share, heads = blocks_side_by_side(members)
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

    def _whole_rows(
        self, members: list[SummarisedRows]
    ) -> tuple[RowSummary, Tensor, Tensor | None, Tensor | None, list[int]]:
        """(summary ``[F, b, Σh, q]``, first, special, sink share ``[b, Σh, q]``, heads) of whole calls of one shape,
        side by side along the heads."""
        summaries = [rows.whole for rows in members if rows.whole is not None]
        values = summaries[0].values if len(summaries) == 1 else torch.cat([kept.values for kept in summaries], dim=2)
        summary = RowSummary(values, summaries[0].columns)
        first, special = summary_columns_mass(summary, self._geometry[members[0].stack_key])
        shares = [rows.sink_share[0] for rows in members if rows.sink_share]  # all or none: grouped by it
        sink_share = None if not shares else shares[0] if len(shares) == 1 else torch.cat(shares, dim=1)
        return summary, first, special, sink_share, [kept.values.shape[2] for kept in summaries]

    def _add(self, site: AttentionSite, values: Tensor, layout: BlockLayout) -> None:
        """Add per-query ``values`` ``[S, b, h, q]`` of the queries ``layout`` counts to ``site``'s sums."""
        self._add_sites([site], [values.shape[2]], values, layout)

    def _add_sites(self, sites: list[AttentionSite], heads: list[int], values: Tensor, layout: BlockLayout) -> None:
        """:meth:`_add` for ``values`` ``[S, b, Σh, q]`` of several sites side by side (``heads`` of each)."""
        # float64 sums: the variance is E[x²] − E[x]², which float32 would round away
        values = torch.where(layout.counted, values, 0.0).double()  # padding rows may hold anything, even NaN
        sums = values.sum(dim=(1, 3))  # [S, Σh]
        all_totals = torch.stack((sums, values.square_().sum(dim=(1, 3))))  # [2, S, Σh]
        # summed per group of sites, as they came, and split per site only when read (_fold): two operations per
        # batch for the group, not two per site
        self._grouped.add((tuple(sites), tuple(heads), "totals"), all_totals)
        self._grouped.add((tuple(sites), tuple(heads), "counts"), layout.counts.clone())

    def _fold(self) -> None:
        """Move the groups' sums into the per-site sums, on the host."""
        for (sites, heads, kind), sums in self._grouped.take_to_host():
            parts = sums.split(list(heads), dim=-1) if kind == "totals" else [sums] * len(sites)  # [2, S, h] | [S]
            held = self._totals if kind == "totals" else self._counts
            for site, part in zip(sites, parts):
                if site in held:
                    held[site] += part
                else:
                    held[site] = part.clone()

    def merge_across(self, parallel: DataParallel, layout: Mapping[AttentionSite, int]) -> None:
        """Replace the local sums by the sums over every process of a data-parallel run (float64).

        ``layout`` (site -> heads, the same on every process) fixes what is exchanged, so a process
        that saw no batch still takes part; sites no process observed stay absent, as in one process.
        """
        if not parallel.distributed:
            return
        self._flush()
        self._fold()
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
