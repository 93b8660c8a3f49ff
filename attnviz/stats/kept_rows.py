"""The rows of a site's attention calls that the statistics keep until the site, or the batch, is done.

:class:`SummarisedRows` holds one site's kernel summaries (``[4 + 2·r (+ G), b, h, q]``);
:func:`blocks_side_by_side` puts several sites' rows side by side along the heads, so that one reduction serves them
all (see :meth:`attnviz.stats.accumulator.StatisticsAccumulator._flush`). :class:`KeptCalls` holds what the
carriers (:mod:`attnviz.stats.carriers`) keep of each call on a GPU, grouped by shape.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnviz.core import AttentionSite
from attnviz.core.kernel_calls import RowSummary


class SummarisedRows:
    """One site's blocks that came with a kernel summary, kept until the site's last block.

    Reducing a whole layer at once takes a handful of operations where a block at a time takes
    them for every block (about twenty blocks per layer at 2048 tokens): per block, only the
    summary and two columns are copied. Memory: ``[4 + 2·r + 2, b, h, q]`` float32 per site.
    A call summarised whole into tensors the core handed over (``owned``) is kept as it came, with
    no copy: its ``whole`` summary, columns included.
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
        self.whole: RowSummary | None = None  # [4 + 2·r + G, b, h, q]: an owned summary of every query

    @property
    def nbytes(self) -> int:
        """The memory the kept rows take."""
        whole = self.whole.values if self.whole is not None else None
        kept = [self.summaries, whole, *self.first, *self.special, *self.sink_share]
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

    def keep(self, summary: RowSummary, sink_share: Tensor | None) -> None:
        """Keep a summary of every query of the call (and its sink shares), tensors of this observer's own."""
        if self.whole is not None or self.summaries is not None:
            raise RuntimeError("a whole call's summary continues no other block")  # a bug, not input
        self.whole = summary
        self.filled = summary.values.shape[-1]
        if sink_share is not None:
            self.sink_share.append(sink_share)
        self.next_start += self.filled

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


def blocks_side_by_side(
    members: list[SummarisedRows],
) -> tuple[RowSummary, Tensor, Tensor | None, Tensor | None, list[int]]:
    """(summary ``[F, b, Σh, q]``, first, special, sink share ``[b, Σh, q]``, heads) of sites kept block by block,
    side by side along the heads."""
    parts = [rows.rows() for rows in members]  # (summary [F, b, h, q], first, special, sink share [b, h, q])
    heads = [first.shape[1] for _, first, _, _ in parts]
    if len(parts) == 1:
        summary, first, special, sink_share = parts[0]
        return summary, first, special, sink_share, heads
    summary = RowSummary(torch.cat([part[0].values for part in parts], dim=2))
    first = torch.cat([part[1] for part in parts], dim=1)
    special = None
    if any(part[2] is not None for part in parts):
        special = torch.cat([torch.zeros_like(f) if m is None else m for _, f, m, _ in parts], dim=1)
    shares = [part[3] for part in parts if part[3] is not None]  # all or none: sites are grouped by it
    return summary, first, special, torch.cat(shares, dim=1) if shares else None, heads


class KeptCalls:
    """The value norms ``[b, h, k]`` and summarised rows of the calls a batch has made so far, by shape.

    Tensors of the observer's own (the core handed them over, see ``keeps_summary``): nothing is copied.
    :meth:`take` gives them grouped so that sites of one stack and shape are reduced side by side.
    """

    def __init__(self) -> None:
        self._norms: dict[tuple, list[tuple[AttentionSite, Tensor]]] = {}
        # (stack, query start, shape) -> [(site, summary, weighted [b, h, q], norms [b, h, k])]
        self._rows: dict[tuple, list[tuple[AttentionSite, RowSummary, Tensor, Tensor]]] = {}
        self.nbytes = 0

    def add_norms(self, site: AttentionSite, norms: Tensor) -> None:
        """Keep one call's norms ``[b, h, k]``."""
        key = (site.stack, norms.device, norms.shape[0], norms.shape[2])
        self._norms.setdefault(key, []).append((site, norms))
        self.nbytes += norms.numel() * norms.element_size()

    def add_rows(
        self, site: AttentionSite, query_start: int, summary: RowSummary, weighted: Tensor, norms: Tensor
    ) -> None:
        """Keep one call's summary (its key-0 column is read), weighted sums ``[b, h, q]`` and norms."""
        key = (site.stack, query_start, weighted.device, weighted.shape[0], weighted.shape[2], norms.shape[2])
        self._rows.setdefault(key, []).append((site, summary, weighted, norms))
        self.nbytes += weighted.numel() * weighted.element_size()

    def take(
        self,
    ) -> tuple[
        list[list[tuple[AttentionSite, Tensor]]],
        list[tuple[int, list[tuple[AttentionSite, RowSummary, Tensor, Tensor]]]],
    ]:
        """(groups of norms, (query start, group of rows) pairs), and nothing kept after."""
        norms = list(self._norms.values())
        rows = [(key[1], group) for key, group in self._rows.items()]
        self._norms, self._rows, self.nbytes = {}, {}, 0
        return norms, rows
