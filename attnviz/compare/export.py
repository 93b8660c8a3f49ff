"""``attnviz diff``'s files: the JSON document (:mod:`attnviz.compare.result` documents its fields) and CSV rows.

CSV: one row per head and comparison: ``model_a, model_b, stack, layer, head, status, js_divergence,
total_variation``, then ``a_<statistic>``, ``b_<statistic>`` and ``delta_<statistic>`` for every statistic
(empty where the head is in one model only, or no query counted).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from attnviz.outputs.files import write_text_atomic
from attnviz.stats.definitions import STATISTIC_NAMES

CSV_FIELDS = (
    "model_a",
    "model_b",
    "stack",
    "layer",
    "head",
    "status",
    "js_divergence",
    "total_variation",
    *(f"{side}_{name}" for side in ("a", "b", "delta") for name in STATISTIC_NAMES),
)


def json_text(record: dict) -> str:
    return json.dumps(record, indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def _pairs(record: dict) -> list[dict]:
    """The two-sided comparisons of a record: itself, or a checkpoint record's consecutive and from-first pairs."""
    if record.get("kind") != "checkpoints":
        return [record]
    seen, pairs = set(), []
    for pair in record["consecutive"] + record["from_first"]:
        key = (pair["model_a"], pair["model_b"])
        if key not in seen:
            seen.add(key)
            pairs.append(pair)
    return pairs


def csv_text(record: dict) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for pair in _pairs(record):
        model_a = pair.get("model_a", pair.get("model"))
        model_b = pair.get("model_b", pair.get("model"))
        for head in pair["heads"]:
            sides = [
                "" if head[side] is None or head[side][name] is None else repr(head[side][name])
                for side in ("a", "b", "delta")
                for name in STATISTIC_NAMES
            ]
            numbers = ["" if head[m] is None else repr(head[m]) for m in ("js_divergence", "total_variation")]
            writer.writerow(
                [model_a, model_b, head["stack"], head["layer"], head["head"], head["status"], *numbers, *sides]
            )
    return buffer.getvalue()


def write_json(path: str | Path, record: dict) -> Path:
    return write_text_atomic(path, json_text(record))


def write_csv(path: str | Path, record: dict) -> Path:
    return write_text_atomic(path, csv_text(record))
