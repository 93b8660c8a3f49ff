"""The per-head statistics attnviz computes, in one place: names, order, meaning.

Every statistic is a per-query number computed from one row of a head's pattern
``A`` (row ``i``: query ``i``; columns ``j``: the keys query ``i`` may see; the row
sums to 1). A head's value is the mean over all non-padding query positions of the
corpus (pooled over examples, so long examples weigh more), with its standard deviation.

In a model with attention sinks (gpt-oss's learned per-head sink logits) each row's softmax also
gives weight ``sᵢ`` to its head's sink, which has no value: the row's weights on keys sum to
``1 − sᵢ``. Every statistic reads those real weights; the entropy is that of the whole softmax,
keys and sink (``−Σⱼ Aᵢⱼ ln Aᵢⱼ − sᵢ ln sᵢ``), normalised by ``ln(keys + 1)``, and ``sink_share``
is ``sᵢ`` itself (0 in a model without sinks).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Statistic:
    """One per-head statistic."""

    name: str  # key in JSON/CSV and in HeadStatistics.matrix(name)
    formula: str  # the per-query quantity, in words and symbols
    unit: str  # "nats", "probability", "tokens" or "fraction"
    skipped: str = ""  # which queries do not count, beyond padding


STATISTICS: tuple[Statistic, ...] = (
    Statistic("entropy", "−Σⱼ Aᵢⱼ ln Aᵢⱼ (0·ln 0 = 0; with an attention sink, also − sᵢ ln sᵢ)", "nats"),
    Statistic(
        "normalized_entropy",
        "entropy ÷ ln(number of keys query i may see, + 1 with a sink): i+1 in a causal model, all keys otherwise",
        "fraction",
        "queries that see a single key",
    ),
    Statistic("max_weight", "maxⱼ Aᵢⱼ (confidence)", "probability"),
    Statistic("mean_distance", "Σⱼ Aᵢⱼ |i − j|", "tokens"),
    Statistic(
        "normalized_distance",
        "mean_distance ÷ the largest distance query i can reach (i causal; max(i, n−1−i) otherwise)",
        "fraction",
        "queries that can only reach themselves",
    ),
    Statistic("diagonal", "Aᵢᵢ (weight on the query's own position)", "probability"),
    Statistic("previous_token", "Aᵢ,ᵢ₋₁", "probability", "the first position (it has no previous token)"),
    Statistic("local_ratio", "Σ_{|i−j| ≤ w} Aᵢⱼ (w = the local window, 2 by default)", "probability"),
    Statistic("first_token", "Aᵢ₀ (mass on the first token: the attention sink)", "probability"),
    Statistic("special_tokens", "mass on the tokenizer's special tokens ([CLS], [SEP], BOS, EOS, …)", "probability"),
    Statistic(
        "sink_share",
        "sᵢ = 1 − Σⱼ Aᵢⱼ: the weight query i gives its head's learned attention sink (0 without sinks)",
        "probability",
    ),
)

#: Statistic names in their fixed order (the first axis of accumulated tensors).
STATISTIC_NAMES: tuple[str, ...] = tuple(s.name for s in STATISTICS)

#: name -> position in :data:`STATISTIC_NAMES`
STATISTIC_INDEX: dict[str, int] = {name: i for i, name in enumerate(STATISTIC_NAMES)}


def statistic_index(name: str) -> int:
    """Position of ``name``; a clear error listing the valid names otherwise."""
    from attnviz.common.errors import InputError

    key = name.strip().lower().replace("-", "_")
    if key not in STATISTIC_INDEX:
        raise InputError(f"unknown statistic {name!r}: use one of {', '.join(STATISTIC_NAMES)}")
    return STATISTIC_INDEX[key]
