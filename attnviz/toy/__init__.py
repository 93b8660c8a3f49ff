"""attnviz's own toy transformers: every attention variant, synthetic tasks with known solutions, training.

* :mod:`.config` — :class:`ToyConfig`, the one architecture dataclass;
* :mod:`.variants` — the attention variants as pattern functions for :func:`attnviz.core.attend`;
* :mod:`.model` — the encoder / decoder / encoder-decoder transformer;
* :mod:`.tokenizer`, :mod:`.tasks` — symbols, and the tasks (copy, reverse, sort, previous-token, induction);
* :mod:`.loaded` — :class:`ToyModel`, the :class:`~attnviz.models.base.LoadedModel` with task batches and metrics;
* :mod:`.training`, :mod:`.checkpoint`, :mod:`.pruning` — train, save / load, remove heads;
* :mod:`.solutions` — how closely each head follows its task's known attention solution.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz.common.lazy import exports_by_module, lazy_exports

if TYPE_CHECKING:  # for type checkers and IDEs; at run time each name is imported on first use
    from attnviz.toy.checkpoint import checkpoint_series as checkpoint_series
    from attnviz.toy.checkpoint import load_toy_model as load_toy_model
    from attnviz.toy.checkpoint import save_toy_model as save_toy_model
    from attnviz.toy.config import ARCHITECTURES as ARCHITECTURES
    from attnviz.toy.config import VARIANT_NAMES as VARIANT_NAMES
    from attnviz.toy.config import ToyConfig as ToyConfig
    from attnviz.toy.loaded import ToyModel as ToyModel
    from attnviz.toy.pruning import prune_toy_heads as prune_toy_heads
    from attnviz.toy.solutions import solution_scores as solution_scores
    from attnviz.toy.tasks import TASKS as TASKS
    from attnviz.toy.tasks import get_task as get_task
    from attnviz.toy.training import TrainingSettings as TrainingSettings
    from attnviz.toy.training import build_toy_model as build_toy_model
    from attnviz.toy.training import train_toy_model as train_toy_model

#: public name -> module that defines it
_EXPORTS = exports_by_module(
    {
        "attnviz.toy.checkpoint": ("checkpoint_series", "load_toy_model", "save_toy_model"),
        "attnviz.toy.config": ("ARCHITECTURES", "VARIANT_NAMES", "ToyConfig"),
        "attnviz.toy.loaded": ("ToyModel",),
        "attnviz.toy.pruning": ("prune_toy_heads",),
        "attnviz.toy.solutions": ("solution_scores",),
        "attnviz.toy.tasks": ("TASKS", "get_task"),
        "attnviz.toy.training": ("TrainingSettings", "build_toy_model", "train_toy_model"),
    }
)

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
