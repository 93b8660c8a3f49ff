"""The data a pruning run judges heads on, and the objectives over it.

Which loss judges a model's heads is the model's own business
(:meth:`attnviz.models.base.LoadedModel.objective`, :mod:`attnviz.models.objective`);
this module decides the data: the model's own examples where it has some (a toy
model's task, drawn fresh with the run's seed), else the texts the caller gives.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnviz.common.errors import ParameterError
from attnviz.common.parallel import SINGLE_PROCESS, DataParallel
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.batching import token_batches
from attnviz.models.objective import Objective

#: examples per batch when none is given: own examples (small toy tasks) and texts
OWN_EXAMPLES_PER_BATCH = 64
TEXTS_PER_BATCH = 8


def text_batches(
    loaded: LoadedModel,
    texts: Sequence[str],
    *,
    batch_size: int | None = TEXTS_PER_BATCH,
    max_tokens_per_batch: int | None = None,
    max_length: int | None = None,
) -> list[EncodedBatch]:
    """Encode ``texts`` with the shared token-count batcher (:func:`attnviz.models.batching.token_batches`).

    Longest first, at most ``batch_size`` examples and ``max_tokens_per_batch`` padded tokens per batch.
    """
    texts = [text for text in texts if text.strip()]
    if not texts:
        raise ParameterError("texts", "no text to score heads on: give text with {texts}")
    return list(
        token_batches(loaded, texts, max_tokens=max_tokens_per_batch, max_examples=batch_size, max_length=max_length)
    )


def judging_batches(
    loaded: LoadedModel,
    texts: Sequence[str] | None,
    eval_texts: Sequence[str] | None,
    *,
    own_examples: int,
    batch_size: int | None,
    max_tokens_per_batch: int | None,
    max_length: int | None,
    seed: int,
) -> tuple[list[EncodedBatch], list[EncodedBatch]]:
    """(scoring batches, evaluation batches) for ``loaded``.

    A model with its own examples is scored on ``own_examples`` of them drawn with ``seed`` and
    evaluated on as many drawn with ``seed + 1`` (``texts`` are not used). Otherwise the texts are
    encoded; without ``eval_texts`` the evaluation batches are the scoring batches (the same list).
    """
    size = batch_size or OWN_EXAMPLES_PER_BATCH
    scoring = loaded.own_example_batches(own_examples, batch_size=size, seed=seed)
    if scoring is not None:
        evaluation = loaded.own_example_batches(own_examples, batch_size=size, seed=seed + 1)
        return scoring, evaluation
    if not texts:
        raise ParameterError("texts", "no text to score heads on: give text with {texts}")
    batching = {
        "batch_size": batch_size or TEXTS_PER_BATCH,
        "max_tokens_per_batch": max_tokens_per_batch,
        "max_length": max_length,
    }
    scoring = text_batches(loaded, texts, **batching)
    return scoring, (scoring if not eval_texts else text_batches(loaded, eval_texts, **batching))


def objectives_for(
    loaded: LoadedModel,
    scoring: list[EncodedBatch],
    evaluation: list[EncodedBatch],
    *,
    probes: int,
    seed: int,
    parallel: DataParallel = SINGLE_PROCESS,
) -> tuple[Objective, Objective]:
    """(scoring objective, evaluation objective), one object when the batches are the same list.

    Raises :class:`~attnviz.common.errors.ParameterError` when either has too little data to judge heads on.
    """
    common = {"probes": probes, "seed": seed, "parallel": parallel}
    scoring_objective = loaded.objective(scoring, **common)
    scoring_objective.check_enough_data("scoring data")
    if evaluation is scoring:
        return scoring_objective, scoring_objective
    evaluation_objective = loaded.objective(evaluation, **common)
    evaluation_objective.check_enough_data("evaluation data")
    return scoring_objective, evaluation_objective
