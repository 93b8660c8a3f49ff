"""The result of comparing two models: one entry per head, per-layer means, and the documented JSON.

JSON object (``attnviz diff A B --json``)::

    {"format": "attnviz-diff", "version": 1, "kind": "models",
     "model_a": str, "model_b": str,
     "num_tokens_a": int, "num_tokens_b": int,      # real query positions per layer each model read
     "num_examples": int,                            # texts both models read
     "texts_compared": int, "texts_skipped": int,    # skipped: the two tokenizers split them differently
     "mode": "patterns" | "statistics",             # statistics: --by-statistics, no divergence
     "weighting": "weights" | "norm",               # norm: rows of α_ij·‖f_h(x_j)‖ renormalised to sum 1
     "local_window": int,
     "layers": [{"stack": str, "layer": int, "js_divergence": float | null, "total_variation": float | null,
                 "matched": int, "only_a": int, "only_b": int}],
     "heads": [{"stack": str, "layer": int, "head": int,          # the head's original number
                "status": "matched" | "only_a" | "only_b",
                "js_divergence": float | null,                   # nats, mean over every counted query
                "total_variation": float | null,
                "a": {statistic: float, statistic_std: float, ...} | null,
                "b": {...} | null,
                "delta": {statistic: float (b − a), ...} | null}]}

Statistic names are those of ``attnviz stats`` (:data:`attnviz.stats.definitions.STATISTIC_NAMES`).
A number no query counted for is ``null``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnviz.compare.matching import HeadMatch, HeadStatus
from attnviz.core import AttentionSite
from attnviz.stats.definitions import STATISTIC_NAMES
from attnviz.stats.result import HeadStatistics

FORMAT_NAME = "attnviz-diff"
FORMAT_VERSION = 1


def record_header(kind: str) -> dict:
    """The first fields of every ``attnviz diff`` JSON record: format, version and ``kind`` (``models``,
    ``inputs`` or ``checkpoints``), which says what the rest holds."""
    return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "kind": kind}


#: measures of change per head, in column order
DIVERGENCE_FIELDS = ("js_divergence", "total_variation")


def _number(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else round(float(value), 9)


@dataclass
class HeadDifference:
    """One head's comparison: divergence (None without patterns compared) and both models' statistics."""

    site: AttentionSite
    head: int  # original head number
    status: HeadStatus
    js_divergence: float | None
    total_variation: float | None
    a: dict[str, float] | None  # statistic -> mean and statistic_std -> std, of model A (None: only_b)
    b: dict[str, float] | None

    @property
    def delta(self) -> dict[str, float] | None:
        """Statistic -> B − A of the means (None unless matched)."""
        if self.a is None or self.b is None:
            return None
        return {name: self.b[name] - self.a[name] for name in STATISTIC_NAMES}

    def record(self) -> dict:
        def numbers(values: dict[str, float] | None) -> dict | None:
            return None if values is None else {name: _number(value) for name, value in values.items()}

        return {
            "stack": self.site.stack,
            "layer": self.site.layer,
            "head": self.head,
            "status": self.status,
            "js_divergence": _number(self.js_divergence),
            "total_variation": _number(self.total_variation),
            "a": numbers(self.a),
            "b": numbers(self.b),
            "delta": numbers(self.delta),
        }


@dataclass
class ModelComparison:
    """Two models compared head by head over the same texts (see the module docstring for the JSON)."""

    model_a: str
    model_b: str
    heads: list[HeadDifference]
    stats_a: HeadStatistics
    stats_b: HeadStatistics
    mode: str = "patterns"  # "patterns": divergence computed; "statistics": per-head statistics only
    texts_compared: int = 0
    texts_skipped: int = 0
    seconds: float | None = None  # wall time of the comparison pass
    #: what was compared: the weights, or norm-based attention with rows renormalised to sum 1
    weighting: str = "weights"
    extras: dict = field(default_factory=dict)

    @property
    def stacks(self) -> list[str]:
        return list(dict.fromkeys(head.site.stack for head in self.heads))

    def sites(self, stack: str | None = None) -> list[AttentionSite]:
        return sorted({head.site for head in self.heads if stack is None or head.site.stack == stack})

    def head(self, stack: str, layer: int, head: int) -> HeadDifference:
        for entry in self.heads:
            if (entry.site.stack, entry.site.layer, entry.head) == (stack, layer, head):
                return entry
        raise KeyError((stack, layer, head))

    def only(self, status: HeadStatus) -> list[tuple[str, int, int]]:
        """``(stack, layer, head)`` of every head with ``status``."""
        return [(h.site.stack, h.site.layer, h.head) for h in self.heads if h.status == status]

    def matrix(self, measure: str = "js_divergence", stack: str | None = None) -> Tensor:
        """``[layer, original head]`` float64 of a divergence field or ``delta:<statistic>``; NaN where not matched."""
        stack = stack or self.stacks[0]
        sites = self.sites(stack)
        width = max((h.head for h in self.heads if h.site.stack == stack), default=-1) + 1
        out = torch.full((len(sites), width), math.nan, dtype=torch.float64)  # [layer, head]
        row_of = {site: row for row, site in enumerate(sites)}
        for entry in self.heads:
            if entry.site.stack == stack:
                value = self.value(entry, measure)
                if value is not None:
                    out[row_of[entry.site], entry.head] = value
        return out

    @staticmethod
    def value(entry: HeadDifference, measure: str) -> float | None:
        if measure in DIVERGENCE_FIELDS:
            return getattr(entry, measure)
        if measure.startswith("delta:"):
            delta = entry.delta
            return None if delta is None else delta[measure.split(":", 1)[1]]
        raise KeyError(measure)

    def layer_means(self) -> list[dict]:
        """Per site: mean divergence over its matched heads, and how many heads each status has."""
        rows = []
        for site in self.sites():
            entries = [h for h in self.heads if h.site == site]
            matched = [h for h in entries if h.status == "matched"]
            row: dict = {"stack": site.stack, "layer": site.layer}
            for measure in DIVERGENCE_FIELDS:
                values = [getattr(h, measure) for h in matched if getattr(h, measure) is not None]
                row[measure] = _number(sum(values) / len(values)) if values else None
            for status in ("matched", "only_a", "only_b"):
                row[status] = sum(1 for h in entries if h.status == status)
            rows.append(row)
        return rows

    def most_changed(self, count: int = 10, measure: str = "js_divergence") -> list[HeadDifference]:
        """The matched heads with the largest ``measure`` (divergence, or ``delta:<statistic>`` by size)."""
        scored: list[tuple[float, HeadDifference]] = []
        for head in self.heads:
            value = self.value(head, measure) if head.status == "matched" else None
            if value is not None and not math.isnan(value):
                scored.append((abs(value), head))
        return [h for _, h in sorted(scored, key=lambda pair: -pair[0])[:count]]

    def record(self) -> dict:
        """The documented JSON object."""
        return {
            **record_header("models"),
            "model_a": self.model_a,
            "model_b": self.model_b,
            "num_tokens_a": self.stats_a.num_tokens,
            "num_tokens_b": self.stats_b.num_tokens,
            "num_examples": self.stats_a.num_examples,
            "texts_compared": self.texts_compared,
            "texts_skipped": self.texts_skipped,
            "mode": self.mode,
            "weighting": self.weighting,
            "local_window": self.stats_a.local_window,
            "layers": self.layer_means(),
            "heads": [head.record() for head in self.heads],
        }


def statistics_of(stats: HeadStatistics, site: AttentionSite, position: int) -> dict[str, float]:
    """statistic -> mean and statistic_std -> std of the head at weight ``position`` of ``site``."""
    numbers = stats.sites[site]
    values: dict[str, float] = {}
    for index, name in enumerate(STATISTIC_NAMES):
        values[name] = float(numbers.mean[index, position])
        values[f"{name}_std"] = float(numbers.std[index, position])
    return values


def build_comparison(
    matches: list[HeadMatch],
    stats_a: HeadStatistics,
    stats_b: HeadStatistics,
    divergences: dict[tuple[AttentionSite, int], tuple[float, float]] | None,
    **fields,
) -> ModelComparison:
    """One :class:`HeadDifference` per head of ``matches``; ``divergences``: (site, head) -> (JS, TV) of matched heads."""
    heads = []
    for match in matches:
        a = None if match.a_position is None else statistics_of(stats_a, match.site, match.a_position)
        b = None if match.b_position is None else statistics_of(stats_b, match.site, match.b_position)
        js = tv = None
        if divergences is not None and match.status == "matched":
            js, tv = divergences.get((match.site, match.head), (None, None))
        heads.append(HeadDifference(match.site, match.head, match.status, js, tv, a, b))
    return ModelComparison(
        model_a=stats_a.model, model_b=stats_b.model, heads=heads, stats_a=stats_a, stats_b=stats_b, **fields
    )
