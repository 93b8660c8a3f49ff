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

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from attnviz.core import AttentionSite
from attnviz.core.kernel import RowSummary
from attnviz.core.stacks import stack_of
from attnviz.models.base import EncodedBatch
from attnviz.parallel import DataParallel
from attnviz.stats.definitions import STATISTIC_INDEX, STATISTIC_NAMES


def stack_is_causal(stack: str, causal_model: bool) -> bool:
    """Decoder self-attention is causal; so is ``self`` attention of a causal (decoder-only) model."""
    return stack_of(stack).is_causal(causal_model)


@dataclass
class StackGeometry:
    """What :func:`block_statistics` needs to know about one batch on one attention stack."""

    query_lengths: Tensor  # [b] long: real (non-padding) queries per example
    key_lengths: Tensor  # [b] long: real keys per example
    key_positions: Tensor  # [b, k, 1] float32: position j of each key (0 at padding, which has no weight)
    special_columns: list[int]  # sorted key positions that hold a special token in at least one example
    special_weights: Tensor  # [b, 1, 1, u] float32: 1 where special_columns[u] is special in that example
    causal: bool  # query i sees keys 0…i only

    @classmethod
    def from_batch(cls, batch: EncodedBatch, stack: str, causal: bool, device: torch.device) -> StackGeometry:
        query_lengths, key_lengths = batch.query_key_lengths(stack)
        _, key_special = batch.query_key_special(stack)
        width = max(key_lengths)
        positions = torch.arange(width, dtype=torch.float32)[None, :] * batch.key_padding_mask(stack)  # [b, k]
        # Special tokens are few ([CLS], [SEP], BOS, EOS): their mass is a sum over a handful of
        # gathered columns, not a pass over the whole pattern.
        columns = sorted({j for flags in key_special for j, special in enumerate(flags) if special})
        weights = torch.tensor([[float(j < len(flags) and flags[j]) for j in columns] for flags in key_special])
        return cls(
            query_lengths=torch.tensor(query_lengths, device=device),
            key_lengths=torch.tensor(key_lengths, device=device),
            key_positions=positions[:, :, None].to(device),
            special_columns=columns,
            special_weights=weights.view(len(key_special), 1, 1, len(columns)).to(device),
            causal=causal,
        )


