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
from dataclasses import asdict, dataclass, fields, replace

from attnviz.common.display import NotebookDisplay
from attnviz.core import AttentionSite
from attnviz.common.errors import InputError, ParameterError
from attnviz.stats.definitions import STATISTIC_INDEX
from attnviz.stats.result import HeadStatistics

#: Problem flags, then pattern labels, in the order they are listed for a head.
FLAGS = ("collapsed", "unfocused", "diagonal", "previous-token", "first-token-sink", "special-token", "local")
PROBLEM_FLAGS = ("collapsed", "unfocused")


@dataclass(frozen=True)
class Thresholds:
    """Detection thresholds on a head's mean statistics. ``None`` disables a criterion.

    "at least" thresholds flag values ≥ the threshold; "below" thresholds flag values < it.
    """

    # collapsed (any criterion): mean max_weight at least this ...
    collapsed_max_weight: float | None = 0.9
    # ... or mean normalized_entropy below this ...
    collapsed_normalized_entropy: float | None = 0.1
    # ... or mean entropy below this many nats (the seeds' rule; depends on sequence length)
    collapsed_entropy: float | None = None
    # unfocused (all criteria): mean normalized_entropy at least this ...
    unfocused_normalized_entropy: float | None = 0.9
    # ... and mean max_weight below this
    unfocused_max_weight: float | None = 0.5
    # diagonal: mean weight on the query's own position at least this
    diagonal_min: float | None = 0.5
    # previous-token: mean weight on the previous position at least this
    previous_token_min: float | None = 0.5
    # first-token-sink: mean weight on the first token at least this
    first_token_min: float | None = 0.5
    # special-token: mean weight on special tokens ([CLS], [SEP], BOS, EOS) at least this
    special_tokens_min: float | None = 0.5
    # local: mean weight within ±local_window positions at least this
    local_ratio_min: float | None = 0.8

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None:
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ParameterError(item.name, f"threshold {{{item.name}}} must be a number, got {value!r}", value)
            if item.name == "collapsed_entropy":
                if value < 0:
                    raise ParameterError(
                        item.name, f"threshold {{{item.name}}} is in nats and must be ≥ 0, got {value}", value
                    )
            elif not 0.0 <= value <= 1.0:
                raise ParameterError(
                    item.name, f"threshold {{{item.name}}} must be between 0 and 1, got {value}", value
                )

    def to_dict(self) -> dict[str, float | None]:
        return asdict(self)

    def override(self, **values: float | None) -> Thresholds:
        """A copy with the given (non-None) fields replaced; checks ranges."""
        unknown = set(values) - {item.name for item in fields(self)}
        if unknown:
            raise InputError(f"unknown threshold(s): {', '.join(sorted(unknown))}")
        return replace(self, **{name: value for name, value in values.items() if value is not None})


#: Named threshold sets. ``normalized`` is the default; ``seed`` is the seeds' literal rule.
PRESETS: dict[str, Thresholds] = {
    "normalized": Thresholds(),
    "seed": Thresholds(
        collapsed_max_weight=None,
        collapsed_normalized_entropy=None,
        collapsed_entropy=1.0,
        unfocused_normalized_entropy=None,
        unfocused_max_weight=0.3,
    ),
}


def preset_thresholds(name: str) -> Thresholds:
    """The thresholds of preset ``name``; a clear error listing the presets otherwise."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise InputError(f"unknown threshold preset {name!r}: use {' or '.join(PRESETS)}")
    return PRESETS[key]


@dataclass(repr=False)  # NotebookDisplay's short repr; notebooks show the HTML view
class Detection(NotebookDisplay):
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
