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

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz.common.lazy import lazy_exports

if TYPE_CHECKING:  # for type checkers and IDEs; at run time each name is imported on first use
    from attnviz.models.head_sets import RemovedHeads, removal_mask
    from attnviz.models.objective import Objective, Quality
    from attnviz.prune.choices import METHODS, SCOPES
    from attnviz.prune.export import PruneReport
    from attnviz.prune.importance import HeadImportance, compute_importance
    from attnviz.prune.pipeline import PruneConfig, PruneOutcome, check_prunable, prune_model, save_outcome
    from attnviz.prune.strategy import PruneStrategy

#: public name -> module that defines it
_EXPORTS = {
    "METHODS": "attnviz.prune.choices",
    "SCOPES": "attnviz.prune.choices",
    "HeadImportance": "attnviz.prune.importance",
    "Objective": "attnviz.models.objective",
    "PruneConfig": "attnviz.prune.pipeline",
    "PruneOutcome": "attnviz.prune.pipeline",
    "PruneReport": "attnviz.prune.export",
    "PruneStrategy": "attnviz.prune.strategy",
    "Quality": "attnviz.models.objective",
    "RemovedHeads": "attnviz.models.head_sets",
    "check_prunable": "attnviz.prune.pipeline",
    "compute_importance": "attnviz.prune.importance",
    "prune_model": "attnviz.prune.pipeline",
    "removal_mask": "attnviz.models.head_sets",
    "save_outcome": "attnviz.prune.pipeline",
}

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
