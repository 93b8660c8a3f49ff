"""The whole pruning workflow, as the ``attnviz prune`` command runs it.

    load model -> score heads (objective, importance) -> choose heads (strategy)
    -> remove them physically (the model's remove_heads) -> measure before and after -> report
    -> write the checkpoint (the model's save_pruned)

:func:`prune_model` does everything but writing, so it is usable from Python
and testable without touching the disk; :func:`save_outcome` writes the result.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from attnviz.captures.images import ImageSource
from attnviz.common.display import NotebookDisplay
from attnviz.common.errors import ParameterError
from attnviz.common.parallel import SINGLE_PROCESS, DataParallel
from attnviz.common.progress import status
from attnviz.common.texts import load_texts
from attnviz.core import AttentionSite
from attnviz.models.base import LoadedModel, PrunedCopy
from attnviz.models.head_sets import RemovedHeads, layout_after, max_removable, removal_mask, total_heads
from attnviz.models.objective import Objective, Quality
from attnviz.models.physical import SitePlan
from attnviz.models.specs import load_model
from attnviz.prune.checkpoint import check_output_dir, model_source_paths
from attnviz.prune.choices import METHODS
from attnviz.prune.cost import forward_output, measure_latency, parameter_count
from attnviz.prune.export import LatencySummary, PruneReport, build_report
from attnviz.prune.judging import judging_batches, objectives_for
from attnviz.prune.strategy import PruneRun, PruneStrategy, default_steps, run_pruning


@dataclass
class PruneConfig:
    """Everything ``attnviz prune`` can be told, with its defaults."""

    ratio: float | None = None  # fraction of all heads to remove, in (0, 1)
    count: int | None = None  # number of heads to remove (instead of ratio)
    importance: str = "gradient"  # importance method: gradient, ablation, entropy, confidence or random
    strategy: PruneStrategy = field(default_factory=PruneStrategy)  # scope, iterative, steps, min_score
    seed: int = 0  # seeds random importance, the encoder objective's probes and a model's own examples
    normalize: bool | None = None  # per-layer ℓ2 normalisation of scores; None: the method's default
    batch_size: int | None = None  # examples per scoring / evaluation batch (None: 8 texts, 64 toy examples)
    max_tokens_per_batch: int | None = None  # padded tokens per text batch (None: no token limit)
    max_length: int | None = None  # truncate scoring and evaluation texts to this many tokens
    latency_tokens: int = 256  # length of the input the latency is measured on
    latency_repeats: int = 10  # timed rounds per model (the fastest is reported, with the range)
    probes: int = 8  # random output probes per batch (gradient importance of encoders)
    toy_examples: int = 256  # own examples drawn (toy tasks), for scoring and again for evaluation

    def validate(self) -> None:
        """Check the options on their own (before any model is loaded); raises :class:`InputError`."""
        if self.ratio is not None and self.count is not None:
            raise ParameterError("count", "give either {ratio} or {count}, not both")
        if self.ratio is None and self.count is None and self.strategy.min_score is None:
            raise ParameterError("ratio", "say how much to prune: {ratio} 0.3, {count} 20, or {min_score} 0.9")
        if self.ratio is not None and not 0 < self.ratio < 1:
            raise ParameterError(
                "ratio",
                f"{{ratio}} must be a fraction between 0 and 1 (exclusive), not {self.ratio}: e.g. 0.3",
                self.ratio,
            )
        if self.count is not None and self.count < 1:
            raise ParameterError("count", f"{{count}} must be at least 1, not {self.count}", self.count)
        if self.importance not in METHODS:
            raise ParameterError(
                "importance",
                f"unknown {{importance}} {self.importance!r}: use one of {', '.join(METHODS)}",
                self.importance,
            )
        for name in (
            "batch_size",
            "max_tokens_per_batch",
            "latency_tokens",
            "latency_repeats",
            "probes",
            "toy_examples",
        ):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ParameterError(
                    name, f"{{{name}}} must be at least 1, not {getattr(self, name)}", getattr(self, name)
                )
        self.strategy.validate()

    def judging_settings(self) -> dict[str, Any]:
        """What this configuration decides of the data heads are judged on: the settings of
        :func:`~attnviz.prune.judging.judging_batches`."""
        return {
            "own_examples": self.toy_examples,
            "batch_size": self.batch_size,
            "max_tokens_per_batch": self.max_tokens_per_batch,
            "max_length": self.max_length,
            "seed": self.seed,
        }

    def target_count(self, layout: dict[AttentionSite, int]) -> int:
        """How many heads to remove from a model with ``layout``; raises when impossible."""
        heads = total_heads(layout)
        limit = max_removable(layout)
        if self.count is not None:
            if self.count >= heads:
                raise ParameterError(
                    "count", f"{{count}} {self.count} is not less than the model's {heads} heads: give a smaller count"
                )
            if self.count > limit:
                raise ParameterError(
                    "count",
                    f"{{count}} {self.count} would empty a layer: at most {limit} of {heads} heads can be removed "
                    "while every layer keeps one",
                )
            return self.count
        if self.ratio is not None:
            count = round(self.ratio * heads)
            if count < 1:
                raise ParameterError(
                    "ratio", f"{{ratio}} {self.ratio} of {heads} heads removes no head: give a larger ratio"
                )
            if count > limit:
                raise ParameterError(
                    "ratio",
                    f"{{ratio}} {self.ratio} means {count} of {heads} heads, but at most {limit} can be removed "
                    "while every layer keeps one",
                )
            return count
        return limit  # only a minimum score: go as far as quality allows


@dataclass(repr=False)  # NotebookDisplay's short repr; notebooks show the HTML view
class PruneOutcome(NotebookDisplay):
    """What :func:`prune_model` produced."""

    report: PruneReport  # numbers for the terminal table and --json
    original: LoadedModel  # the model as loaded (unchanged)
    pruned: LoadedModel  # the physically pruned copy
    removed: RemovedHeads  # heads removed, in the original model's numbering
    plans: dict[AttentionSite, SitePlan] | None  # per-site slicing plan (Hugging Face models)
    run: PruneRun  # the strategy's decisions step by step


def effective_strategy(config: PruneConfig, layout: dict[AttentionSite, int], count: int) -> PruneStrategy:
    """The strategy as run: the default step count filled in (steps of 10% of the heads)."""
    if config.strategy.steps is None:
        return replace(config.strategy, steps=default_steps(layout, count))
    return config.strategy


def build_objectives(
    loaded: LoadedModel,
    config: PruneConfig,
    texts: Sequence[str] | None,
    eval_texts: Sequence[str] | None,
    parallel: DataParallel = SINGLE_PROCESS,
    *,
    images: Sequence[ImageSource] | None = None,
    eval_images: Sequence[ImageSource] | None = None,
) -> tuple[Objective, Objective]:
    """(scoring objective, evaluation objective); the evaluation data defaults to the scoring data.

    ``parallel``: in a data-parallel run each process scores and evaluates its share of the batches;
    ``images``, ``eval_images``: the data of a vision classifier (see :func:`~attnviz.prune.judging.judging_batches`).
    """
    scoring, evaluation = judging_batches(
        loaded, texts, eval_texts, images=images, eval_images=eval_images, **config.judging_settings()
    )
    return objectives_for(loaded, scoring, evaluation, probes=config.probes, seed=config.seed, parallel=parallel)


def check_prunable(loaded: LoadedModel) -> None:
    """Raise :class:`~attnviz.common.errors.UnsupportedModelError` unless ``loaded`` can be scored and pruned."""
    loaded.check_objective()
    loaded.check_head_removal()


def physically_prune(loaded: LoadedModel, removed: RemovedHeads) -> tuple[LoadedModel, dict | None]:
    """The physically pruned copy of ``loaded``, through the model's own head removal."""
    return loaded.remove_heads(removed)


