"""Machine-readable results: one JSON object per model (the documented contract) and CSV rows.

JSON object (one model; several models give a JSON list of these objects)::

    {"format": "attnviz-stats", "version": 1,
     "model": str, "causal": bool,
     "num_layers": int, "num_heads": int,        # of the first stack
     "num_examples": int, "num_tokens": int,     # tokens = real query positions per layer
     "local_window": int,
     "weighting": "weights" | "norm",            # norm: rows of α_ij·‖f_h(x_j)‖ renormalised to sum 1
     "seconds": float | null,                    # wall time of the corpus pass (all processes)
     "tokens_per_second": float | null,          # num_tokens / seconds
     "stacks": {stack: {"num_layers": int, "num_heads": int,
                        "attention_layers": [int]}},   # layers with attention (fewer in a hybrid stack)
     "thresholds": {name: float | null, ..., "preset": str},
     "heads": [{"stack": str, "layer": int, "head": int,
                "entropy": float, "entropy_std": float,
                "normalized_entropy": float, "normalized_entropy_std": float,
                "max_weight": ..., "mean_distance": ..., "normalized_distance": ...,
                "diagonal": ..., "previous_token": ..., "local_ratio": ...,
                "first_token": ..., "special_tokens": ...,   (each with its _std)
                "first_value_norm", "other_value_norm",      # what each token carries, where the
                "first_token_weight_share", "first_token_norm_share": float,  # model allows it
                "flags": [str]}],
     "by_position": {...}}                       # only when asked for: attnviz.stats.position_export

A statistic no query counted for (e.g. normalized_entropy when every example is one
token long) is ``null``. CSV: one row per head with the same fields, plus ``model``;
flags joined by ``;``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path

from attnviz.outputs.files import write_text_atomic
from attnviz.stats.carriers import CARRIER_FIELDS
from attnviz.stats.definitions import STATISTIC_NAMES
from attnviz.stats.detect import Detection
from attnviz.stats.position_export import position_record
from attnviz.stats.result import HeadStatistics

FORMAT_NAME = "attnviz-stats"
FORMAT_VERSION = 1

#: Per-head fields in JSON and CSV order (after "stack", "layer", "head").
HEAD_FIELDS: tuple[str, ...] = tuple(field for name in STATISTIC_NAMES for field in (name, f"{name}_std"))


def _number(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 7)


def stats_record(stats: HeadStatistics, detection: Detection, preset: str | None = None) -> dict:
    """The documented JSON object of one model's statistics and flags."""
    first = stats.stacks[0]
    heads = []
    for site, head, values in stats.heads():
        # heads keep their numbers from before pruning; masked ones say so
        row: dict = {"stack": site.stack, "layer": site.layer, "head": stats.original_head(site, head)}
        row.update({field: _number(values[field]) for field in HEAD_FIELDS})
        if stats.carriers is not None:
            row.update({field: _number(value) for field, value in stats.carriers.head(site, head).items()})
        row["flags"] = list(detection.flags[site][head]) + (
            ["masked-by-pruning"] if stats.is_masked(site, head) else []
        )
        heads.append(row)
    thresholds: dict = detection.thresholds.to_dict()
    if preset is not None:
        thresholds["preset"] = preset
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "model": stats.model,
        "causal": stats.causal,
        "num_layers": stats.num_layers(first),
        "num_heads": stats.num_heads(first),
        "num_examples": stats.num_examples,
        "num_tokens": stats.num_tokens,
        "local_window": stats.local_window,
        "weighting": stats.weighting,
        "seconds": None if stats.seconds is None else round(stats.seconds, 4),
        "tokens_per_second": None if stats.tokens_per_second is None else round(stats.tokens_per_second, 2),
        "stacks": {
            stack: {
                "num_layers": stats.num_layers(stack),
                "num_heads": stats.num_heads(stack),
                "attention_layers": [site.layer for site in stats.layers(stack)],
            }
            for stack in stats.stacks
        },
        "thresholds": thresholds,
        "heads": heads,
        **({"image": stats.image.to_dict()} if stats.image is not None else {}),
        **({"picture": stats.picture.to_dict()} if stats.picture is not None else {}),
        **({"by_position": position_record(stats)} if stats.by_position is not None else {}),
    }


def json_text(records: dict | Sequence[dict]) -> str:
    """The JSON document of one record (an object) or several (a list)."""
    payload = records if isinstance(records, dict) else list(records)
    if isinstance(payload, list) and len(payload) == 1:
        payload = payload[0]
    return json.dumps(payload, indent=2, allow_nan=False) + "\n"


def write_json(path: str | Path, records: dict | Sequence[dict]) -> Path:
    """Write one record (an object) or several (a list), atomically."""
    return write_text_atomic(path, json_text(records))


def write_csv(path: str | Path, records: dict | Sequence[dict]) -> Path:
    """Write one row per head of every record, atomically."""
    return write_text_atomic(path, csv_text(records))


def csv_text(records: dict | Sequence[dict]) -> str:
    """CSV text: a header and one row per head of every record."""
    records = [records] if isinstance(records, dict) else list(records)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    carried = any(CARRIER_FIELDS[0] in row for record in records for row in record["heads"])
    fields = HEAD_FIELDS + (CARRIER_FIELDS if carried else ())
    writer.writerow(["model", "stack", "layer", "head", *fields, "flags"])
    for record in records:
        for row in record["heads"]:
            numbers = ["" if row.get(field) is None else repr(row[field]) for field in fields]
            writer.writerow(
                [record["model"], row["stack"], row["layer"], row["head"], *numbers, ";".join(row["flags"])]
            )
    return buffer.getvalue()
