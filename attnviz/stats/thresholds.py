"""Detection thresholds of ``attnviz stats`` and their named presets; imports nothing heavy (the CLI lists them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnviz.common.errors import InputError
from attnviz.common.thresholds import ThresholdSet


@dataclass(frozen=True)
class Thresholds(ThresholdSet):
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

    def bounds(self, name: str) -> tuple[float, float, str]:
        if name == "collapsed_entropy":  # in nats: grows with the sequence length
            return 0.0, math.inf, " (in nats)"
        return super().bounds(name)


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
