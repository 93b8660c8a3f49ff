"""What ``attnviz heads`` computes: probe scores, labels, and optionally corpus statistics and head similarity."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnviz.stats.detect import Detection
    from attnviz.stats.result import HeadStatistics

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from attnviz.common.display import NotebookDisplay
from attnviz.common.errors import InputError
from attnviz.core import AttentionSite
from attnviz.heads.labels import SCORE_NAMES, FunctionThresholds, main_label, merge_labels, probe_labels
from attnviz.heads.probes import ProbeSettings
from attnviz.heads.scores import SCORE_INDEX

#: the order stacks are listed in (they run in this order)
STACK_ORDER = {"self": 0, "encoder": 1, "decoder": 2, "cross": 3}


def site_order(site: AttentionSite) -> tuple[int, int]:
    return STACK_ORDER.get(site.stack, len(STACK_ORDER)), site.layer


@dataclass(repr=False)  # NotebookDisplay's short repr; notebooks show the HTML view
class HeadSimilarity(NotebookDisplay):
    """Mean Jensen–Shannon divergence between every pair of heads (see :mod:`attnviz.heads.similarity`)."""

    heads: list[tuple[str, int, int]]  # (stack, layer, head) of each row / column
    divergence: Tensor  # [heads, heads] float64, symmetric, 0 on the diagonal; in nats (≤ ln 2)
    source: str  # "probes" or "corpus"
    examples: int  # examples averaged over
    max_tokens: int  # examples were cut to this many tokens


@dataclass(repr=False)  # NotebookDisplay's short repr; notebooks show the HTML view
class HeadFunctions(NotebookDisplay):
    """Probe scores and function labels of every head of one model.

    ``scores[site]`` is ``[score, h]`` (:data:`~attnviz.heads.scores.SCORE_NAMES` order);
    ``statistics`` / ``detection`` are the corpus statistics and flags when a corpus was given.
    """

    model: str
    causal: bool
    probe: ProbeSettings  # with the length resolved
    scores: dict[AttentionSite, Tensor]  # site -> [score, h] float64; NaN where undefined
    thresholds: FunctionThresholds
    statistics: HeadStatistics | None = None  # over the corpus
    detection: Detection | None = None  # of those statistics
    similarity: HeadSimilarity | None = None

    @property
    def stacks(self) -> list[str]:
        return list(dict.fromkeys(site.stack for site in sorted(self.scores, key=site_order)))

    def layers(self, stack: str = "self") -> list[AttentionSite]:
        if stack not in self.stacks:
            raise InputError(f"{self.model} has no {stack!r} attention; it has {', '.join(self.stacks)}")
        return sorted(site for site in self.scores if site.stack == stack)

    def num_heads(self, stack: str = "self") -> int:
        return max(self.scores[site].shape[1] for site in self.layers(stack))

    def matrix(self, score: str, stack: str = "self") -> Tensor:
        """``[layer, head]`` float32 of one probe score; NaN where a layer has fewer heads."""
        if score not in SCORE_INDEX:
            raise InputError(f"unknown probe score {score!r}: use {', '.join(SCORE_NAMES)}")
        layers = self.layers(stack)
        out = torch.full((layers[-1].layer + 1, self.num_heads(stack)), math.nan)  # [layer, head]
        for site in layers:  # rows of a hybrid stack's layers without attention stay NaN
            values = self.scores[site][SCORE_INDEX[score]]  # [h]
            out[site.layer, : values.shape[0]] = values.float()
        return out

    def head_scores(self, site: AttentionSite, head: int) -> dict[str, float]:
        return {name: float(self.scores[site][index, head]) for index, name in enumerate(SCORE_NAMES)}

    def flags(self, site: AttentionSite, head: int) -> tuple[str, ...]:
        """The corpus flags of ``attnviz stats`` (empty without a corpus)."""
        if self.detection is None or site not in self.detection.flags:
            return ()
        return self.detection.flags[site][head]

    def labels(self, site: AttentionSite, head: int) -> tuple[str, ...]:
        """Probe labels, then the corpus flags."""
        return merge_labels(probe_labels(self.head_scores(site, head), self.thresholds), self.flags(site, head))

    def main_label(self, site: AttentionSite, head: int) -> str | None:
        from attnviz.stats.detect import PROBLEM_FLAGS

        return main_label(self.head_scores(site, head), self.labels(site, head), PROBLEM_FLAGS)

    def heads(self, stack: str | None = None) -> Iterator[tuple[AttentionSite, int]]:
        for site in sorted(self.scores, key=site_order):
            if stack is None or site.stack == stack:
                for head in range(self.scores[site].shape[1]):
                    yield site, head

    def ranking(self, score: str = "induction", stack: str | None = None) -> list[tuple[AttentionSite, int, float]]:
        """Every head by ``score``, highest first (NaN last)."""
        index = SCORE_INDEX[score]
        rows = [(site, head, float(self.scores[site][index, head])) for site, head in self.heads(stack)]
        rows.sort(key=lambda row: (math.isnan(row[2]), -row[2] if not math.isnan(row[2]) else 0.0))
        return rows
