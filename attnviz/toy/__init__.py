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

from attnviz.common.lazy import lazy_exports

if TYPE_CHECKING:  # for type checkers and IDEs; at run time each name is imported on first use
    from attnviz.toy.checkpoint import checkpoint_series, load_toy_model, save_toy_model
    from attnviz.toy.config import ARCHITECTURES, VARIANT_NAMES, ToyConfig
    from attnviz.toy.loaded import ToyModel
    from attnviz.toy.pruning import prune_toy_heads
    from attnviz.toy.solutions import solution_scores
    from attnviz.toy.tasks import TASKS, get_task
    from attnviz.toy.training import TrainingSettings, build_toy_model, train_toy_model

#: public name -> module that defines it
_EXPORTS = {
    "ARCHITECTURES": "attnviz.toy.config",
    "TASKS": "attnviz.toy.tasks",
    "VARIANT_NAMES": "attnviz.toy.config",
    "ToyConfig": "attnviz.toy.config",
    "ToyModel": "attnviz.toy.loaded",
    "TrainingSettings": "attnviz.toy.training",
    "build_toy_model": "attnviz.toy.training",
    "checkpoint_series": "attnviz.toy.checkpoint",
    "get_task": "attnviz.toy.tasks",
    "load_toy_model": "attnviz.toy.checkpoint",
    "prune_toy_heads": "attnviz.toy.pruning",
    "save_toy_model": "attnviz.toy.checkpoint",
    "solution_scores": "attnviz.toy.solutions",
    "train_toy_model": "attnviz.toy.training",
}

__all__ = [
    "ARCHITECTURES",
    "TASKS",
    "VARIANT_NAMES",
    "ToyConfig",
    "ToyModel",
    "TrainingSettings",
    "build_toy_model",
    "checkpoint_series",
    "get_task",
    "load_toy_model",
    "prune_toy_heads",
    "save_toy_model",
    "solution_scores",
    "train_toy_model",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
