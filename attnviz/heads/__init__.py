"""What each head does: probe scores and function labels, head similarity, attention rollout.

Typical use::

    import attnviz

    model = attnviz.load_model("smollm2")
    functions = attnviz.head_functions(model)              # probe scores + labels
    functions.ranking("induction")[:5]                      # the strongest induction heads
    capture = attnviz.capture(model, "The cat sat on the mat.")
    attnviz.rollout(capture)                                # [query, key] attention rollout
"""

from attnviz.heads.compute import head_functions, probe_scores
from attnviz.heads.labels import LABELS, FunctionThresholds
from attnviz.heads.probes import ProbeSettings, probe_batches
from attnviz.heads.result import HeadFunctions, HeadSimilarity
from attnviz.heads.rollout import attention_flow, rollout
from attnviz.heads.scores import SCORE_NAMES, ProbeScoreAccumulator
from attnviz.heads.similarity import head_similarity

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
