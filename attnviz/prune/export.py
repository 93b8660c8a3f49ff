"""The pruning report: a terminal table and a JSON document.

JSON fields (``attnviz prune … --json PATH``; see also the README):

==========================  ===============================================================
``format``, ``version``     ``"attnviz-prune-report"``, ``1``
``model``                   the model spec that was pruned
``objective``               ``language_model``, ``task`` (toy), ``representation`` (encoders) or
                            ``prediction`` (image classifiers, :mod:`attnviz.models.vision_pruning`)
``importance_method``       ``gradient``, ``ablation``, ``entropy``, ``confidence`` or ``random``
``normalized``              importance scores were ℓ2-normalised per layer
``strategy``                ``{scope, iterative, steps, min_score, seed}``
``importance``              every head of the unpruned model: ``[{stack, layer, head, score}]``
                            (higher = more important; first scoring round)
``pruned``                  heads removed: ``[{stack, layer, head}]`` (original numbering)
``sliced``, ``masked``      of those, the ones sliced out of the weights and the ones kept with
                            zeroed output weights (grouped-query attention; see ``attnviz.models.physical``)
``steps``                   ``[{step, pruned, total_removed, metric}]`` (metric only with min_score)
``stopped_by_min_score``    a step was refused because quality fell below ``min_score``
``metric``                  ``perplexity`` (lower is better), ``accuracy``, ``cosine_similarity`` or ``agreement``
``metric_before``           metric of the unpruned model on the evaluation data
``metric_masked``           metric of the unpruned model with the removed heads masked
``metric_after``            metric of the physically pruned model
``loss_before``, ``loss_after``  the objective's mean loss before / after
``params_before``, ``params_after``  parameter counts (tied weights once)
``latency_before_ms``, ``latency_after_ms``  fastest forward latency of ``latency_rounds`` rounds, the two
                            models timed in alternation in the same run
``latency_before_ms_range``, ``latency_after_ms_range``  ``[fastest, slowest]`` of those rounds
``latency_conclusive``      whether the two latencies can be told apart (false: the difference is within
                            the noise of this machine; see ``attnviz.prune.cost``)
``latency_sign_test_p``, ``latency_rounds``  the paired rounds' sign test p-value, and the number of rounds
``latency_tokens``          input length of the latency measurement
``heads_before``, ``heads_after``  total heads; ``heads_per_layer_after``: ``[{stack, layer, heads}]``
``max_abs_diff``            largest |masked-model output − pruned-model output| on the latency input
``scoring_units``, ``evaluation_units``, ``unit``  how much data was scored / evaluated
``output``, ``transformers_copy``  the checkpoint directory and the plain-transformers copy (or null)
==========================  ===============================================================
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.table import Table

from attnviz.common.display import NotebookDisplay
from attnviz.common.wording import layers_and_heads, plural
from attnviz.core import AttentionSite
from attnviz.models.head_sets import heads_as_records, normalize_removed
from attnviz.models.objective import Objective, Quality
from attnviz.outputs.files import check_output_path, write_text_atomic
from attnviz.stats.tables import plain_table

FORMAT_NAME = "attnviz-prune-report"
FORMAT_VERSION = 1


@dataclass(repr=False)  # NotebookDisplay's short repr; notebooks show the HTML view
class PruneReport(NotebookDisplay):
    """Everything a pruning run measured; :meth:`to_dict` is the JSON document."""

    model: str
    objective: str
    importance_method: str
    normalized: bool
    strategy: dict
    importance: list[dict]
    pruned: list[dict]
    sliced: list[dict]
    masked: list[dict]
    steps: list[dict]
    stopped_by_min_score: bool
    metric: str
    higher_is_better: bool
    metric_before: float
    metric_masked: float
    metric_after: float
    loss_before: float
    loss_after: float
    params_before: int
    params_after: int
    latency_before_ms: float
    latency_after_ms: float
    latency_before_ms_range: list[float]
    latency_after_ms_range: list[float]
    latency_conclusive: bool
    latency_sign_test_p: float
    latency_rounds: int
    latency_tokens: int
    heads_before: int
    heads_after: int
    heads_per_layer_after: list[dict]
    max_abs_diff: float
    scoring_units: int
    evaluation_units: int
    unit: str
    output: str | None = None
    transformers_copy: str | None = None

    def to_dict(self) -> dict:
        data = {"format": FORMAT_NAME, "version": FORMAT_VERSION}
        data.update(asdict(self))
        return _finite(data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


def _finite(value):
    """NaN / infinity become null: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