@dataclass
class BlockLayout:
    """Everything about one block of queries that is the same in every layer (computed once per batch).

    Transformers runs each layer on the same batch with the same blocks, so positions,
    counts, weights and gather indices are built on the first layer and reused by the rest.
    """

    width: int  # keys that can carry weight: c
    query: Tensor  # [blk] float32 positions i
    log_visible: Tensor  # [b, 1, blk] ln(keys query i may see), at least ln 2
    reach: Tensor  # [b, 1, blk] the largest distance query i can reach, at least 1
    distances: Tensor | None  # [blk, c] |i − j| (bidirectional stacks; causal ones need none)
    band_columns: Tensor  # [blk, o] long: key i − offset for offsets −w…w then 1 (clamped into range)
    band_valid: Tensor  # [blk, o] float32: 1 where that key exists
    local_window: int  # w
    counted: Tensor  # [S, b, 1, blk] bool: the query counts for that statistic
    counts: Tensor  # [S] float64: queries counted

    @classmethod
    def build(cls, geometry: StackGeometry, query_start: int, rows: int, width: int, local_window: int):
        device = geometry.key_lengths.device
        batch = geometry.key_lengths.shape[0]
        query = torch.arange(query_start, query_start + rows, device=device)  # [blk] positions i
        if geometry.causal:
            width = min(width, query_start + rows)  # keys after the block's last query have weight 0
        width = min(width, geometry.key_positions.shape[1])  # columns past the longest example are padding
        query_lengths = geometry.query_lengths[:, None]  # [b, 1]
        key_lengths = geometry.key_lengths[:, None]  # [b, 1]
        real_query = query[None, :] < query_lengths  # [b, blk]
        if geometry.causal:
            visible_keys = torch.minimum(query[None, :] + 1, key_lengths)  # [b, blk]
            reach = query[None, :].expand(batch, rows)  # [b, blk] the farthest key is position 0
            distances = None
        else:
            visible_keys = key_lengths.expand(batch, rows)  # [b, blk]
            reach = torch.maximum(query[None, :], (key_lengths - 1 - query[None, :]).abs())  # [b, blk]
            distances = (query[:, None] - torch.arange(width, device=device)[None, :]).abs().float()  # [blk, c]

        offsets = list(range(-local_window, local_window + 1)) + ([] if local_window >= 1 else [1])
        keys = query[:, None] - torch.tensor(offsets, device=device)[None, :]  # [blk, o]
        band_valid = ((keys >= 0) & (keys < width)).float()  # [blk, o]

        counted = real_query.expand(len(STATISTIC_NAMES), batch, rows).clone()  # [S, b, blk]
        counted[STATISTIC_INDEX["normalized_entropy"]] &= visible_keys >= 2
        counted[STATISTIC_INDEX["normalized_distance"]] &= reach >= 1
        counted[STATISTIC_INDEX["previous_token"]] &= (query[None, :] >= 1) & (query[None, :] - 1 < key_lengths)
        return cls(
            width=width,
            query=query.float(),
            log_visible=torch.log(visible_keys.clamp(min=2).float())[:, None, :],
            reach=reach.clamp(min=1).float()[:, None, :],
            distances=distances,
            band_columns=keys.clamp(0, width - 1),
            band_valid=band_valid,
            local_window=local_window,
            counted=counted[:, :, None, :],
            counts=counted.sum(dim=(1, 2)).double(),
        )