#: numbers :func:`_check_and_time` gives (the main process measures; the others receive them)
CHECK_AND_TIME_FIELDS = 9


def _check_and_time(
    loaded: LoadedModel,
    pruned: LoadedModel,
    mask,
    config: PruneConfig,
    texts: Sequence[str] | None,
    eval_texts: Sequence[str] | None,
) -> list[float]:
    """[max |masked − pruned| output, tokens timed, fastest before, fastest after, slowest before,
    slowest after (ms), conclusive (0/1), sign test p, rounds] on one input.

    The physically pruned model must compute what the original computes with the same heads
    masked; the latency input is the model's :meth:`~attnviz.models.base.LoadedModel.timing_batch`.
    """
    latency_texts = list(texts or []) + list(eval_texts or [])  # vision models draw an image instead
    latency_batch = loaded.timing_batch(config.latency_tokens, texts=latency_texts, seed=config.seed)
    masked_output = forward_output(loaded, latency_batch, loaded.context(head_mask=mask))
    pruned_output = forward_output(pruned, latency_batch)
    max_abs_diff = float((masked_output - pruned_output).abs().max())
    latency = measure_latency(loaded, pruned, latency_batch, repeats=config.latency_repeats)
    tokens = int(latency_batch.lengths[0]) if latency_batch.tokens else 0
    return [
        max_abs_diff,
        float(tokens),
        latency.before.fastest,
        latency.after.fastest,
        latency.before.slowest,
        latency.after.slowest,
        float(latency.conclusive),
        latency.sign_test_p,
        float(latency.rounds),
    ]


