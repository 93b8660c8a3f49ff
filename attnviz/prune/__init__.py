"""Head importance, masking and physical head pruning (``attnviz prune``).

Michel et al.'s "Are Sixteen Heads Really Better than One?" workflow for any
model that runs through attnviz's attention core:

* :mod:`.objective` — the data heads are judged on; the loss that judges them is the model's own
  (:mod:`attnviz.models.objective`: LM loss, toy task loss, or a label-free representation
  distortion for encoders);
* :mod:`.importance` — gradient, ablation, entropy / confidence proxies, random;
* :mod:`.strategy` — global or per-layer, one-shot or iterative, ``min_score`` stop;
* removing heads and saving the pruned model are the model's own (``LoadedModel.remove_heads``,
  ``LoadedModel.save_pruned``; Hugging Face families in :mod:`attnviz.models.physical`);
* :mod:`.checkpoint` — checking where the pruned checkpoint goes;
* :mod:`.measure` — parameter counts and latency; :mod:`.report` — table and JSON;
* :mod:`.pipeline` — all of it in order (:func:`prune_model`, :func:`save_outcome`).
"""

from attnviz.models.head_sets import RemovedHeads, removal_mask
from attnviz.models.objective import Objective, Quality
from attnviz.prune.importance import METHODS, HeadImportance, compute_importance
from attnviz.prune.pipeline import PruneConfig, PruneOutcome, check_prunable, prune_model, save_outcome
from attnviz.prune.export import PruneReport
from attnviz.prune.strategy import SCOPES, PruneStrategy

__all__ = [
    "METHODS",
    "SCOPES",
    "HeadImportance",
    "Objective",
    "PruneConfig",
    "PruneOutcome",
    "PruneReport",
    "PruneStrategy",
    "Quality",
    "RemovedHeads",
    "check_prunable",
    "compute_importance",
    "prune_model",
    "removal_mask",
    "save_outcome",
]