def block_statistics(
    pattern: Tensor,
    layout: BlockLayout,
    geometry: StackGeometry,
    scratch: Tensor | None = None,
    scores: Tensor | None = None,
    summary: RowSummary | None = None,
) -> Tensor:
    """Per-query statistics of one block of patterns.

    Args:
        pattern: float32 ``[b, h, blk, k']``: rows are the block's queries, columns the first
            ``k' ≥ layout.width`` keys (any later key has weight 0).
        layout: the block's positions and which queries count (:meth:`BlockLayout.build`).
        geometry: lengths, key positions and special tokens of the batch on this stack.
        scratch: optional float32 buffer of at least ``b·h·blk·c`` elements for the one
            elementwise temporary (reusing it avoids writing fresh memory every block).
        scores: optional float32 ``[b, h, blk, k']``, the softmax input ``pattern`` came from;
            with it the entropy needs no logarithm over the block.
        summary: optional per-row max weight, entropy and distance from the core's fused kernel
            (:class:`~attnviz.core.kernel.RowSummary`); with it none of the three needs a pass.

    Returns:
        ``[S, b, h, blk]`` float32 in :data:`STATISTIC_NAMES` order; meaningful where
        ``layout.counted`` is true.
    """
    pattern = pattern[..., : layout.width]  # [b, h, blk, c]
    batch, heads, rows, width = pattern.shape

    if summary is not None:
        max_weight, entropy, distance = summary.max_weight, summary.entropy, summary.distance  # each [b, h, blk]
    else:
        temporary = torch.empty_like(pattern) if scratch is None else scratch[: pattern.numel()].view(pattern.shape)
        max_weight = pattern.amax(-1)  # [b, h, blk]
        if scores is not None:
            # A = softmax(s), so ln Aᵢⱼ = sᵢⱼ − lseᵢ and the entropy is lseᵢ − Σⱼ Aᵢⱼ sᵢⱼ, where
            # lseᵢ = maxⱼ sᵢⱼ − ln maxⱼ Aᵢⱼ (the largest score gives the largest weight). Two cheap
            # passes instead of a logarithm over the block, the costliest step of the statistics.
            scores = scores[..., :width]  # [b, h, blk, c]
            weighted = torch.mul(pattern, scores, out=temporary).sum(-1)  # [b, h, blk]
            if weighted.isnan().any():  # a −inf mask: 0·(−inf) = NaN, where the term is 0 (rare: redo)
                weighted = torch.mul(pattern, scores, out=temporary).nan_to_num_(nan=0.0).sum(-1)
            entropy = (scores.amax(-1) - max_weight.log()) - weighted  # [b, h, blk] nats
            entropy.clamp_(min=0.0)  # rounding can give −1e-7 for a one-hot row
        else:
            # −Σ A log A with A log A = 0 at A = 0 (log of A + tiny), via log2, the fastest log.
            log_pattern = torch.add(pattern, torch.finfo(torch.float32).tiny, out=temporary).log2_()  # [b, h, blk, c]
            entropy = log_pattern.mul_(pattern).sum(-1).mul_(-math.log(2))  # [b, h, blk] nats
        if layout.distances is None:
            # causal: every visible j ≤ i, so Σ Aᵢⱼ |i − j| = i·Σ Aᵢⱼ − Σ Aᵢⱼ·j, as one matrix-vector product
            mass = pattern.sum(-1)  # [b, h, blk] (1 up to rounding)
            flat = pattern.reshape(batch, heads * rows, width)  # [b, h·blk, c] (a view: rows stay contiguous)
            position_sum = torch.matmul(flat, geometry.key_positions[:, :width]).view(batch, heads, rows)  # [b, h, blk]
            distance = layout.query * mass - position_sum  # [b, h, blk]
        else:
            distance = torch.mul(pattern, layout.distances, out=temporary).sum(-1)  # [b, h, blk]

    # Special tokens are few ([CLS], [SEP], BOS, EOS): gather their columns instead of a pass.
    columns = geometry.special_columns[: bisect.bisect_left(geometry.special_columns, width)]
    if columns:
        special_mass = (pattern[..., columns] * geometry.special_weights[..., : len(columns)]).sum(-1)  # [b, h, blk]
    else:
        special_mass = pattern.new_zeros(batch, heads, rows)

    # Weights on keys i − offset (offsets −w…w, then 1): one gather for diagonal, previous and local.
    band = pattern.gather(-1, layout.band_columns.expand(batch, heads, rows, -1)) * layout.band_valid  # [b, h, blk, o]
    w = layout.local_window
    previous = band[..., w + 1] if w >= 1 else band[..., -1]

    return torch.stack(
        [
            entropy,
            entropy / layout.log_visible,
            max_weight,
            distance,
            distance / layout.reach,
            band[..., w],  # diagonal: offset 0
            previous,
            band[..., : 2 * w + 1].sum(-1),  # local: |i − j| ≤ w
            pattern[..., 0],
            special_mass,
        ]
    )  # [S, b, h, blk]


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
    #: takes the fused kernel's row summary: max weight, entropy and distance without a pass of their own
    accepts_summary = True

    def __init__(self, *, causal: bool, local_window: int = 2):
        self.causal = causal  # the model is decoder-only causal (its "self" stack is causal)
        self.local_window = local_window  # w of local_ratio
        self.totals: dict[
            AttentionSite, Tensor
        ] = {}  # site -> [2, S, h] float64: Σ value, Σ value² over counted queries
        self.counts: dict[AttentionSite, Tensor] = {}  # site -> [S] float64: queries counted
        self.num_examples = 0
        self.num_tokens = 0  # real tokens of the first stack (source side)
        self._batch: EncodedBatch | None = None
        self._geometry: dict[tuple, StackGeometry] = {}  # per (stack, device), for the current batch
        self._layouts: dict[tuple, BlockLayout] = {}  # per ((stack, device), query_start, rows, width), current batch
        self._scratch: Tensor | None = None  # reused elementwise temporary (see block_statistics)

    def begin_batch(self, batch: EncodedBatch) -> None:
        """Announce the batch whose patterns come next."""
        self._batch = batch
        self._geometry = {}
        self._layouts = {}
        self.num_examples += len(batch)
        self.num_tokens += sum(batch.lengths)

    def observe(
        self,
        site: AttentionSite | None,
        pattern: Tensor,
        query_start: int,
        scores: Tensor | None = None,
        summary: RowSummary | None = None,
    ) -> None:
        if site is None:
            return
        if self._batch is None:
            raise RuntimeError("StatisticsAccumulator.begin_batch(batch) must be called before the forward pass")
        # Keyed by device too: with a device map (--device-map auto) layers run on different GPUs.
        stack_key = (site.stack, pattern.device)
        key = (stack_key, query_start, pattern.shape[2], pattern.shape[3])
        layout = self._layouts.get(key)
        if layout is None:
            geometry = self._geometry.get(stack_key)
            if geometry is None:
                causal = stack_is_causal(site.stack, self.causal)
                geometry = StackGeometry.from_batch(self._batch, site.stack, causal, pattern.device)
                self._geometry[stack_key] = geometry
            layout = BlockLayout.build(geometry, query_start, pattern.shape[2], pattern.shape[3], self.local_window)
            self._layouts[key] = layout
        if self._scratch is None or self._scratch.numel() < pattern.numel() or self._scratch.device != pattern.device:
            self._scratch = torch.empty(pattern.numel(), dtype=torch.float32, device=pattern.device)
        values = block_statistics(
            pattern, layout, self._geometry[stack_key], self._scratch, scores, summary
        )  # [S, b, h, blk]
        # float64 sums: the variance is E[x²] − E[x]², which float32 would round away
        values = torch.where(layout.counted, values, 0.0).double()  # padding rows may hold anything, even NaN
        totals = torch.stack((values, values * values)).sum(dim=(2, 4))  # [2, S, h]
        if site in self.totals:
            self.totals[site] += totals
            self.counts[site] += layout.counts
        else:
            self.totals[site], self.counts[site] = totals, layout.counts.clone()

    def merge_across(self, parallel: DataParallel, layout: Mapping[AttentionSite, int]) -> None:
        """Replace the local sums by the sums over every process of a data-parallel run (float64).

        ``layout`` (site -> heads, the same on every process) fixes what is exchanged, so a process
        that saw no batch still takes part; sites no process observed stay absent, as in one process.
        """
        if not parallel.distributed:
            return
        sites = sorted(layout)
        statistics = len(STATISTIC_NAMES)
        local = []
        for site in sites:
            local.append(self.totals.get(site, torch.zeros(2, statistics, layout[site], dtype=torch.float64)))
            local.append(self.counts.get(site, torch.zeros(statistics, dtype=torch.float64)))
        seen = torch.tensor([float(site in self.totals) for site in sites], dtype=torch.float64)  # [sites]
        examples_tokens = torch.tensor([self.num_examples, self.num_tokens], dtype=torch.float64)  # [2]
        *merged, seen, examples_tokens = parallel.sum([*local, seen, examples_tokens])
        self.totals, self.counts = {}, {}
        for number, site in enumerate(sites):
            if seen[number] > 0:
                self.totals[site], self.counts[site] = merged[2 * number], merged[2 * number + 1]
        self.num_examples, self.num_tokens = (int(value) for value in examples_tokens.tolist())

    @property
    def sums(self) -> dict[AttentionSite, Tensor]:
        """site -> ``[S, h]`` float64 sum of each statistic over the counted queries."""
        return {site: totals[0] for site, totals in self.totals.items()}

    @property
    def squares(self) -> dict[AttentionSite, Tensor]:
        """site -> ``[S, h]`` float64 sum of squares of each statistic over the counted queries."""
        return {site: totals[1] for site, totals in self.totals.items()}
