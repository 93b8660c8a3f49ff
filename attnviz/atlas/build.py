"""``attnviz report``: the head atlas of one model, from loading to the written page.

Loads the model, measures every head over a corpus (as ``attnviz stats``), captures a
few short examples' patterns, reads head importance from a prune report when given,
and writes one self-contained HTML page (:mod:`attnviz.render.atlas`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from attnviz.captures.attention_capture import AttentionCapture, PatternRecorder, captures_from_patterns
from attnviz.common.errors import InputError
from attnviz.common.progress import status
from attnviz.common.texts import load_texts
from attnviz.models.base import LoadedModel
from attnviz.models.specs import load_model
from attnviz.outputs.files import check_output_path, read_text_file
from attnviz.render.atlas import ExtraColumns, HeadKey, write_atlas
from attnviz.render.html_page import HTML_SUFFIXES
from attnviz.stats.measure import measure_model
from attnviz.stats.thresholds import Thresholds

#: Example texts longer than this many characters are passed over (their patterns would be unreadably small).
_EXAMPLE_MAX_CHARS = 120
_EXAMPLE_MAX_TOKENS = 40


def read_importance(path: str | Path) -> dict[HeadKey, float]:
    """Head importance scores of an ``attnviz prune --json`` report: ``{(stack, layer, head): score}``."""
    path = Path(path).expanduser()
    text = read_text_file(path, "prune report")
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"prune report {path} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(record, dict) or record.get("format") != "attnviz-prune-report":
        raise InputError(f"{path} is not an attnviz prune report (the JSON report attnviz prune writes)")
    try:
        return {(h["stack"], int(h["layer"]), int(h["head"])): float(h["score"]) for h in record["importance"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"prune report {path} has no readable importance list ({exc})") from None


def example_captures(
    loaded: LoadedModel, texts: Sequence[str] | None, count: int, *, seed: int = 0
) -> list[AttentionCapture]:
    """Patterns of ``count`` short examples: the first short texts, or a toy model's own task examples."""
    if count <= 0:
        return []
    batch = loaded.own_examples(count, seed) if texts is None else None
    if batch is None:
        short = [text for text in (texts or []) if len(text) <= _EXAMPLE_MAX_CHARS] or list(texts or [])
        batch = loaded.encode(short[:count], max_length=_EXAMPLE_MAX_TOKENS, truncate=True)
    recorder = PatternRecorder()
    with torch.no_grad():
        loaded.forward(batch, loaded.context([recorder]))
    return captures_from_patterns(recorder.patterns, batch, loaded.name, loaded.causal)


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
) -> Path:
    """Measure ``checkpoint`` and write its head atlas to ``out`` (``.html``); returns the path.

    Text comes from ``texts``, a ``data`` file, or the shipped corpus (a toy checkpoint
    without either: its own task). ``extra_columns`` adds per-head columns
    (``{name: {(stack, layer, head): value}}``), e.g. head-function scores.
    """
    out = check_output_path(out, HTML_SUFFIXES)
    if data is not None and Path(data).expanduser().resolve() == out.resolve():
        raise InputError(f"the output would overwrite the data file {data}: choose another path")
    if examples < 0:
        raise InputError(f"the number of example texts must be at least 0, got {examples}")
    importance = read_importance(prune_report) if prune_report is not None else None
    if texts is None and data is not None:
        texts = load_texts(data)
    with status(f"loading {checkpoint} and measuring every head"):
        loaded = load_model(checkpoint, device=device, dtype=dtype)
    if texts is None and loaded.own_examples(1, seed) is None:
        texts = load_texts()  # no own task: the shipped corpus, for the statistics and the examples alike
    stats, detection = measure_model(
        loaded,
        texts,
        thresholds=thresholds,
        toy_examples=toy_examples,
        seed=seed,
        progress=progress,
        batch_size=batch_size,
        max_length=max_length,
    )
    captured = example_captures(loaded, texts, examples, seed=seed)
    columns = dict(extra_columns or {})
    if importance is not None:
        columns = {"importance": importance, **columns}
    return write_atlas(out, stats, detection, captured, extra_columns=columns, identity=stats.identity)
