"""Function labels from probe scores, merged with the corpus flags of ``attnviz stats``.

A head gets a label when its probe score is at least the label's threshold:

=================== ==================== =========
label               score                default
=================== ==================== =========
``induction``       ``induction``        0.3
``duplicate-token`` ``duplicate_token``  0.3
``previous-token``  ``previous_token``   0.5
``next-token``      ``next_token``       0.5
=================== ==================== =========

Why these defaults: a head that spreads its weight evenly gives each key of a probe of
length T about 1/(1.5·T) ≈ 0.013 at T = 50, so 0.3 on one particular key is a head that
looks for it; positional heads (previous / next token) are labelled like the ``previous-token``
flag of ``attnviz stats`` (0.5). All four are overridable (:meth:`FunctionThresholds.override`).

A head's **main label** is its probe label with the highest score, else its first corpus flag
that is not a problem flag, else its problem flag, else none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnviz.common.thresholds import ThresholdSet

#: the probe scores, in the order they are listed
SCORE_NAMES: tuple[str, ...] = ("induction", "duplicate_token", "previous_token", "next_token")

#: label of each score, in :data:`SCORE_NAMES` order
LABELS: dict[str, str] = {
    "induction": "induction",
    "duplicate_token": "duplicate-token",
    "previous_token": "previous-token",
    "next_token": "next-token",
}


@dataclass(frozen=True)
class FunctionThresholds(ThresholdSet):
    """Least probe score that earns each label. ``None`` turns a label off."""

    # induction if the mean weight on the token after the earlier occurrence is at least this
    induction_min: float | None = 0.3
    # duplicate-token if the mean weight on the earlier occurrence itself is at least this
    duplicate_token_min: float | None = 0.3
    # previous-token if the mean weight on position i − 1 (random tokens) is at least this
    previous_token_min: float | None = 0.5
    # next-token (bidirectional stacks) if the mean weight on position i + 1 is at least this
    next_token_min: float | None = 0.5

    def of(self, score: str) -> float | None:
        return getattr(self, f"{score}_min")


def probe_labels(scores: dict[str, float], thresholds: FunctionThresholds) -> tuple[str, ...]:
    """Labels of one head from its probe scores (``{score: value}``), in :data:`SCORE_NAMES` order."""
    labels = []
    for name in SCORE_NAMES:
        value, threshold = scores.get(name, math.nan), thresholds.of(name)
        if threshold is not None and not math.isnan(value) and value >= threshold:
            labels.append(LABELS[name])
    return tuple(labels)


def merge_labels(probe: tuple[str, ...], flags: tuple[str, ...]) -> tuple[str, ...]:
    """Probe labels first, then the corpus flags they do not repeat."""
    return probe + tuple(flag for flag in flags if flag not in probe)


def main_label(scores: dict[str, float], labels: tuple[str, ...], problem_flags: tuple[str, ...]) -> str | None:
    """The label that best says what the head does (see the module docstring)."""
    probe = [name for name in SCORE_NAMES if LABELS[name] in labels]
    if probe:
        return LABELS[max(probe, key=lambda name: scores[name])]
    others = [label for label in labels if label not in problem_flags]
    if others:
        return others[0]
    return labels[0] if labels else None
