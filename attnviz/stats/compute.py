"""Running a model over a corpus with the streaming statistics observer attached."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch
from rich.progress import Progress

from attnviz.errors import InputError, ParameterError
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.identity import model_identity
from attnviz.reporting import progress_bar
from attnviz.stats.accumulator import StatisticsAccumulator
from attnviz.stats.result import HeadStatistics


def text_batches(
    loaded: LoadedModel,
    texts: Sequence[str],
    *,
    batch_size: int = 8,
    max_length: int | None = None,
    truncate: bool = True,
) -> Iterator[EncodedBatch]:
    """Encode ``texts`` in batches of similar length (longest first), so little compute goes to padding.

    The statistics are sums over query positions, so the order of examples does not change them.
    """
    if batch_size < 1:
        raise ParameterError("batch_size", f"{{batch_size}} must be at least 1, got {batch_size}", batch_size)
    order = sorted(range(len(texts)), key=lambda index: len(texts[index]), reverse=True)
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        batch = loaded.encode([texts[index] for index in chosen], max_length=max_length, truncate=truncate)
        for position, index in enumerate(chosen):
            if all(batch.special[position]):
                raise InputError(
                    f"text #{index + 1} ({_preview(texts[index])}) tokenises to nothing but special tokens: "
                    "remove it or give real words"
                )
        yield batch


def _preview(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def compute_statistics(
    loaded: LoadedModel,
    texts: Sequence[str] | None = None,
    *,
    batches: Iterable[EncodedBatch] | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
    local_window: int = 2,
    progress: bool = True,
    truncate: bool = True,
) -> HeadStatistics:
    """Per-head statistics of ``loaded`` over ``texts`` (or over ready-made ``batches``).

    The statistics are accumulated inside the attention core while each layer runs
    (see :mod:`attnviz.stats.accumulator`): no pattern is kept, and for long inputs not
    even one layer's full pattern exists at once.

    Args:
        loaded: the model.
        texts: examples to encode with ``loaded.encode`` in batches of ``batch_size``
            (padded, truncated to ``max_length`` tokens).
        batches: encoded batches to use instead of ``texts`` (toy models' task data).
        local_window: ``w`` of the ``local_ratio`` statistic.
        progress: show a progress bar over the examples.
        truncate: cut texts longer than the limit (with a warning) instead of refusing them.
    """
    if (texts is None) == (batches is None):
        raise InputError("give either texts or batches")
    if local_window < 0:
        raise ParameterError("local_window", f"{{local_window}} must be ≥ 0, got {local_window}", local_window)
    if texts is not None:
        texts = list(texts)
        if not texts:
            raise InputError("no text given: give at least one example")
        total: int | None = len(texts)
        batches = text_batches(loaded, texts, batch_size=batch_size, max_length=max_length, truncate=truncate)
    else:
        if not isinstance(batches, Iterator):
            batches = list(batches)
        total = None if isinstance(batches, Iterator) else sum(len(batch) for batch in batches)

    accumulator = StatisticsAccumulator(causal=loaded.causal, local_window=local_window)
    context = loaded.context([accumulator])
    with _progress(progress) as bar:
        task = bar.add_task(f"statistics · {loaded.name}", total=total, status="")
        for batch in batches:
            accumulator.begin_batch(batch)
            with torch.no_grad():
                loaded.forward(batch, context)
            bar.update(task, advance=len(batch), status=f"{accumulator.num_tokens} tokens")
    if accumulator.num_examples == 0:
        raise InputError("no examples to compute statistics on")
    stats = HeadStatistics.from_accumulator(accumulator, loaded.name)
    stats.identity = model_identity(loaded)
    return stats


def _progress(enabled: bool):
    """The shared progress bar, or a silent one."""
    return progress_bar() if enabled else Progress(disable=True)
