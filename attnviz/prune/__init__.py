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

from attnviz.common.lazy import exports_by_module, lazy_exports

if TYPE_CHECKING:  # for type checkers and IDEs; at run time each name is imported on first use
    from attnviz.models.head_sets import RemovedHeads as RemovedHeads
    from attnviz.models.head_sets import removal_mask as removal_mask
    from attnviz.models.objective import Objective as Objective
    from attnviz.models.objective import Quality as Quality
    from attnviz.prune.choices import METHODS as METHODS
    from attnviz.prune.choices import SCOPES as SCOPES
    from attnviz.prune.export import PruneReport as PruneReport
    from attnviz.prune.importance import HeadImportance as HeadImportance
    from attnviz.prune.importance import compute_importance as compute_importance
    from attnviz.prune.pipeline import PruneConfig as PruneConfig
    from attnviz.prune.pipeline import PruneOutcome as PruneOutcome
    from attnviz.prune.pipeline import check_prunable as check_prunable
    from attnviz.prune.pipeline import prune_model as prune_model
    from attnviz.prune.pipeline import save_outcome as save_outcome
    from attnviz.prune.strategy import PruneStrategy as PruneStrategy

#: public name -> module that defines it
_EXPORTS = exports_by_module(
    {
        "attnviz.models.head_sets": ("RemovedHeads", "removal_mask"),
        "attnviz.models.objective": ("Objective", "Quality"),
        "attnviz.prune.choices": ("METHODS", "SCOPES"),
        "attnviz.prune.export": ("PruneReport",),
        "attnviz.prune.importance": ("HeadImportance", "compute_importance"),
        "attnviz.prune.pipeline": ("PruneConfig", "PruneOutcome", "check_prunable", "prune_model", "save_outcome"),
        "attnviz.prune.strategy": ("PruneStrategy",),
    }
)

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
