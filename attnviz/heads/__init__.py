"""What each head does: probe scores and function labels, head similarity, attention rollout.

Typical use::

    import attnviz

    model = attnviz.load_model("smollm2")
    functions = attnviz.head_functions(model)              # probe scores + labels
    functions.ranking("induction")[:5]                      # the strongest induction heads
    capture = attnviz.capture(model, "The cat sat on the mat.")
    attnviz.rollout(capture)                                # [query, key] attention rollout
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz.common.lazy import lazy_exports

if TYPE_CHECKING:  # for type checkers and IDEs; at run time each name is imported on first use
    from attnviz.heads.compute import head_functions, probe_scores
    from attnviz.heads.labels import LABELS, SCORE_NAMES, FunctionThresholds
    from attnviz.heads.probes import ProbeSettings, probe_batches
    from attnviz.heads.propagation import attention_flow, rollout
    from attnviz.heads.result import HeadFunctions, HeadSimilarity
    from attnviz.heads.scores import ProbeScoreAccumulator
    from attnviz.heads.similarity import head_similarity

#: public name -> module that defines it
_EXPORTS = {
    "LABELS": "attnviz.heads.labels",
    "SCORE_NAMES": "attnviz.heads.labels",
    "FunctionThresholds": "attnviz.heads.labels",
    "HeadFunctions": "attnviz.heads.result",
    "HeadSimilarity": "attnviz.heads.result",
    "ProbeScoreAccumulator": "attnviz.heads.scores",
    "ProbeSettings": "attnviz.heads.probes",
    "attention_flow": "attnviz.heads.propagation",
    "head_functions": "attnviz.heads.compute",
    "head_similarity": "attnviz.heads.similarity",
    "probe_batches": "attnviz.heads.probes",
    "probe_scores": "attnviz.heads.compute",
    "rollout": "attnviz.heads.propagation",
}

__all__ = [
    "LABELS",
    "SCORE_NAMES",
    "FunctionThresholds",
    "HeadFunctions",
    "HeadSimilarity",
    "ProbeScoreAccumulator",
    "ProbeSettings",
    "attention_flow",
    "head_functions",
    "head_similarity",
    "probe_batches",
    "probe_scores",
    "rollout",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
