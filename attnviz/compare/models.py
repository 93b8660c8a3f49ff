"""Two models over the same texts, head by head: divergence of their patterns and of their statistics.

Both models read the same batches. Model A runs in a worker thread and hands over its patterns one
layer at a time; model B compares each block of its own patterns with A's as the core computes it
(:mod:`attnviz.compare.pairing`). The statistics of ``attnviz stats`` are accumulated for both
models in the same pass (:class:`~attnviz.stats.accumulator.StatisticsAccumulator`), so the corpus
is read once and no pattern is kept.

Patterns can only be compared where both tokenizers split a text into the same tokens: texts split
differently are left out (and counted); when no text is split the same way the comparison is refused.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence

from rich.progress import Progress

from attnviz.common.errors import InputError
from attnviz.common.progress import progress_bar, warn
from attnviz.common.texts import load_texts
from attnviz.common.wording import plural
from attnviz.compare.matching import head_pairs, match_heads
from attnviz.compare.pairing import DivergenceAccumulator, LayerRecorder, _Handoff, run_paired
from attnviz.compare.result import ModelComparison, build_comparison
from attnviz.core.attention import AttentionObserver
from attnviz.core.choices import Weighting
from attnviz.core.kernel import prepare_kernel
from attnviz.core.weighting import check_weighting, weighted_observers
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.batching import DEFAULT_MAX_EXAMPLES, encode_batch, plan_batches, token_lengths
from attnviz.models.identity import model_identity
from attnviz.models.specs import load_model
from attnviz.stats.accumulator import StatisticsAccumulator
from attnviz.stats.compute import compute_statistics
from attnviz.stats.result import HeadStatistics


def compare_models(
    a: LoadedModel | str,
    b: LoadedModel | str,
    texts: Sequence[str] | None = None,
    *,
    by_statistics: bool = False,
    batch_size: int | None = DEFAULT_MAX_EXAMPLES,
    max_tokens_per_batch: int | None = None,
    max_length: int | None = None,
    truncate: bool = True,
    local_window: int = 2,
    toy_examples: int = 128,
    seed: int = 0,
    progress: bool = True,
    weighting: Weighting = "weights",
) -> ModelComparison:
    """Compare ``a`` and ``b`` (loaded models or model specs) head by head over ``texts``.

    Without ``texts``: model A's own examples when it has some (a toy task), else the shipped corpus.
    Heads are matched by their original identity (pruned checkpoints record it); models whose layouts
    differ without such a record are refused unless ``by_statistics``, which compares the per-head
    statistics of the two models only (each on its own tokens; no divergence).

    Returns a :class:`~attnviz.compare.result.ModelComparison`: per head the mean Jensen–Shannon
    divergence (nats) and total variation between A's and B's attention over every query of every
    text, both models' statistics and their difference. ``weighting="norm"``: compare norm-based attention
    (``α_ij·‖f_h(x_j)‖``, :mod:`attnviz.core.weighting`) with every row renormalised to sum 1, divergences included.
    """
    check_weighting(weighting)
    model_a = a if isinstance(a, LoadedModel) else load_model(a)
    model_b = b if isinstance(b, LoadedModel) else load_model(b)
    names = (model_a.name, model_b.name)
    identity_a, identity_b = model_identity(model_a), model_identity(model_b)
    matches = match_heads(
        model_a.layout(), identity_a, model_b.layout(), identity_b, names=names, by_position=by_statistics
    )
    own = model_a.own_examples(toy_examples, seed) if texts is None else None
    corpus = None if own is not None else list(texts) if texts is not None else load_texts()
    if corpus is not None and not corpus:
        raise InputError("no text given: give at least one example")
    batching = {"batch_size": batch_size, "max_tokens_per_batch": max_tokens_per_batch, "max_length": max_length}
    if by_statistics:
        start = time.perf_counter()
        settings = {**batching, "weighting": weighting}
        stats_a, stats_b = (
            _statistics(model, corpus, toy_examples, seed, local_window, progress, truncate, settings)
            for model in (model_a, model_b)
        )
        seconds = time.perf_counter() - start
        count = stats_a.num_examples
        return build_comparison(
            matches,
            stats_a,
            stats_b,
            None,
            mode="statistics",
            texts_compared=count,
            seconds=seconds,
            weighting=weighting,
        )

    pairs = head_pairs(matches)
    sums_a = StatisticsAccumulator(causal=model_a.causal, local_window=local_window)
    sums_b = StatisticsAccumulator(causal=model_b.causal, local_window=local_window)
    recorder = LayerRecorder(pairs, _Handoff())
    divergence = DivergenceAccumulator(pairs)
    fused = prepare_kernel()  # a corpus pass, as in compute_statistics
    sides: list[tuple[LoadedModel, list[AttentionObserver]]] = [
        (model_a, [sums_a, recorder]),
        (model_b, [sums_b, divergence]),
    ]
    observers_a, observers_b = (
        weighted_observers(
            observers,
            weighting,
            model.head_output_projections() if weighting == "norm" else None,
            renormalise=True,
            cache=model.factor_cache,
        )
        for model, observers in sides
    )
    context_a = dataclasses.replace(model_a.context(observers_a), fused_softmax=fused)
    context_b = dataclasses.replace(model_b.context(observers_b), fused_softmax=fused)
    skipped: list[int] = []
    if own is not None:
        total = len(own)
        paired = _own_batches(model_a, model_b, toy_examples, seed, skipped)
    else:
        assert corpus is not None
        total = len(corpus)
        paired = _text_batches(model_a, model_b, corpus, skipped, truncate=truncate, **batching)
    start = time.perf_counter()
    with progress_bar() if progress else Progress(disable=True) as bar:
        task = bar.add_task(f"diff · {names[0]} → {names[1]}", total=total, status="")
        for batch_a, batch_b in paired:
            sums_a.begin_batch(batch_a)
            sums_b.begin_batch(batch_b)
            run_paired(model_a, batch_a, context_a, recorder, model_b, batch_b, context_b, divergence)
            bar.update(task, advance=len(batch_a), status=f"{sums_a.num_tokens} tokens")
    seconds = time.perf_counter() - start
    if sums_a.num_examples == 0:
        raise InputError(
            f"{names[0]} and {names[1]} split none of the {plural(total, 'text')} into the same tokens: their patterns "
            "cannot be compared position by position. Compare their per-head statistics only with --by-statistics "
            "(compare_models(..., by_statistics=True))"
        )
    if skipped:
        warn(
            f"{len(skipped)} of {plural(total, 'text')} were left out: {names[0]} and {names[1]} split them into different "
            "tokens, so their patterns cannot be compared position by position"
        )
    result_a = _statistics_result(sums_a, model_a, names[0])
    result_b = _statistics_result(sums_b, model_b, names[1])
    head_at = {(m.site, m.a_position): m.head for m in matches if m.status == "matched"}
    divergences = {}
    for site, pair in pairs.items():
        count = max(divergence.counts.get(site, 0), 1)
        js, tv = divergence.js_sums.get(site), divergence.tv_sums.get(site)
        for index, position in enumerate(pair.a_index):
            divergences[(site, head_at[(site, position)])] = (
                float("nan") if js is None else float(js[index]) / count,
                float("nan") if tv is None else float(tv[index]) / count,
            )
    return build_comparison(
        matches,
        result_a,
        result_b,
        divergences,
        mode="patterns",
        texts_compared=sums_a.num_examples,
        texts_skipped=len(skipped),
        seconds=seconds,
        weighting=weighting,
    )


def _statistics(model, corpus, toy_examples, seed, local_window, progress, truncate, batching) -> HeadStatistics:
    """One model's statistics over the corpus, or over its own examples when there is no corpus."""
    if corpus is None:
        own = model.own_examples(toy_examples, seed)
        if own is None:
            raise InputError(f"{model.name} has no examples of its own: give texts to compare on")
        return compute_statistics(
            model, batches=[own], local_window=local_window, progress=progress, weighting=batching["weighting"]
        )
    return compute_statistics(
        model,
        corpus,
        local_window=local_window,
        progress=progress,
        truncate=truncate,
        batch_size=batching["batch_size"],
        max_tokens_per_batch=batching["max_tokens_per_batch"],
        max_length=batching["max_length"],
        weighting=batching["weighting"],
    )