def prune_model(
    loaded: LoadedModel,
    config: PruneConfig,
    *,
    texts: Sequence[str] | None = None,
    eval_texts: Sequence[str] | None = None,
    images: Sequence[ImageSource] | None = None,
    eval_images: Sequence[ImageSource] | None = None,
    parallel: DataParallel = SINGLE_PROCESS,
) -> PruneOutcome:
    """Score, choose and physically remove heads of ``loaded``; measure before and after.

    ``texts``: scoring data (ignored for toy models, which draw task examples; None: the shipped corpus);
    ``eval_texts``: held-out evaluation data (default: the scoring data);
    ``images``, ``eval_images``: the same for a vision classifier (paths, bytes or PIL images; a toy
    trained on an image task draws its own without them), judged by the KL divergence from its own
    predictions (:mod:`attnviz.models.vision_pruning`);
    ``parallel``: a data-parallel run's process (scores and qualities are summed over processes,
    so every process makes the same choices; only rank 0 should write the outcome).
    """
    config.validate()
    check_prunable(loaded)
    if texts is None and loaded.modality == "text":
        texts = load_texts()  # the shipped corpus: the scoring data and the latency input
    layout = loaded.layout()
    count = config.target_count(layout)
    strategy = effective_strategy(config, layout, count)
    scoring, evaluation = build_objectives(
        loaded, config, texts, eval_texts, parallel, images=images, eval_images=eval_images
    )

    with status("evaluating the unpruned model"):
        quality_before = evaluation.evaluate()
    run = run_pruning(
        scoring,
        layout,
        config.importance,
        count,
        strategy,
        seed=config.seed,
        normalize=config.normalize,
        evaluation=evaluation,
        quality_before=quality_before,
    )
    removed = run.removed
    with status("removing heads and measuring"):
        pruned, plans = physically_prune(loaded, removed)
        mask = removal_mask(layout, removed)
        quality_masked = evaluation.evaluate(mask)
        quality_after = evaluation.for_model(pruned).evaluate()
        # Measured by the main process alone while the others wait: the numbers describe the
        # models, not the data, and processes timing side by side would slow each other down.
        measured = _check_and_time(loaded, pruned, mask, config, texts, eval_texts) if parallel.is_main else None
        (max_abs_diff, latency_tokens, *latency) = parallel.from_main(measured, CHECK_AND_TIME_FIELDS)
    report = build_report(
        model=loaded.name,
        config=config,
        strategy=strategy,
        objective=scoring,
        evaluation=evaluation,
        run=run,
        layout=layout,
        layout_pruned=layout_after(layout, removed),
        plans=plans,
        quality_before=quality_before,
        quality_masked=quality_masked,
        quality_after=quality_after,
        params_before=parameter_count(loaded.model),
        params_after=parameter_count(pruned.model),
        latency=LatencySummary.from_numbers(latency),
        latency_tokens=int(latency_tokens),
        max_abs_diff=max_abs_diff,
    )
    return PruneOutcome(report=report, original=loaded, pruned=pruned, removed=removed, plans=plans, run=run)


def save_outcome(
    outcome: PruneOutcome, out: str | os.PathLike, *, source: str, transformers_copy: bool = False
) -> Path:
    """Write the pruned checkpoint of ``outcome`` to ``out`` (already checked by ``check_output_dir``).

    The model's own format (:meth:`~attnviz.models.base.LoadedModel.save_pruned`); ``transformers_copy``:
    also the copy plain transformers loads, where the format has one.
    """
    pruned = PrunedCopy(outcome.pruned, outcome.removed, outcome.plans)
    path, copy = outcome.original.save_pruned(out, pruned, source=source, transformers_copy=transformers_copy)
    outcome.report.transformers_copy = None if copy is None else str(copy)
    outcome.report.output = str(path)
    return path


def prune_checkpoint(
    checkpoint: str,
    out: str | os.PathLike,
    config: PruneConfig,
    *,
    force: bool = False,
    transformers_copy: bool = False,
    device: str = "auto",
    dtype: str = "auto",
    device_map: str | None = None,
    parallel: DataParallel = SINGLE_PROCESS,
    **data: Sequence | None,
) -> PruneOutcome:
    """``attnviz prune`` as one call: load ``checkpoint``, prune it by ``config``, write the result to ``out``.

    ``data``: the scoring and evaluation data of :func:`prune_model` (``texts``, ``eval_texts``, ``images``,
    ``eval_images``; without them the shipped corpus, or a model's own examples). ``out`` is checked against the model's own files once it is loaded (before anything is scored);
    under ``parallel`` every process loads and scores its share, and only the main process writes.
    The returned outcome's report names what was written.
    """
    config.validate()
    check_output_dir(out, force=force, inputs=model_source_paths(checkpoint))
    loaded = load_model(checkpoint, device=parallel.device_for(device), dtype=dtype, device_map=device_map)
    check_prunable(loaded)
    check_output_dir(out, force=force, inputs=model_source_paths(checkpoint, loaded))
    outcome = prune_model(loaded, config, parallel=parallel, **data)
    if parallel.is_main:  # every process chose the same heads; the main one writes
        save_outcome(outcome, out, source=checkpoint, transformers_copy=transformers_copy)
    return outcome


__all__ = [
    "PruneConfig",
    "PruneOutcome",
    "Quality",
    "check_prunable",
    "prune_checkpoint",
    "prune_model",
    "save_outcome",
]