@dataclass(frozen=True)
class LatencySummary:
    """The latency comparison of a pruning run, as numbers (what the main process measured)."""

    before_ms: float  # fastest round
    after_ms: float
    before_range_ms: tuple[float, float]  # (fastest, slowest)
    after_range_ms: tuple[float, float]
    conclusive: bool
    sign_test_p: float
    rounds: int

    @classmethod
    def from_numbers(cls, numbers: list[float]) -> LatencySummary:
        """From ``[fastest before, fastest after, slowest before, slowest after, conclusive, p, rounds]``."""
        before, after, slowest_before, slowest_after, conclusive, p_value, rounds = numbers
        return cls(
            before, after, (before, slowest_before), (after, slowest_after), bool(conclusive), p_value, int(rounds)
        )


def build_report(
    *,
    model: str,
    config,
    strategy,
    objective: Objective,
    evaluation: Objective,
    run,
    layout: Mapping[AttentionSite, int],
    layout_pruned: Mapping[AttentionSite, int],
    plans: Mapping | None,
    quality_before: Quality,
    quality_masked: Quality,
    quality_after: Quality,
    params_before: int,
    params_after: int,
    latency: LatencySummary,
    latency_tokens: int,
    max_abs_diff: float,
) -> PruneReport:
    """Assemble a :class:`PruneReport` from a finished run (see :func:`attnviz.prune.pipeline.prune_model`)."""
    removed = normalize_removed(run.removed)
    if plans is not None:
        sliced = {site: plan.sliced for site, plan in plans.items()}
        masked = {site: plan.masked for site, plan in plans.items()}
    else:
        sliced, masked = removed, {}
    steps = [
        {
            "step": step.index,
            "pruned": heads_as_records(step.removed),
            "total_removed": step.total_removed,
            "metric": None if step.quality is None else step.quality.metric,
        }
        for step in run.steps
    ]
    return PruneReport(
        model=model,
        objective=objective.kind,
        importance_method=run.importance.method,
        normalized=run.importance.normalized,
        strategy={
            "scope": strategy.scope,
            "iterative": strategy.iterative,
            "steps": strategy.steps,
            "min_score": strategy.min_score,
            "seed": config.seed,
        },
        importance=run.importance.records(),
        pruned=heads_as_records(removed),
        sliced=heads_as_records(sliced),
        masked=heads_as_records(masked),
        steps=steps,
        stopped_by_min_score=run.stopped_by_min_score,
        metric=quality_before.metric_name,
        higher_is_better=quality_before.higher_is_better,
        metric_before=quality_before.metric,
        metric_masked=quality_masked.metric,
        metric_after=quality_after.metric,
        loss_before=quality_before.loss,
        loss_after=quality_after.loss,
        params_before=params_before,
        params_after=params_after,
        latency_before_ms=latency.before_ms,
        latency_after_ms=latency.after_ms,
        latency_before_ms_range=list(latency.before_range_ms),
        latency_after_ms_range=list(latency.after_range_ms),
        latency_conclusive=latency.conclusive,
        latency_sign_test_p=latency.sign_test_p,
        latency_rounds=latency.rounds,
        latency_tokens=latency_tokens,
        heads_before=sum(layout.values()),
        heads_after=sum(layout_pruned.values()),
        heads_per_layer_after=[
            {"stack": site.stack, "layer": site.layer, "heads": heads} for site, heads in sorted(layout_pruned.items())
        ],
        max_abs_diff=max_abs_diff,
        scoring_units=objective.total_units(),
        evaluation_units=evaluation.total_units(),
        unit=objective.unit_name,
    )


def write_report_json(report: PruneReport, path: str | os.PathLike) -> Path:
    """Write the report as JSON, atomically."""
    path = check_output_path(path, (".json",))
    return write_text_atomic(path, report.to_json())


# -- terminal ---------------------------------------------------------------------------------------


def _change(before: float, after: float) -> str:
    if before == 0 or not math.isfinite(before) or not math.isfinite(after):
        return ""
    return f"{(after - before) / abs(before) * 100:+.1f}%"


def importance_table(report: PruneReport) -> Table:
    """Layers as rows, heads as columns; removed heads marked ``*`` (and struck through in red)."""
    removed = {(item["stack"], item["layer"], item["head"]) for item in report.pruned}
    rows: dict[tuple[str, int], dict[int, float | None]] = {}
    for item in report.importance:
        rows.setdefault((item["stack"], item["layer"]), {})[item["head"]] = item["score"]
    width = max((max(heads) + 1 for heads in rows.values()), default=0)
    title = f"head importance ({report.importance_method}{', normalised per layer' if report.normalized else ''})"
    # No box and no wrapping: 12+ heads of 4-character scores fit an 80-column terminal.
    table = plain_table(title, caption="* removed", collapse_padding=True)
    table.add_column("layer", justify="right", no_wrap=True)
    for head in range(width):
        table.add_column(str(head), justify="right", no_wrap=True)
    for (stack, layer), heads in sorted(rows.items()):
        cells = []
        for head in range(width):
            score = heads.get(head)
            text = "" if head not in heads else "–" if score is None else _score(score)
            if (stack, layer, head) in removed:
                text = f"[red strike]{text}[/red strike]*"
            else:
                text += " "  # keeps the digits aligned with the marked cells
            cells.append(text)
        table.add_row(str(layer) if stack == "self" else f"{stack}.{layer}", *cells)
    return table


