"""Running a model over a corpus with the streaming statistics observer attached.

Texts are batched by token count (:mod:`attnviz.models.batching`); in a data-parallel run
(:mod:`attnviz.common.parallel`) every process takes its share of the batches and the
sufficient statistics are summed across processes at the end.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
from rich.progress import Progress

from attnviz.common.errors import InputError, ParameterError, UnsupportedModelError
from attnviz.common.images import ImageSource
from attnviz.common.parallel import SINGLE_PROCESS, DataParallel
from attnviz.common.progress import progress_bar
from attnviz.common.wording import plural
from attnviz.core.choices import Weighting
from attnviz.core.kernel import prepare_kernel
from attnviz.core.weighting import check_weighting, weighted_observers
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.batching import DEFAULT_MAX_EXAMPLES, encode_batch, plan_batches, token_lengths
from attnviz.models.identity import model_identity
from attnviz.models.vision import vision_model_of
from attnviz.stats.accumulator import StatisticsAccumulator
from attnviz.stats.by_position import PositionSums, check_bucket_size
from attnviz.stats.carriers import TokenCarriers
from attnviz.stats.result import HeadStatistics
from attnviz.stats.vision_language import ImageTokenShare


def compute_statistics(
    loaded: LoadedModel,
    data: Sequence | None = None,
    *,
    texts: Sequence[str] | None = None,
    batches: Iterable[EncodedBatch] | None = None,
    batch_size: int | None = DEFAULT_MAX_EXAMPLES,
    max_tokens_per_batch: int | None = None,
    max_length: int | None = None,
    local_window: int = 2,
    progress: bool = True,
    truncate: bool = True,
    parallel: DataParallel = SINGLE_PROCESS,
    by_position: bool = False,
    bucket_size: int | None = None,
    weighting: Weighting = "weights",
    images: Sequence[ImageSource] | None = None,
) -> HeadStatistics:
    """Per-head statistics of ``loaded`` over ``data``: texts, or for a vision model or captioner images (or over
    ready-made ``batches``).

    The statistics are accumulated inside the attention core while each layer runs
    (see :mod:`attnviz.stats.accumulator`): no pattern is kept, and for long inputs not
    even one layer's full pattern exists at once.

    Args:
        loaded: the model.
        data: texts to encode with ``loaded.encode``, longest first, in batches of at most
            ``batch_size`` examples and ``max_tokens_per_batch`` padded tokens (truncated to
            ``max_length`` tokens); for a vision model or captioner, images (paths, bytes, PIL images or
            arrays), read ``batch_size`` at a time (:func:`attnviz.stats.images.compute_image_statistics`). An audio
            model (Whisper) is refused: each input would be mostly the padding of its 30 s window.
        texts: the earlier name of ``data`` (deprecated).
        batches: encoded batches to use instead of ``texts`` (toy models' task data).
        local_window: ``w`` of the ``local_ratio`` statistic.
        progress: show a progress bar over the examples.
        truncate: cut texts longer than the limit (with a warning) instead of refusing them.
        parallel: this process's share of a data-parallel run; the result is the same on
            every process and equals a one-process run.
        by_position: also reduce each head by query position, in buckets of ``bucket_size``
            positions (the result's ``by_position``, :mod:`attnviz.stats.by_position`).
        bucket_size: width of those buckets; None: the smallest power of two ≥ 16 that gives at
            most 32 buckets over the longest input (256 at 8,192 tokens). Given without
            ``by_position``, it is refused.
        weighting: ``"weights"`` measures the softmax weights; ``"norm"`` measures norm-based attention,
            each weight times the norm of the transformed value vector it moves (``α_ij·‖f_h(x_j)‖``,
            :mod:`attnviz.core.weighting`), with every row renormalised to sum 1 so that entropy,
            max weight and the masses keep their meaning.
        images: one picture per text, for a vision-language model (paths, bytes, PIL images or arrays): each text
            is read with its picture in it (:mod:`attnviz.captures.vision_language`), one example per batch, and
            the result's ``picture`` says how much each head's text queries read the picture
            (:mod:`attnviz.stats.vision_language`).

    Where the model's output projections can be cut by head (BERT-, GPT-2- and LLaMA-style models, toy
    models), the result also says what each token carries (``carriers``, :mod:`attnviz.stats.carriers`).

    The result records the wall time of the pass (``seconds``) and so its throughput.
    """
    if loaded.modality == "audio":
        raise UnsupportedModelError(
            f"{loaded.name} reads audio: statistics are measured over texts or images, not audio (every input fills "
            "a 30 s window mostly of padding); capture each file instead: attnviz.capture(model, 'clip.wav')"
        )
    if texts is not None:
        warnings.warn("compute_statistics(texts=...) is now compute_statistics(model, data)", DeprecationWarning, 2)
        data = texts if data is None else data
    pictures_alone = (  # a vision-language model given pictures without texts: its vision tower's statistics
        loaded.reads_pictures_in_text and images is None and data is not None and batches is None
        and not any(isinstance(item, str) for item in data)
    )  # fmt: skip
    if (loaded.modality == "image" or pictures_alone) and batches is None:
        return _image_statistics(loaded, data, batch_size, progress and parallel.is_main, by_position, weighting)
    texts = data
    if (texts is None) == (batches is None):
        raise InputError("give either texts or batches")
    if local_window < 0:
        raise ParameterError("local_window", f"{{local_window}} must be ≥ 0, got {local_window}", local_window)
    if bucket_size is not None and not by_position:
        raise ParameterError(
            "bucket_size",
            "{bucket_size} sets the width of the by-position buckets: ask for them with {by_position}",
            bucket_size,
        )
    check_bucket_size(bucket_size)
    check_weighting(weighting)
    longest: int | None = None  # tokens of the longest input, when known before the pass
    pictures = None
    if images is not None:
        texts, batches, pictures = None, _picture_batches(loaded, texts, images), ImageTokenShare()
    if texts is not None:
        texts = list(texts)
        if not texts:
            raise InputError("no text given: give at least one example")
        if not all(isinstance(text, str) for text in texts):
            vision_model_of(loaded)  # images for a text model: refused, naming the models that read them
            raise TypeError(f"{loaded.name} reads text: give a list of texts")
        lengths = token_lengths(loaded, texts, max_length)
        plan = plan_batches(lengths, max_tokens=max_tokens_per_batch, max_examples=batch_size)
        longest = max(lengths)
        mine = [plan[index] for index in parallel.shard([len(chosen) * lengths[chosen[0]] for chosen in plan])]
        batch_count: int | None = len(mine)
        batches = (encode_batch(loaded, texts, chosen, max_length=max_length, truncate=truncate) for chosen in mine)
    else:
        assert batches is not None  # one of the two is given (checked above)
        if not isinstance(batches, Iterator) or parallel.distributed:
            batches = list(batches)
            longest = max((_longest(batch) for batch in batches), default=None)
            batches = [batches[index] for index in parallel.shard([_padded_tokens(batch) for batch in batches])]
        batch_count = None if isinstance(batches, Iterator) else len(batches)

    positions = PositionSums(bucket_size, longest) if by_position else None
    accumulator = StatisticsAccumulator(causal=loaded.causal, local_window=local_window, by_position=positions)
    projections = _output_projections(loaded, required=weighting == "norm")
    # the norms' factors depend on the weights alone: a later call on the same model reuses them (a fixed cost per
    # call of ~25 ms on SmolLM2 on the CPU, growing with layers · heads · head size² · width)
    cache = loaded.factor_cache
    carriers = TokenCarriers(projections, cache=cache) if projections is not None else None
    observers = weighted_observers([accumulator], weighting, projections, renormalise=True, cache=cache)
    observers += [carriers] if carriers is not None else []
    observers += [pictures] if pictures is not None else []
    # A corpus pass is where the fused kernel pays for its one-time build (see attnviz.core.kernel).
    # On a GPU the pass runs the Triton tile kernel (attnviz.core.triton_rows) where Triton is installed.
    fused = prepare_kernel() or loaded.device.type == "cuda"
    # progress steps are attention layers passed (a long text is one forward pass of minutes): batches × sites
    sites = len(loaded.layout()) if progress and parallel.is_main else 0
    start = time.perf_counter()
    # a model the user wrapped switches onto the core once for the whole pass, not once per batch
    with _progress(progress and parallel.is_main) as bar, loaded.running():
        steps = None if batch_count is None else batch_count * sites
        task = bar.add_task(f"statistics · {loaded.name} · layers", total=steps, status="")
        if sites:
            observers.append(_LayerProgress(lambda: bar.advance(task)))
        context = dataclasses.replace(loaded.context(observers), fused_softmax=fused)
        for batch in batches:
            accumulator.begin_batch(batch)
            if carriers is not None:
                carriers.begin_batch(batch)
            if pictures is not None:
                pictures.begin_batch(batch)
            with torch.no_grad():
                loaded.forward(batch, context)
            bar.update(
                task,
                status=f"{plural(accumulator.num_examples, 'example')} · {plural(accumulator.num_tokens, 'token')}",
            )
    if parallel.distributed:
        accumulator.merge_across(parallel, loaded.layout())
        if carriers is not None:
            carriers.merge_across(parallel, loaded.layout())
    _synchronize(loaded)
    seconds = time.perf_counter() - start
    if accumulator.num_examples == 0:
        raise InputError("no examples to compute statistics on")
    stats = HeadStatistics.from_accumulator(accumulator, loaded.name, seconds=seconds, processes=parallel.world_size)
    stats.identity = model_identity(loaded)
    stats.weighting = weighting
    stats.carriers = carriers.result() if carriers is not None else None
    stats.picture = pictures.result() if pictures is not None else None
    if stats.picture is not None and not stats.picture.queries:  # no picture among the text's tokens (Mllama)
        stats.picture = None
    return stats


def _picture_batches(loaded: LoadedModel, texts: Sequence[str] | None, images: Sequence[ImageSource]):
    """One batch per text with its picture in it (each read when its batch comes); one picture per text."""
    from attnviz.captures.vision_language import vision_language_batch

    texts, images = list(texts or []), list(images)
    if not texts or len(texts) != len(images):
        raise InputError(
            f"give one text per picture ({plural(len(texts), 'text')}, {plural(len(images), 'picture')}): a vision-language model reads "
            "each picture inside its text"
        )
    vision_language_batch(loaded, texts[:1], images[:1])  # a model that reads no pictures in text is refused now
    return (vision_language_batch(loaded, [text], [image]) for text, image in zip(texts, images))


def _output_projections(loaded: LoadedModel, *, required: bool) -> dict | None:
    """Each head's output-projection slice, or None where the model's layout is unknown and they are optional."""
    try:
        return loaded.head_output_projections()
    except UnsupportedModelError:
        if required:
            raise
        return None


class _LayerProgress:
    """An observer that calls ``step`` once per attention site as the forward pass reaches it (progress)."""

    accepts_key_prefix = True  # reads nothing: the core hands it its reused block, no copy
    accepts_summary_only = True  # nor a pattern at all (the core may pass None)

    def __init__(self, step: Callable[[], None]) -> None:
        self.step = step
        self.site = None

    def observe(self, site, pattern, query_start) -> None:
        if site != self.site or query_start == 0:
            self.site = site
            self.step()


def _image_statistics(
    loaded: LoadedModel, images: Sequence | None, batch_size: int | None, progress: bool, by_position: bool, weighting
) -> HeadStatistics:
    """The statistics of a vision model or captioner over ``images`` (:mod:`attnviz.stats.images`)."""
    from attnviz.stats.images import compute_image_statistics

    if images is None:
        raise InputError(f"{loaded.name} is a vision model: give it images to measure on")
    if by_position:
        raise InputError("statistics by position are for text: images have no reading order")
    if weighting != "weights":
        raise InputError("norm-based statistics are for text models: measure images by their weights")
    return compute_image_statistics(loaded, images, batch_size=batch_size or DEFAULT_MAX_EXAMPLES, progress=progress)


def _longest(batch: EncodedBatch) -> int:
    """Tokens of the batch's longest sequence, source or target."""
    return max([*batch.lengths, *(batch.target_lengths or [])], default=1)


def _padded_tokens(batch: EncodedBatch) -> int:
    """Positions a batch computes on, padding included: the cost that balances processes."""
    return len(batch) * max(batch.lengths, default=0)


def _synchronize(loaded: LoadedModel) -> None:
    """Wait for queued GPU work, so the wall time covers it."""
    if torch.cuda.is_available() and loaded.device.type == "cuda":
        torch.cuda.synchronize()


def _progress(enabled: bool):
    """The shared progress bar, or a silent one."""
    return progress_bar() if enabled else Progress(disable=True)
