"""Detection thresholds of ``attnviz stats`` and their named presets; imports nothing heavy (the CLI lists them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnviz.common.errors import InputError
from attnviz.common.thresholds import ThresholdSet

#: the label of a head that attends to the previous token: a corpus flag here, a probe label in attnviz.heads
PREVIOUS_TOKEN_FLAG = "previous-token"


@dataclass(frozen=True)
class Thresholds(ThresholdSet):
    """Detection thresholds on a head's mean statistics. ``None`` disables a criterion.

    "at least" thresholds flag values ≥ the threshold; "below" thresholds flag values < it.
    """

    # collapsed (any criterion): mean max_weight at least this ...
    collapsed_max_weight: float | None = 0.9
    # ... or mean normalized_entropy below this ...
    collapsed_normalized_entropy: float | None = 0.1
    # ... or mean entropy below this many nats (the ``absolute`` preset's rule; depends on sequence length)
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


#: Named threshold sets. ``normalized`` (the default) divides the entropy by its largest possible value, so a
#: flag means the same at any length; ``absolute`` uses fixed limits (collapsed when the mean entropy is below
#: 1.0 nats, unfocused when the mean max weight is below 0.3), which depend on the sequence length.
PRESETS: dict[str, Thresholds] = {
    "normalized": Thresholds(),
    "absolute": Thresholds(
        collapsed_max_weight=None,
        collapsed_normalized_entropy=None,
        collapsed_entropy=1.0,
        unfocused_normalized_entropy=None,
        unfocused_max_weight=0.3,
    ),
}


#: Former preset names that still work (not listed in help): ``seed`` was ``absolute``'s first name.
PRESET_ALIASES = {"seed": "absolute"}


def preset_name(name: str) -> str:
    """The preset's current name (``seed`` -> ``absolute``); unknown names are returned as given."""
    key = name.strip().lower()
    return PRESET_ALIASES.get(key, key)


def preset_thresholds(name: str) -> Thresholds:
    """The thresholds of preset ``name`` (or a former name); a clear error listing the presets otherwise."""
    key = preset_name(name)
    if key not in PRESETS:
        raise InputError(f"unknown threshold preset {name!r}: use {' or '.join(PRESETS)}")
    return PRESETS[key]