def _statistics_result(accumulator: StatisticsAccumulator, model: LoadedModel, name: str) -> HeadStatistics:
    stats = HeadStatistics.from_accumulator(accumulator, name)
    stats.identity = model_identity(model)
    return stats


def _text_batches(
    model_a: LoadedModel,
    model_b: LoadedModel,
    texts: list[str],
    skipped: list[int],
    *,
    batch_size: int | None,
    max_tokens_per_batch: int | None,
    max_length: int | None,
    truncate: bool,
) -> Iterator[tuple[EncodedBatch, EncodedBatch]]:
    """The batches of ``stats`` (planned on A's lengths), encoded by each model; texts split differently are left
    out and their indices appended to ``skipped``."""
    lengths = token_lengths(model_a, texts, max_length)
    for chosen in plan_batches(lengths, max_tokens=max_tokens_per_batch, max_examples=batch_size):
        batch_a = encode_batch(model_a, texts, chosen, max_length=max_length, truncate=truncate)
        batch_b = encode_batch(model_b, texts, chosen, max_length=max_length, truncate=truncate)
        same = [i for i in range(len(chosen)) if batch_a.tokens[i] == batch_b.tokens[i]]
        if len(same) < len(chosen):
            skipped.extend(chosen[i] for i in range(len(chosen)) if i not in same)
            if not same:
                continue
            kept = [chosen[i] for i in same]
            batch_a = encode_batch(model_a, texts, kept, max_length=max_length, truncate=truncate)
            batch_b = encode_batch(model_b, texts, kept, max_length=max_length, truncate=truncate)
        yield batch_a, batch_b


def _own_batches(
    model_a: LoadedModel, model_b: LoadedModel, toy_examples: int, seed: int, skipped: list[int]
) -> Iterator[tuple[EncodedBatch, EncodedBatch]]:
    """A toy model's own task examples, drawn with the same seed for both models (they must agree token for token)."""
    batch_a = model_a.own_examples(toy_examples, seed)
    batch_b = model_b.own_examples(toy_examples, seed)
    if batch_a is None or batch_b is None or batch_a.tokens != batch_b.tokens:
        raise InputError(
            f"{model_a.name} and {model_b.name} do not draw the same task examples: give texts both can read "
            "(--data or --text), or compare their statistics only with --by-statistics"
        )
    yield batch_a, batch_b
