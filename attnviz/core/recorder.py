"""The simplest observer: keep every pattern the core computes (for captures and small models)."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor

from attnviz.core.attention import AttentionSite


class PatternRecorder:
    """Observer that keeps every pattern it sees: ``patterns[site]`` is ``[b, h, q, k]`` float32."""

    def __init__(self) -> None:
        self._blocks: dict[AttentionSite, list[Tensor]] = defaultdict(list)

    def observe(self, site: AttentionSite, pattern: Tensor, query_start: int) -> None:
        if site is not None:
            self._blocks[site].append(pattern.detach().float().cpu())

    @property
    def patterns(self) -> dict[AttentionSite, Tensor]:
        return {
            site: blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2) for site, blocks in self._blocks.items()
        }
