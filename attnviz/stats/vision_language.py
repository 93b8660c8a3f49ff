"""Statistics of a vision-language model over texts with pictures in them: how much each head reads the picture.

Every per-head statistic of :mod:`attnviz.stats.definitions` is measured over the whole sequences (text and image
tokens) as for any language model. :class:`ImageTokenShare` adds, per head, the *image share*: for each query of
the text after the picture, the attention it gives the picture's tokens (summed over them), averaged over those
queries and every example; its standard deviation is over the same queries. A head with a large share is one the
written text reads the picture through.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnviz.common.images import ImageGrid
from attnviz.core import AttentionSite
from attnviz.models.base import EncodedBatch
from attnviz.stats.result import mean_std_records


@dataclass
class PictureStatistics:
    """What pictures add to a vision-language model's statistics: each head's image share (mean and std)."""

    image_share: dict[AttentionSite, Tensor]  # [h] float64 mean share of a text query's attention on the picture
    image_share_std: dict[AttentionSite, Tensor]  # [h] float64
    queries: int  # text queries after a picture that the shares average over (per head)

    def to_dict(self) -> dict:
        return {
            "queries": self.queries,
            "heads": mean_std_records("image_share", self.image_share, self.image_share_std),
        }


class ImageTokenShare:
    """An attention observer: per head, the share of each text query's attention (after the picture) on the
    picture's tokens, as float64 running sums (nothing of a pattern is kept)."""

    accepts_key_prefix = True  # reads the rows during observe only; keys past the leading ones weigh 0

    def __init__(self) -> None:
        self._grid: ImageGrid | None = None
        self._lengths: list[int] = []
        self._sums: dict[AttentionSite, list[Tensor]] = {}  # [sum, sum of squares], each [h] float64
        self._counts: dict[AttentionSite, int] = {}

    def begin_batch(self, batch: EncodedBatch) -> None:
        grid = batch.image_grid
        # a picture read through cross-attention (Mllama) has no tokens in the text to share the text's attention
        self._grid = grid if grid is not None and grid.placeholder is None else None
        self._lengths = batch.lengths

    def observe(self, site: AttentionSite | None, pattern: Tensor, query_start: int) -> None:
        """``pattern``: ``[b, h, rows, k]``, the rows of queries ``query_start …``."""
        grid = self._grid
        if site is None or grid is None:
            return
        first_text = grid.start + grid.num_tokens  # the first query after the picture
        for example, length in enumerate(self._lengths):
            low = max(first_text, query_start) - query_start
            high = min(length, query_start + pattern.shape[2]) - query_start
            if high <= low:
                continue
            rows = pattern[example, :, low:high, grid.start : first_text].double()  # [h, q, picture tokens]
            share = rows.sum(dim=-1)  # [h, q]
            sums = self._sums.setdefault(site, [torch.zeros(share.shape[0], dtype=torch.float64)] * 2)
            self._sums[site] = [sums[0] + share.sum(dim=1).cpu(), sums[1] + share.square().sum(dim=1).cpu()]
            self._counts[site] = self._counts.get(site, 0) + share.shape[1]

    def result(self) -> PictureStatistics:
        means, stds = {}, {}
        for site in sorted(self._sums):
            count = max(self._counts[site], 1)
            mean = self._sums[site][0] / count
            means[site] = mean
            stds[site] = (self._sums[site][1] / count - mean.square()).clamp(min=0).sqrt()
        return PictureStatistics(means, stds, max(self._counts.values(), default=0))


def picture_summary(picture: PictureStatistics, *, top: int = 3) -> str:
    """One line: the heads whose text queries read the picture most (their image share)."""
    ranked = sorted(
        (
            (float(values[head]), site, head)
            for site, values in picture.image_share.items()
            for head in range(len(values))
        ),
        key=lambda item: -item[0],
    )
    heads = ", ".join(f"L{site.layer}H{head} ({share:.0%})" for share, site, head in ranked[:top])
    return (
        f"image share (the attention of each text query after the picture on the picture's tokens, over "
        f"{picture.queries} queries): most in {heads}"
    )
