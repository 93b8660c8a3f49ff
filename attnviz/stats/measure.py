"""From model specs to flagged statistics: what ``attnviz stats`` measures, one checkpoint after another.

Each spec is loaded, measured over the given texts (without texts: the model's own
examples, as a toy model's task, or else the shipped corpus) and its heads flagged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnviz.common.errors import InputError
from attnviz.common.parallel import SINGLE_PROCESS, DataParallel
from attnviz.common.progress import status
from attnviz.common.texts import load_texts
from attnviz.core.choices import Weighting
from attnviz.models.base import LoadedModel
from attnviz.models.specs import load_model
from attnviz.models.vision import vision_model_of
from attnviz.stats.compute import compute_statistics
from attnviz.stats.detect import Detection, detect_heads
from attnviz.stats.result import HeadStatistics
from attnviz.stats.thresholds import Thresholds

__all__ = ["measure_checkpoints", "measure_model"]


def measure_checkpoints(
    specs: Sequence[str],
    texts: Sequence[str] | None = None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    device_map: str | None = None,
    parallel: DataParallel = SINGLE_PROCESS,
    stack: str | None = None,
    **measuring: Any,
) -> list[tuple[HeadStatistics, Detection]]:
    """``(statistics, flags)`` of every model in ``specs``, in order, each measured by :func:`measure_model`.

    ``measuring``: the options of :func:`measure_model` (``thresholds``, ``toy_examples``, ``seed``,
    ``local_window``, ``images``, ``by_position``, ``bucket_size``, ``weighting``) and of
    :func:`~attnviz.stats.compute.compute_statistics` (``batch_size``, ``max_tokens_per_batch``, ``max_length``,
    ``truncate``), given to every model alike. Without ``texts`` a model measures its own examples when it has
    them, else the shipped corpus. Under ``parallel`` each process loads its own copy on its device. ``stack``: the
    stack that will be shown; a model without it is refused as soon as it loads, before it runs.
    """
    results = []
    for spec in specs:
        with status(f"loading {spec}"):
            loaded = load_model(spec, device=parallel.device_for(device), dtype=dtype, device_map=device_map)
        if stack is not None and stack not in loaded.stacks():
            raise InputError(f"{loaded.name} has no {stack} attention; it has {', '.join(loaded.stacks())}")
        results.append(measure_model(loaded, texts, parallel=parallel, **measuring))
    return results


def measure_model(
    loaded: LoadedModel,
    texts: Sequence[str] | None = None,
    *,
    thresholds: Thresholds | None = None,
    toy_examples: int = 128,
    seed: int = 0,
    local_window: int = 2,
    parallel: DataParallel = SINGLE_PROCESS,
    progress: bool = True,
    images: Sequence | None = None,
    by_position: bool = False,
    bucket_size: int | None = None,
    weighting: Weighting = "weights",
    **batching,
) -> tuple[HeadStatistics, Detection]:
    """``(statistics, flags)`` of one loaded model: over ``images`` or ``texts``, else its own examples, else the corpus.

    ``weighting="norm"``: statistics of norm-based attention, rows renormalised (see ``compute_statistics``).
    """
    if images is None and texts is None and loaded.modality == "image":
        images = loaded.own_images(toy_examples, seed)  # the toy's own task images
        if images is None:
            raise InputError(f"{loaded.name} is a vision model: give it images to measure on")
    if images is not None and texts is not None and loaded.reads_pictures_in_text:  # each picture inside its text
        stats = compute_statistics(
            loaded, texts, images=images, local_window=local_window, parallel=parallel, progress=progress,
            weighting=weighting,
        )  # fmt: skip
        return stats, detect_heads(stats, thresholds)
    if images is not None:
        if texts is not None:
            raise InputError("give either images or texts to measure on, not both")
        vision_model_of(loaded)  # a text model is refused here, naming the models that read images
    elif texts is not None and loaded.modality == "image":
        raise InputError(f"{loaded.name} is a vision model: give it images to measure on, not text")
    own = loaded.own_examples(toy_examples, seed) if texts is None and images is None else None
    if own is not None:  # a toy's own task examples, ready encoded
        data, batching = None, {"batches": [own]}
    else:
        data = images if images is not None else texts if texts is not None else load_texts()
    stats = compute_statistics(
        loaded,
        data,
        local_window=local_window,
        parallel=parallel,
        progress=progress,
        by_position=by_position,
        bucket_size=bucket_size,
        weighting=weighting,
        **batching,
    )
    return stats, detect_heads(stats, thresholds)
