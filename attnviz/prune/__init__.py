"""Head importance, masking and physical head pruning (``attnviz prune``).

Michel et al.'s "Are Sixteen Heads Really Better than One?" workflow for any
model that runs through attnviz's attention core:

* :mod:`.objective` — the loss heads are judged by (LM loss, toy task loss, or
  a label-free representation distortion for encoders);
* :mod:`.importance` — gradient, ablation, entropy / confidence proxies, random;
* :mod:`.strategy` — global or per-layer, one-shot or iterative, ``min_score`` stop;
* :mod:`.physical` — slicing removed heads out of BERT-, GPT-2- and LLaMA-style weights
  (grouped-query attention included);
* :mod:`.checkpoint` — writing pruned checkpoints and loading them back;
* :mod:`.measure` — parameter counts and latency; :mod:`.report` — table and JSON;
* :mod:`.pipeline` — all of it in order (:func:`prune_model`, :func:`save_outcome`).
"""

from attnviz.models.heads import RemovedHeads, removal_mask
from attnviz.prune.importance import METHODS, HeadImportance, compute_importance
from attnviz.prune.objective import Objective, Quality, build_objective
from attnviz.prune.pipeline import PruneConfig, PruneOutcome, check_prunable, prune_model, save_outcome
from attnviz.prune.report import PruneReport
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
    "build_objective",
    "check_prunable",
    "compute_importance",
    "prune_model",
    "removal_mask",
    "save_outcome",
]
