"""``attnviz report``: the head atlas of one model, from loading to the written page.

Loads the model, measures every head over a corpus (as ``attnviz stats``), captures a
few short examples' patterns, reads head importance from a prune report when given,
and writes one self-contained HTML page (:mod:`attnviz.render.atlas`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnviz.captures.attention_capture import AttentionCapture, PatternRecorder, captures_from_patterns
from attnviz.common.errors import InputError, UnsupportedModelError
from attnviz.common.progress import status
from attnviz.common.texts import load_texts
from attnviz.compare.models import compare_models
from attnviz.compare.result import ModelComparison
from attnviz.core.choices import Weighting
from attnviz.core.weighting import check_weighting, weighted_observers
from attnviz.models.base import LoadedModel
from attnviz.models.identity import model_identity
from attnviz.models.specs import load_model
from attnviz.outputs.files import check_output_path, read_text_file
from attnviz.render.atlas import ExtraColumns, HeadKey, write_atlas
from attnviz.render.html_page import HTML_SUFFIXES
from attnviz.stats.definitions import STATISTIC_NAMES
from attnviz.stats.detect import Detection, detect_heads
from attnviz.stats.measure import measure_model
from attnviz.stats.result import HeadStatistics
from attnviz.stats.thresholds import Thresholds

#: Example texts longer than this many characters are passed over (their patterns would be unreadably small).
_EXAMPLE_MAX_CHARS = 120
_EXAMPLE_MAX_TOKENS = 40


@dataclass
class PruneScores:
    """The head importance of an ``attnviz prune --json`` report, and the models it was written for."""

    path: Path
    models: tuple[str, ...]  # the model pruned and the pruned copy written ("model", "output")
    importance: dict[HeadKey, float]  # (stack, layer, head) -> score


def read_importance(path: str | Path) -> PruneScores:
    """Head importance scores of an ``attnviz prune --json`` report; non-numeric, NaN or infinite scores are refused."""
    path = Path(path).expanduser()
    text = read_text_file(path, "prune report")
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"prune report {path} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(record, dict) or record.get("format") != "attnviz-prune-report":
        raise InputError(f"{path} is not an attnviz prune report (the JSON report attnviz prune writes)")
    models = tuple(str(record[key]) for key in ("model", "output") if isinstance(record.get(key), str))
    if not models:
        raise InputError(f"prune report {path} does not name its model: give the report attnviz prune --json wrote")
    importance: dict[HeadKey, float] = {}
    try:
        for entry in record["importance"]:
            stack, layer, head, score = entry["stack"], entry["layer"], entry["head"], entry["score"]
            if not isinstance(stack, str) or not all(_is_whole(v) for v in (layer, head)) or not _is_number(score):
                raise ValueError(f"entry {entry!r} needs a stack name, whole layer and head numbers and a score")
            if not math.isfinite(score):
                raise ValueError(f"the score of {stack} layer {layer} head {head} is {score}")
            if (stack, layer, head) in importance:
                raise ValueError(f"{stack} layer {layer} head {head} is listed twice")
            importance[(stack, layer, head)] = float(score)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"prune report {path} has no readable importance list ({exc})") from None
    return PruneScores(path, models, importance)


def _is_whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_scores_fit(scores: PruneScores, checkpoint: str, loaded: LoadedModel) -> None:
    """Refuse a prune report written for another model, or whose heads the analysed model does not have."""
    names = {_model_name(name) for name in scores.models}
    if _model_name(checkpoint) not in names and _model_name(loaded.name) not in names:
        raise InputError(
            f"prune report {scores.path} was written for {' / '.join(scores.models)}, not for {checkpoint}: "
            "give the report of this model (or of the model it was pruned from)"
        )
    for stack, layer, head in scores.importance:
        if stack not in loaded.stacks() or layer >= loaded.num_layers(stack) or head >= _original_heads(loaded, stack):
            raise InputError(
                f"prune report {scores.path} scores {stack} layer {layer} head {head}, which {checkpoint} does not "
                "have: give the report of this model"
            )


def _model_name(spec: str) -> str:
    """A model spec compared by its last path component (a report may have been written from another folder)."""
    return Path(str(spec).strip().rstrip("/")).name.lower()


def _original_heads(loaded: LoadedModel, stack: str) -> int:
    """Heads per layer before any pruning (a pruned model's scores number the original heads)."""
    identity = model_identity(loaded)
    counts = [loaded.num_heads(stack)]
    if identity is not None:  # the original numbers of every layer's surviving heads
        for site in loaded.layout():
            if site.stack == stack:
                counts.extend(id + 1 for id in identity.ids(stack, site.layer, loaded.layout()[site]))
    return max(counts)


def example_captures(
    loaded: LoadedModel, texts: Sequence[str] | None, count: int, *, seed: int = 0, weighting: Weighting = "weights"
) -> list[AttentionCapture]:
    """Patterns of ``count`` short examples: the first short texts, or a toy model's own task examples.

    ``weighting="norm"``: norm-based attention with rows renormalised (the page draws distributions).
    """
    if count <= 0:
        return []
    batch = loaded.own_examples(count, seed) if texts is None else None
    if batch is None:
        short = [text for text in (texts or []) if len(text) <= _EXAMPLE_MAX_CHARS] or list(texts or [])
        batch = loaded.encode(short[:count], max_length=_EXAMPLE_MAX_TOKENS, truncate=True)
    recorder = PatternRecorder()
    projections = loaded.head_output_projections() if weighting == "norm" else None
    with torch.no_grad():
        loaded.forward(
            batch,
            loaded.context(
                weighted_observers([recorder], weighting, projections, renormalise=True, cache=loaded.factor_cache)
            ),
        )
    return captures_from_patterns(recorder.patterns, batch, loaded.name, loaded.causal)


def measure_for_atlas(
    loaded: LoadedModel,
    texts: Sequence[str] | None,
    *,
    examples: int,
    seed: int = 0,
    weighting: Weighting = "weights",
    **measuring: Any,
) -> tuple[HeadStatistics, Detection, list[AttentionCapture]]:
    """What an atlas page shows of ``loaded``: every head's statistics and flags over ``texts`` (``None``: a toy
    model's own task), measured by :func:`~attnviz.stats.measure.measure_model` with ``measuring`` (thresholds,
    batching, progress), and the patterns of ``examples`` short examples (:func:`example_captures`)."""
    stats, detection = measure_model(loaded, texts, seed=seed, weighting=weighting, **measuring)
    return stats, detection, example_captures(loaded, texts, examples, seed=seed, weighting=weighting)


def build_head_atlas(
    checkpoint: str,
    out: str | Path,
    *,
    texts: Sequence[str] | None = None,
    data: str | Path | None = None,
    prune_report: str | Path | None = None,
    extra_columns: ExtraColumns | None = None,
    examples: int = 3,
    thresholds: Thresholds | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
    toy_examples: int = 128,
    seed: int = 0,
    device: str = "auto",
    dtype: str = "auto",
    progress: bool = True,
    compare: str | None = None,
    weighting: Weighting = "weights",
) -> Path:
    """Measure ``checkpoint`` and write its head atlas to ``out`` (``.html``); returns the path.

    Text comes from ``texts``, a ``data`` file, or the shipped corpus (a toy checkpoint
    without either: its own task). ``extra_columns`` adds per-head columns
    (``{name: {(stack, layer, head): value}}``), e.g. head-function scores. ``compare``: another model
    spec; its divergence from ``checkpoint`` and the change of every statistic become columns
    (:func:`comparison_columns`), so the page sorts by what changed most. ``weighting="norm"``: statistics,
    comparison and example patterns of norm-based attention (``α_ij·‖f_h(x_j)‖``, rows renormalised to sum 1).
    What each token carries (first-token value norm, its share of weights and of norm-weighted mass) is a
    column wherever the model allows it.
    """
    check_weighting(weighting)
    out = check_output_path(out, HTML_SUFFIXES)
    if data is not None and Path(data).expanduser().resolve() == out.resolve():
        raise InputError(f"the output would overwrite the data file {data}: choose another path")
    if examples < 0:
        raise InputError(f"the number of example texts must be at least 0, got {examples}")
    scores = read_importance(prune_report) if prune_report is not None else None
    if texts is None and data is not None:
        texts = load_texts(data)
    with status(f"loading {checkpoint} and measuring every head"):
        loaded = load_model(checkpoint, device=device, dtype=dtype)
    if scores is not None:
        check_scores_fit(scores, str(checkpoint), loaded)
    if loaded.modality == "image":  # before anything is measured, whatever else was asked (--weighting norm …)
        raise UnsupportedModelError(
            f"{loaded.name} is a vision model: the head atlas is drawn for text and token-toy models; measure its "
            f"heads on images with attnviz stats {checkpoint} (--images DIR), and see them on a picture with "
            f"attnviz heatmap --image PATH --model {checkpoint} --out view.html"
        )
    if texts is None and loaded.own_examples(1, seed) is None:
        texts = load_texts()  # no own task: the shipped corpus, for the statistics and the examples alike
    comparison = None
    measuring: dict[str, Any] = {
        "toy_examples": toy_examples, "seed": seed, "progress": progress, "batch_size": batch_size,
        "max_length": max_length, "weighting": weighting,
    }  # fmt: skip
    if compare is not None:
        with status(f"loading {compare}"):
            other = load_model(compare, device=device, dtype=dtype)
        # one pass gives both the comparison and this model's statistics
        comparison = compare_models(loaded, other, texts, **measuring)
        stats = comparison.stats_a
        detection = detect_heads(stats, thresholds)
        captured = example_captures(loaded, texts, examples, seed=seed, weighting=weighting)
    else:
        stats, detection, captured = measure_for_atlas(
            loaded, texts, examples=examples, thresholds=thresholds, **measuring
        )
    columns = dict(extra_columns or {})
    if scores is not None:
        columns = {"importance": scores.importance, **columns}
    if comparison is not None:
        columns = {**columns, **comparison_columns(comparison)}
    return write_atlas(out, stats, detection, captured, extra_columns=columns, identity=stats.identity)


def comparison_columns(comparison: ModelComparison) -> dict[str, dict[HeadKey, float | None]]:
    """Atlas columns of a comparison: ``js_divergence``, ``total_variation`` and ``Δ <statistic>`` (B − A) per head."""
    columns: dict[str, dict[HeadKey, float | None]] = {
        "js_divergence": {},
        "total_variation": {},
        **{f"Δ {name}": {} for name in STATISTIC_NAMES},
    }
    for head in comparison.heads:
        key = (head.site.stack, head.site.layer, head.head)
        columns["js_divergence"][key] = head.js_divergence
        columns["total_variation"][key] = head.total_variation
        delta = head.delta or {}
        for name in STATISTIC_NAMES:
            columns[f"Δ {name}"][key] = delta.get(name)
    return columns