def _latency_cell(fastest: float, fastest_slowest: list[float]) -> str:
    """``12.3 (12.3–15.0)``: the fastest round, and the range of all rounds."""
    return f"{fastest:.1f} ({fastest_slowest[0]:.1f}–{fastest_slowest[1]:.1f})"


def latency_line(report: PruneReport) -> str:
    """One sentence on the latency: a difference, or why none can be named."""
    change = report.latency_after_ms / report.latency_before_ms - 1 if report.latency_before_ms else 0.0
    if report.latency_conclusive:
        faster = "faster" if change < 0 else "slower"
        return (
            f"latency: the pruned model is {abs(change):.1%} {faster} "
            f"(fastest of {report.latency_rounds} interleaved rounds; the rounds agree)"
        )
    return (
        f"latency: no clear difference ({change:+.1%} between the fastest rounds, but the {report.latency_rounds} "
        "interleaved rounds spread too much or disagree on which model is faster; a busy machine does this: "
        "measure again when the machine is quiet, or with more rounds)"
    )


def _score(score: float) -> str:
    """Four characters or so: 0.42, 3.1, 1e+03."""
    return f"{score:.2f}" if abs(score) < 10 else f"{score:.2g}"


def summary_table(report: PruneReport) -> Table:
    """Quality, size and speed before and after."""
    table = Table(title=f"pruned {report.model}", title_justify="left", header_style="bold")
    table.add_column("")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    table.add_column("change", justify="right")
    table.add_row(
        "heads",
        str(report.heads_before),
        str(report.heads_after),
        f"-{report.heads_before - report.heads_after}",
    )
    better = "higher" if report.higher_is_better else "lower"
    table.add_row(
        f"{report.metric} ({better} is better)",
        f"{report.metric_before:.4g}",
        f"{report.metric_after:.4g}",
        _change(report.metric_before, report.metric_after),
    )
    table.add_row(
        "loss", f"{report.loss_before:.4g}", f"{report.loss_after:.4g}", _change(report.loss_before, report.loss_after)
    )
    table.add_row(
        "parameters",
        f"{report.params_before:,}",
        f"{report.params_after:,}",
        _change(report.params_before, report.params_after),
    )
    table.add_row(
        f"latency, {report.latency_tokens} tokens (ms, fastest of {report.latency_rounds})",
        _latency_cell(report.latency_before_ms, report.latency_before_ms_range),
        _latency_cell(report.latency_after_ms, report.latency_after_ms_range),
        _change(report.latency_before_ms, report.latency_after_ms)
        if report.latency_conclusive
        else "no clear difference",
    )
    return table


def _heads_per_stack(records: list[dict]) -> dict[str, list[int]]:
    """``{stack: heads of each layer}`` from ``heads_per_layer_after``'s ``[{stack, layer, heads}]``."""
    stacks: dict[str, dict[int, int]] = {}
    for record in records:
        stacks.setdefault(record["stack"], {})[record["layer"]] = record["heads"]
    return {stack: [layers[layer] for layer in sorted(layers)] for stack, layers in stacks.items()}


def summary_lines(report: PruneReport) -> list[str]:
    """A few plain lines explaining what was removed and written (the CLI prints them after the tables)."""
    strategy = report.strategy
    how = "iteratively" if strategy["iterative"] else "in one shot"
    lines = [
        (
            f"removed {plural(len(report.pruned), 'head')} ({strategy['scope']}, {how}); "
            f"{len(report.sliced)} sliced out of the weights, {len(report.masked)} masked by zeroed output weights; "
            f"masked vs pruned outputs differ by at most {report.max_abs_diff:.2g}"
        )
    ]
    lines.append(latency_line(report))
    for stack, counts in _heads_per_stack(report.heads_per_layer_after).items():
        lines.append(f"pruned model, {stack} attention: {layers_and_heads(counts)}")
    if report.stopped_by_min_score:
        lines.append(f"stopped early: the next step would have dropped {report.metric} below the minimum score")
    if report.output:
        lines.append(f"pruned checkpoint: {report.output}")
    if report.transformers_copy:
        lines.append(f"plain-transformers copy (masked weights, full size): {report.transformers_copy}")
    return lines
