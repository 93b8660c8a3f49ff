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

from attnviz.common.lazy import exports_by_module, lazy_exports

if TYPE_CHECKING:  # for type checkers and IDEs; at run time each name is imported on first use
    from attnviz.heads.compute import head_functions as head_functions
    from attnviz.heads.compute import probe_scores as probe_scores
    from attnviz.heads.labels import LABELS as LABELS
    from attnviz.heads.labels import SCORE_NAMES as SCORE_NAMES
    from attnviz.heads.labels import FunctionThresholds as FunctionThresholds
    from attnviz.heads.probes import ProbeSettings as ProbeSettings
    from attnviz.heads.probes import probe_batches as probe_batches
    from attnviz.heads.propagation import attention_flow as attention_flow
    from attnviz.heads.propagation import rollout as rollout
    from attnviz.heads.result import HeadFunctions as HeadFunctions
    from attnviz.heads.result import HeadSimilarity as HeadSimilarity
    from attnviz.heads.scores import ProbeScoreAccumulator as ProbeScoreAccumulator
    from attnviz.heads.similarity import head_similarity as head_similarity

#: public name -> module that defines it
_EXPORTS = exports_by_module(
    {
        "attnviz.heads.compute": ("head_functions", "probe_scores"),
        "attnviz.heads.labels": ("LABELS", "SCORE_NAMES", "FunctionThresholds"),
        "attnviz.heads.probes": ("ProbeSettings", "probe_batches"),
        "attnviz.heads.propagation": ("attention_flow", "rollout"),
        "attnviz.heads.result": ("HeadFunctions", "HeadSimilarity"),
        "attnviz.heads.scores": ("ProbeScoreAccumulator",),
        "attnviz.heads.similarity": ("head_similarity",),
    }
)

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
