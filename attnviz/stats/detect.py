"""Flagging heads from their mean statistics: problem heads and pattern labels.

Two problem flags:

* ``collapsed``: nearly all of each query's weight goes to one key. Flagged when
  ANY enabled criterion holds: mean ``max_weight`` at least ``collapsed_max_weight``,
  mean ``normalized_entropy`` below ``collapsed_normalized_entropy``, or mean
  ``entropy`` below ``collapsed_entropy`` nats. A collapsed head that is also
  ``first-token-sink`` or ``special-token`` parks its attention (a no-op head);
  one that is also ``diagonal`` or ``previous-token`` is a sharp positional head.
* ``unfocused``: close to uniform over the keys it may see. Flagged when ALL
  enabled criteria hold: mean ``normalized_entropy`` at least
  ``unfocused_normalized_entropy`` and mean ``max_weight`` below ``unfocused_max_weight``.

Pattern labels, each when the head's mean of the statistic is at least its
``*_min`` threshold: ``diagonal``, ``previous-token`` (``previous_token``),
``first-token-sink`` (``first_token``), ``special-token`` (``special_tokens``), and
``local`` (``local_ratio``; only when neither ``diagonal`` nor ``previous-token``
already says which nearby key it is).

Why the default thresholds are normalised: the seeds' literal rule (collapsed when
mean entropy < 1.0 nats, unfocused when mean max weight < 0.3) depends on sequence
length. A perfectly uniform head over n keys has entropy ln n, which is below 1 nat
for n ≤ 2 and far above it at n = 2048, and its max weight 1/n falls below 0.3 as
soon as n ≥ 4 — so the same head is "collapsed" on short inputs and "unfocused" on
long ones, and in a causal model every early query looks collapsed. Dividing the
entropy by ln(keys the query may see) gives 1 for uniform and 0 for one-hot at any
length. The literal rule remains available as the ``seed`` preset.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from attnviz.core import AttentionSite
from attnviz.stats.definitions import STATISTIC_INDEX
from attnviz.stats.result import HeadStatistics
from attnviz.stats.thresholds import PRESETS, Thresholds

#: Problem flags, then pattern labels, in the order they are listed for a head.
FLAGS = ("collapsed", "unfocused", "diagonal", "previous-token", "first-token-sink", "special-token", "local")
PROBLEM_FLAGS = ("collapsed", "unfocused")


@dataclass
class Detection:
    """Flags of every head, and the thresholds that produced them."""

    thresholds: Thresholds
    flags: dict[AttentionSite, list[tuple[str, ...]]]  # site -> per head, flags in FLAGS order

    def head_flags(self, layer: int, head: int, stack: str = "self") -> tuple[str, ...]:
        return self.flags[AttentionSite(stack, layer)][head]

    def flagged(self, flag: str | None = None) -> list[tuple[AttentionSite, int]]:
        """Heads with ``flag`` (any problem flag when ``None``)."""
        wanted = PROBLEM_FLAGS if flag is None else (flag,)
        return [
            (site, head)
            for site, heads in self.flags.items()
            for head, head_flags in enumerate(heads)
            if any(f in head_flags for f in wanted)
        ]

    def counts(self, site: AttentionSite) -> Counter:
        """How many heads of ``site`` carry each flag."""
        return Counter(flag for head_flags in self.flags[site] for flag in head_flags)


def _at_least(value: float, threshold: float | None) -> bool:
    return threshold is not None and not math.isnan(value) and value >= threshold


def _below(value: float, threshold: float | None) -> bool:
    return threshold is not None and not math.isnan(value) and value < threshold


def head_flags(means: dict[str, float], thresholds: Thresholds) -> tuple[str, ...]:
    """Flags of one head from its mean statistics (``{name: value}``)."""
    t = thresholds
    flags = []
    if (
        _at_least(means["max_weight"], t.collapsed_max_weight)
        or _below(means["normalized_entropy"], t.collapsed_normalized_entropy)
        or _below(means["entropy"], t.collapsed_entropy)
    ):
        flags.append("collapsed")
    unfocused_checks = [
        (means["normalized_entropy"], t.unfocused_normalized_entropy, _at_least),
        (means["max_weight"], t.unfocused_max_weight, _below),
    ]
    enabled = [(value, threshold, test) for value, threshold, test in unfocused_checks if threshold is not None]
    if enabled and all(test(value, threshold) for value, threshold, test in enabled):
        flags.append("unfocused")
    if _at_least(means["diagonal"], t.diagonal_min):
        flags.append("diagonal")
    if _at_least(means["previous_token"], t.previous_token_min):
        flags.append("previous-token")
    if _at_least(means["first_token"], t.first_token_min):
        flags.append("first-token-sink")
    if _at_least(means["special_tokens"], t.special_tokens_min):
        flags.append("special-token")
    if _at_least(means["local_ratio"], t.local_ratio_min) and not {"diagonal", "previous-token"} & set(flags):
        flags.append("local")
    return tuple(flags)


def detect_heads(stats: HeadStatistics, thresholds: Thresholds | None = None) -> Detection:
    """Flag every head of ``stats`` (default thresholds: the ``normalized`` preset)."""
    thresholds = thresholds or PRESETS["normalized"]
    flags = {}
    for site, numbers in stats.sites.items():
        per_head = []
        for head in range(numbers.num_heads):
            means = {name: float(numbers.mean[index, head]) for name, index in STATISTIC_INDEX.items()}
            per_head.append(head_flags(means, thresholds))
        flags[site] = per_head
    return Detection(thresholds=thresholds, flags=flags)
