"""What changed between two models, two checkpoints, two precisions or two inputs: head by head.

Typical use::

    import attnviz

    result = attnviz.compare_models("minilm", "pruned-minilm", texts=["The cat sat.", "It was tired."])
    result.matrix("js_divergence")        # [layer, original head], nats
    result.only("only_a")                 # heads the pruned copy no longer has
    pair = attnviz.compare_inputs("smollm2", "The keys to the cabinet are", "The keys to the cabinet is")
    pair.difference("self", 0)            # [head, query, key] B − A
"""

from attnviz.compare.checkpoints import CheckpointComparison, compare_checkpoints
from attnviz.compare.divergence import query_divergences
from attnviz.compare.inputs import InputComparison, compare_inputs
from attnviz.compare.matching import HeadMatch, match_heads
from attnviz.compare.models import compare_models
from attnviz.compare.result import HeadDifference, ModelComparison

__all__ = [
    "CheckpointComparison",
    "HeadDifference",
    "HeadMatch",
    "InputComparison",
    "ModelComparison",
    "compare_checkpoints",
    "compare_inputs",
    "compare_models",
    "match_heads",
    "query_divergences",
]
