"""Which heads to remove: ranking by importance, globally or per layer, in one shot or iteratively.

* scope ``global``: the least important heads of the whole model go first
  (importance must then be comparable across layers — gradient scores are
  normalised per layer for that reason); ``per-layer``: every layer loses the
  same share of its heads, its own least important ones.
* one-shot: heads are scored once and removed in ranking order;
  iterative (Michel et al.): the target is reached in ``steps`` steps — by
  default steps of 10% of all heads, as in the paper — and the remaining heads
  are re-scored, with the removed ones masked, after each step.
* never every head of a layer: a layer always keeps at least one head.
* ``min_score``: after each step the quality on the evaluation data is checked;
  the step that would bring it below ``min_score`` × the original is not taken
  and pruning stops there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from attnviz.common.errors import InputError, ParameterError
from attnviz.common.progress import progress_bar
from attnviz.core import AttentionSite
from attnviz.models.head_sets import RemovedHeads, count_removed, max_removable, merge_removed, removal_mask
from attnviz.models.objective import Objective, Quality
from attnviz.prune.choices import SCOPES
from attnviz.prune.importance import HeadImportance, Scores, compute_importance, scoring_passes


@dataclass
class PruneStrategy:
    """How the heads to remove are chosen."""

    scope: str = "global"  # "global": rank heads across all layers; "per-layer": the same share from each layer
    iterative: bool = False  # re-score the remaining heads after each step (Michel et al.) instead of once
    steps: int | None = None  # steps to the target (re-scoring / min_score checks); None: 10% of the heads per step
    min_score: float | None = None  # stop before quality drops below this fraction of the original (0 < f ≤ 1)

    def validate(self) -> None:
        if self.scope not in SCOPES:
            raise InputError(f"unknown strategy scope {self.scope!r}: use {' or '.join(SCOPES)}")
        if self.steps is not None and self.steps < 1:
            raise ParameterError("steps", f"{{steps}} must be at least 1, not {self.steps}", self.steps)
        if self.min_score is not None and not 0 < self.min_score <= 1:
            raise ParameterError(
                "min_score",
                f"{{min_score}} must be a fraction of the original quality in (0, 1], not {self.min_score}: "
                "e.g. 0.9 keeps at least 90%",
                self.min_score,
            )


@dataclass
class PruneStep:
    """One step of a pruning run."""

    index: int  # 1-based step number
    removed: RemovedHeads  # heads removed in this step
    total_removed: int  # heads removed so far, this step included
    quality: Quality | None = None  # quality on the evaluation data after the step (only with min_score)


@dataclass
class PruneRun:
    """Everything a pruning run decided."""

    importance: HeadImportance  # scores of the first round: every head of the unpruned model
    removed: RemovedHeads  # all heads removed
    steps: list[PruneStep] = field(default_factory=list)
    last_importance: HeadImportance | None = None  # scores of the last round (iterative runs)
    stopped_by_min_score: bool = False  # a step was refused because quality fell below min_score


def layer_quotas(layout: Mapping[AttentionSite, int], count: int) -> dict[AttentionSite, int]:
    """Spread ``count`` removals over the sites in proportion to their heads, each keeping ≥ 1 head.

    Largest-remainder rounding; capacity a capped site cannot use goes to the others.
    """
    if count > max_removable(layout):
        raise InputError(f"cannot remove {count} heads while every layer keeps one (at most {max_removable(layout)})")
    total = sum(layout.values())
    exact = {site: count * heads / total for site, heads in layout.items()}
    quotas = {site: min(math.floor(value), layout[site] - 1) for site, value in exact.items()}
    # Hand out what is left, largest fractional remainder first, to sites with room.
    order = sorted(layout, key=lambda site: (-(exact[site] - math.floor(exact[site])), site))
    while sum(quotas.values()) < count:
        for site in order:
            if sum(quotas.values()) >= count:
                break
            if quotas[site] < layout[site] - 1:
                quotas[site] += 1
    return quotas


def select_heads(
    scores: Scores,
    layout: Mapping[AttentionSite, int],
    removed: Mapping[AttentionSite, list[int]],
    count: int,
    scope: str = "global",
    quotas: Mapping[AttentionSite, int] | None = None,
) -> RemovedHeads:
    """The ``count`` least important heads not yet removed, never emptying a layer.

    ``per-layer`` scope takes, from each site, the heads needed to reach its
    cumulative ``quotas[site]`` (see :func:`layer_quotas`). Ties break by site, then head index.
    """
    chosen: dict[AttentionSite, list[int]] = {}
    left = {site: heads - len(removed.get(site, [])) for site, heads in layout.items()}

    def candidates(sites) -> list[tuple[float, AttentionSite, int]]:
        return sorted(
            (float(scores[site][head]), site, head)
            for site in sites
            for head in range(layout[site])
            if head not in removed.get(site, [])
        )

    if scope == "per-layer":
        assert quotas is not None, "per-layer selection needs quotas"
        for site in sorted(layout):
            need = quotas[site] - len(removed.get(site, []))
            for _, _, head in candidates([site])[: max(need, 0)]:
                chosen.setdefault(site, []).append(head)
        return {site: sorted(heads) for site, heads in chosen.items()}

    taken = 0
    for _, site, head in candidates(sorted(layout)):
        if taken >= count:
            break
        if left[site] <= 1:
            continue  # the layer's last head stays
        chosen.setdefault(site, []).append(head)
        left[site] -= 1
        taken += 1
    return {site: sorted(heads) for site, heads in sorted(chosen.items())}


def default_steps(layout: Mapping[AttentionSite, int], count: int) -> int:
    """Steps of 10% of all heads (Michel et al.'s schedule) to remove ``count`` heads."""
    step = max(1, round(0.1 * sum(layout.values())))
    return max(1, -(-count // step))


def step_targets(count: int, steps: int) -> list[int]:
    """Cumulative removal counts after each of ``steps`` steps (no empty steps)."""
    targets = sorted({max(1, round(count * step / steps)) for step in range(1, steps + 1)})
    return [target for target in targets if target <= count] or [count]


def run_pruning(
    objective: Objective,
    layout: Mapping[AttentionSite, int],
    method: str,
    count: int,
    strategy: PruneStrategy,
    *,
    seed: int = 0,
    normalize: bool | None = None,
    evaluation: Objective | None = None,
    quality_before: Quality | None = None,
) -> PruneRun:
    """Choose up to ``count`` heads to remove (see the module docstring).

    ``objective`` scores heads; ``evaluation`` (default: ``objective``) checks
    quality after each step when ``strategy.min_score`` is set, against
    ``quality_before`` (computed when not given).
    """
    strategy.validate()
    layout = dict(layout)
    if not 1 <= count <= max_removable(layout):
        raise InputError(
            f"cannot remove {count} heads: between 1 and {max_removable(layout)} can go while every layer keeps one"
        )
    evaluation = evaluation or objective
    if strategy.min_score is not None and quality_before is None:
        quality_before = evaluation.evaluate()
    staged = strategy.iterative or strategy.min_score is not None
    steps = strategy.steps if strategy.steps is not None else default_steps(layout, count)
    targets = step_targets(count, steps) if staged else [count]
    quotas = layer_quotas(layout, count) if strategy.scope == "per-layer" else None

    removed: RemovedHeads = {}
    run: PruneRun | None = None
    importance: HeadImportance | None = None
    with progress_bar() as progress:
        for step, target in enumerate(targets, start=1):
            if importance is None or strategy.iterative:
                passes = scoring_passes(method, objective, layout, count_removed(removed))
                task = progress.add_task(
                    f"scoring heads ({method}, step {step}/{len(targets)})", total=passes, status=""
                )
                importance = compute_importance(
                    method,
                    objective,
                    layout,
                    removed,
                    seed=seed + step - 1,
                    normalize=normalize,
                    progress=lambda task=task: progress.advance(task),
                )
                progress.remove_task(task)
                if run is None:
                    run = PruneRun(importance=importance, removed={})
            assert run is not None
            step_quotas = None
            if quotas is not None:
                # Cumulative per-layer quota at this step, in proportion to the overall quotas.
                step_quotas = {site: round(quota * target / count) for site, quota in quotas.items()}
            added = select_heads(
                importance.scores, layout, removed, target - count_removed(removed), strategy.scope, step_quotas
            )
            candidate = merge_removed(removed, added)
            quality = None
            if strategy.min_score is not None:
                assert quality_before is not None
                task = progress.add_task(
                    f"checking quality (step {step})", total=len(evaluation.local_indices()), status=""
                )
                quality = evaluation.evaluate(
                    removal_mask(layout, candidate), progress=lambda task=task: progress.advance(task)
                )
                progress.remove_task(task)
                if quality.score < strategy.min_score * quality_before.score:
                    run.stopped_by_min_score = True
                    break
            removed = candidate
            run.steps.append(PruneStep(step, added, count_removed(removed), quality))
    assert run is not None
    run.removed = removed
    run.last_importance = importance
    return run
