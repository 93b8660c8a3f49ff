"""The result of ``attnviz stats``: per-head means and standard deviations of every statistic."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnviz.common.display import NotebookDisplay
from attnviz.common.errors import InputError
from attnviz.core import AttentionSite
from attnviz.models.identity import HeadIdentity
from attnviz.stats.definitions import STATISTIC_NAMES, statistic_index


@dataclass
class SiteStatistics:
    """Statistics of the heads of one attention site (one layer of one stack)."""

    mean: Tensor  # [S, h] float64, statistics in STATISTIC_NAMES order; NaN where no query counted
    std: Tensor  # [S, h] float64 population standard deviation over the counted queries
    count: Tensor  # [S] float64 number of query positions each statistic averages over

    @property
    def num_heads(self) -> int:
        return self.mean.shape[1]


@dataclass(repr=False)  # NotebookDisplay's short repr; notebooks show the HTML view
class HeadStatistics(NotebookDisplay):
    """Per-head statistics of one model over a corpus.

    ``sites[AttentionSite(stack, layer)]`` holds the numbers; :meth:`matrix` gives
    one statistic as a ``[layer, head]`` tensor.
    """

    model: str  # name of the model (what the user typed)
    causal: bool  # decoder-only causal model
    sites: dict[AttentionSite, SiteStatistics]  # in (stack, layer) order
    num_examples: int  # examples (texts) read
    num_tokens: int  # real (non-padding) tokens of the first stack, i.e. query positions per layer
    local_window: int  # w of local_ratio
    identity: HeadIdentity | None = None  # original head numbers of a pruned model
    seconds: float | None = None  # wall time of the corpus pass (all processes of a distributed run)
    processes: int = 1  # processes of a data-parallel run (torchrun) that shared the corpus
    #: images (vision models): sink-patch shares and sink heads (an ``attnviz.stats.images.ImageHeadStatistics``)
    image: Any = None
    #: statistics by query position (an ``attnviz.stats.by_position.PositionStatistics``), when asked for
    by_position: Any = None
    #: what the statistics measured: the softmax weights, or norm-based attention renormalised per row
    weighting: str = "weights"
    #: what each token carries (an ``attnviz.stats.carriers.CarrierStatistics``), where the model allows it
    carriers: Any = None
    #: texts with pictures in them (a vision-language model): each head's image share
    #: (an ``attnviz.stats.vision_language.PictureStatistics``)
    picture: Any = None

    names = STATISTIC_NAMES

    def original_head(self, site: AttentionSite, head: int) -> int:
        """The head's number in the unpruned model (``head`` itself for models that were not pruned)."""
        if self.identity is None:
            return head
        return self.identity.ids(site.stack, site.layer, self.sites[site].num_heads)[head]

    def is_masked(self, site: AttentionSite, head: int) -> bool:
        """Whether pruning removed this head but kept it in the weights with zeroed output."""
        if self.identity is None:
            return False
        return self.original_head(site, head) in self.identity.masked_ids(site.stack, site.layer)

    def stack_tokens(self, stack: str) -> int:
        """The query positions ``stack`` measured (per layer): :attr:`num_tokens` for the first stack, a
        captioner's caption tokens for its ``decoder`` and ``cross`` stacks (their queries are the caption's)."""
        counts = [numbers.count for site, numbers in self.sites.items() if site.stack == stack]
        return int(max(float(counts[0].max()), 0)) if counts else self.num_tokens

    @property
    def tokens_per_second(self) -> float | None:
        """Throughput of the corpus pass: real tokens over wall seconds (None when not timed)."""
        if self.seconds is None or self.seconds <= 0:
            return None
        return self.num_tokens / self.seconds

    @classmethod
    def from_accumulator(
        cls, accumulator, model: str, *, seconds: float | None = None, processes: int = 1
    ) -> HeadStatistics:
        """Means and standard deviations from a :class:`~attnviz.stats.accumulator.StatisticsAccumulator`."""
        order = sorted(accumulator.totals)
        sites = {}
        if order:
            # every site at once, brought to the host in one copy (a GPU's sums: not one wait per layer)
            heads = [accumulator.totals[site].shape[-1] for site in order]
            sums, squares = torch.cat([accumulator.totals[site] for site in order], dim=-1).cpu()  # [S, Σh] each
            counts = torch.stack([accumulator.counts[site] for site in order]).cpu()  # [sites, S]
            per_head = counts.repeat_interleave(torch.tensor(heads), dim=0).T  # [S, Σh]: each head's site's counts
            divisor = per_head.clamp(min=1)
            mean = sums / divisor  # [S, Σh]
            variance = (squares / divisor - mean * mean).clamp(min=0)  # [S, Σh]
            means = mean.masked_fill(per_head == 0, math.nan).split(heads, dim=-1)
            stds = variance.sqrt().masked_fill(per_head == 0, math.nan).split(heads, dim=-1)
            for site, site_mean, site_std, count in zip(order, means, stds, counts):
                sites[site] = SiteStatistics(mean=site_mean.clone(), std=site_std.clone(), count=count.clone())
        positions = accumulator.by_position  # read after the totals: reading them reduced every pending block
        return cls(
            by_position=None if positions is None else positions.result(),
            model=model,
            causal=accumulator.causal,
            sites=sites,
            num_examples=accumulator.num_examples,
            num_tokens=accumulator.num_tokens,
            local_window=accumulator.local_window,
            seconds=seconds,
            processes=processes,
        )

    # -- shape ---------------------------------------------------------------------------------

    @property
    def stacks(self) -> list[str]:
        """Attention stacks present, in order ("self", or "encoder", "decoder", "cross")."""
        return list(dict.fromkeys(site.stack for site in self.sites))

    def layers(self, stack: str = "self") -> list[AttentionSite]:
        """The sites of ``stack`` in layer order."""
        if stack not in self.stacks:
            raise InputError(f"{self.model} has no {stack!r} attention; it has {', '.join(self.stacks)}")
        return sorted(site for site in self.sites if site.stack == stack)

    def num_layers(self, stack: str = "self") -> int:
        """Rows of :meth:`matrix`: the model's layers up to its last attention layer (a hybrid stack's layers
        without attention are NaN rows, so row ``l`` is always layer ``l``)."""
        return max(site.layer for site in self.layers(stack)) + 1

    def num_heads(self, stack: str = "self") -> int:
        """Heads per layer (the largest, if pruning made layers differ)."""
        return max(self.sites[site].num_heads for site in self.layers(stack))

    # -- values --------------------------------------------------------------------------------

    def matrix(self, name: str, stack: str = "self") -> Tensor:
        """``[layer, head]`` float64 means of statistic ``name`` (as accumulated); NaN where a layer has fewer heads
        (or none: a hybrid stack's layers without attention)."""
        return self._matrix(name, stack, "mean")

    def std_matrix(self, name: str, stack: str = "self") -> Tensor:
        """``[layer, head]`` float64 standard deviations of statistic ``name``; NaN where a layer has fewer heads."""
        return self._matrix(name, stack, "std")

    def original_matrix(self, name: str, stack: str = "self") -> Tensor:
        """``[layer, original head]`` means: :meth:`matrix` with a pruned model's heads at their original numbers.

        NaN where a head was removed (or a layer has fewer heads). The same as :meth:`matrix` for a model
        that was not pruned. Figures and grids use this, so pruning never renumbers heads.
        """
        if self.identity is None:
            return self.matrix(name, stack)
        index = statistic_index(name)
        layers = self.layers(stack)
        ids = [self.original_ids(site) for site in layers]
        width = max((max(row) + 1 for row in ids if row), default=0)
        out = torch.full((self.num_layers(stack), width), math.nan, dtype=torch.float64)  # [layer, original head]
        for row, site in enumerate(layers):
            out[site.layer, ids[row]] = self.sites[site].mean[index].double()
        return out

    def original_ids(self, site: AttentionSite) -> list[int]:
        """The original number of each head of ``site``, in weight order."""
        return [self.original_head(site, head) for head in range(self.sites[site].num_heads)]

    def _matrix(self, name: str, stack: str, field: str) -> Tensor:
        index = statistic_index(name)
        layers = self.layers(stack)
        # float64: the sums are float64, and float32 would round a mean distance of ~1000 to 6e-5
        out = torch.full((self.num_layers(stack), self.num_heads(stack)), math.nan, dtype=torch.float64)
        for site in layers:  # out: [layer, head], rows of layers without attention NaN
            values = getattr(self.sites[site], field)[index]  # [h]
            out[site.layer, : values.shape[0]] = values.double()
        return out

    def heads(self) -> Iterator[tuple[AttentionSite, int, dict[str, float]]]:
        """Every head as ``(site, head, {statistic: mean, statistic_std: std, ...})``."""
        for site, numbers in self.sites.items():
            for head in range(numbers.num_heads):
                row: dict[str, float] = {}
                for index, name in enumerate(STATISTIC_NAMES):
                    row[name] = float(numbers.mean[index, head])
                    row[f"{name}_std"] = float(numbers.std[index, head])
                yield site, head, row


def mean_std_records(
    name: str,
    means: dict[AttentionSite, Tensor],
    stds: dict[AttentionSite, Tensor],
    more: Callable[[AttentionSite, int], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """``[{layer, head, name, name_std, …}]``: one JSON record per head of a per-head quantity (``means`` and
    ``stds`` ``[h]`` per site), rounded to 6 decimals, site by site; ``more(site, head)``: fields to add last."""
    return [
        {
            "layer": site.layer,
            "head": head,
            name: round(float(values[head]), 6),
            f"{name}_std": round(float(stds[site][head]), 6),
            **(more(site, head) if more is not None else {}),
        }
        for site, values in means.items()
        for head in range(values.shape[0])
    ]
