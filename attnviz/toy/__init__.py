"""attnviz's own toy transformers: every attention variant, synthetic tasks with known solutions, training.

* :mod:`.config` — :class:`ToyConfig`, the one architecture dataclass;
* :mod:`.variants` — the attention variants as pattern functions for :func:`attnviz.core.attend`;
* :mod:`.model` — the encoder / decoder / encoder-decoder transformer;
* :mod:`.tokenizer`, :mod:`.tasks` — symbols, and the tasks (copy, reverse, sort, previous-token, induction);
* :mod:`.loaded` — :class:`ToyModel`, the :class:`~attnviz.models.base.LoadedModel` with task batches and metrics;
* :mod:`.training`, :mod:`.checkpoint`, :mod:`.pruning` — train, save / load, remove heads;
* :mod:`.solutions` — how closely each head follows its task's known attention solution.
"""

from attnviz.toy.checkpoint import checkpoint_series, load_toy_model, save_toy_model
from attnviz.toy.config import ARCHITECTURES, VARIANT_NAMES, ToyConfig
from attnviz.toy.loaded import ToyModel
from attnviz.toy.pruning import prune_toy_heads
from attnviz.toy.solutions import solution_scores
from attnviz.toy.tasks import TASKS, get_task
from attnviz.toy.training import TrainingSettings, build_toy_model, train_toy_model

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
