"""The data a pruning run judges heads on, and the objectives over it.

Which loss judges a model's heads is the model's own business
(:meth:`attnviz.models.base.LoadedModel.objective`, :mod:`attnviz.models.objective`);
this module decides the data: the model's own examples where it has some (a toy
model's task, drawn fresh with the run's seed), else the texts the caller gives (the
shipped corpus by default). Vision models are judged on images: the caller's, else those
of their own task (``toy-odd-patch``); text is refused for them, as images are for text models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from attnviz.captures.images import ImageSource, image_batches
from attnviz.common.errors import ParameterError
from attnviz.common.parallel import SINGLE_PROCESS, DataParallel
from attnviz.common.texts import load_texts
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.batching import token_batches
from attnviz.models.objective import Objective
from attnviz.models.vision import vision_model_of

#: examples per batch when none is given: own examples (small toy tasks), texts and images
OWN_EXAMPLES_PER_BATCH = 64
TEXTS_PER_BATCH = 8
IMAGES_PER_BATCH = 16


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


def image_judging_batches(
    loaded: LoadedModel, images: Sequence[ImageSource], *, batch_size: int | None
) -> list[EncodedBatch]:
    """``images`` (paths, bytes or PIL images) read and encoded in batches of ``batch_size`` (default 16).

    Only the pixel values are judged: the pictures as displayed are not kept (half the memory).
    """
    vision = vision_model_of(loaded)
    if not images:
        raise ParameterError("images", "no image to judge heads on: give images with {images}")
    return [replace(batch, images=None) for batch in image_batches(vision, images, batch_size or IMAGES_PER_BATCH)]


def _vision_batches(
    loaded: LoadedModel,
    images: Sequence[ImageSource] | None,
    eval_images: Sequence[ImageSource] | None,
    *,
    own_examples: int,
    batch_size: int | None,
    seed: int,
) -> tuple[list[EncodedBatch], list[EncodedBatch]]:
    """(scoring, evaluation) batches of a vision model: ``images``, else ``own_examples`` of its own task."""
    if images is None:
        size = batch_size or OWN_EXAMPLES_PER_BATCH
        images = loaded.own_images(own_examples, seed)
        if images is None:
            raise ParameterError(
                "images", f"{loaded.name} is a vision model: give images to judge its heads on with {{images}}"
            )
        if eval_images is None:  # held out: as many drawn with the next seed
            eval_images = loaded.own_images(own_examples, seed + 1)
    else:
        size = batch_size or IMAGES_PER_BATCH
    scoring = image_judging_batches(loaded, images, batch_size=size)
    return scoring, (scoring if eval_images is None else image_judging_batches(loaded, eval_images, batch_size=size))


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
    images: Sequence[ImageSource] | None = None,
    eval_images: Sequence[ImageSource] | None = None,
) -> tuple[list[EncodedBatch], list[EncodedBatch]]:
    """(scoring batches, evaluation batches) for ``loaded``.

    A text model with its own examples is scored on ``own_examples`` of them drawn with ``seed`` and
    evaluated on as many drawn with ``seed + 1`` (``texts`` are not used). Otherwise the texts are
    encoded (``None``: the shipped corpus); without ``eval_texts`` the evaluation batches are the scoring
    batches (the same list). A vision model reads ``images`` (and ``eval_images``) the same way, its own
    task's images standing in for them when it has a task; it refuses text, and a text model refuses images.
    """
    if loaded.modality == "image":
        if texts is not None or eval_texts is not None:
            raise ParameterError(
                "texts",
                f"{loaded.name} is a vision model: its heads are judged on images, not text: give images with "
                "{images} instead of {texts}",
            )
        return _vision_batches(loaded, images, eval_images, own_examples=own_examples, batch_size=batch_size, seed=seed)
    if images is not None or eval_images is not None:
        raise ParameterError(
            "images" if images is not None else "eval_images",
            f"{loaded.name} is a text model: images need a vision classifier (ViT, DeiT, DINOv2 or toy-odd-patch); "
            "judge a text model on text with {texts}",
        )
    size = batch_size or OWN_EXAMPLES_PER_BATCH
    scoring = loaded.own_example_batches(own_examples, batch_size=size, seed=seed)
    if scoring is not None:
        evaluation = loaded.own_example_batches(own_examples, batch_size=size, seed=seed + 1)
        return scoring, evaluation if evaluation is not None else scoring
    if texts is None:
        texts = load_texts()  # the shipped corpus
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
    scoring_objective = loaded.objective(scoring, probes=probes, seed=seed, parallel=parallel)
    scoring_objective.check_enough_data("scoring data")
    if evaluation is scoring:
        return scoring_objective, scoring_objective
    evaluation_objective = loaded.objective(evaluation, probes=probes, seed=seed, parallel=parallel)
    evaluation_objective.check_enough_data("evaluation data")
    return scoring_objective, evaluation_objective
