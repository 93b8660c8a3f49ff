"""Statistics by query position in machine-readable form: the ``by_position`` JSON section and a long CSV.

JSON (the ``by_position`` member of a model's ``attnviz-stats`` object)::

    {"bucket_size": int,                  # bucket b holds the queries bucket_starts[b] … next start − 1
     "recent_tokens": 16,                 # recent_share: weight on keys with |i − j| ≤ 15
     "bucket_starts": [0, s, 2s, …],
     "heads": [{"stack": str, "layer": int, "head": int,
                "sink_mass": [float | null, …], "entropy": [...],
                "mean_distance": [...], "recent_share": [...],   # each aligned with bucket_starts
                "queries": [int, …]}]}    # real queries (all texts) in each bucket

``null`` where a bucket has no query on that stack. CSV (long format): one row per model, head
and bucket, ``model,stack,layer,head,bucket_start,bucket_end,queries,sink_mass,entropy,
mean_distance,recent_share`` (``bucket_end`` exclusive; empty cells where a bucket has no query).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

from attnviz.outputs.files import write_text_atomic
from attnviz.stats.by_position import POSITION_METRICS
from attnviz.stats.result import HeadStatistics

CSV_COLUMNS = ("model", "stack", "layer", "head", "bucket_start", "bucket_end", "queries", *POSITION_METRICS)


def _number(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 7)


def position_record(stats: HeadStatistics) -> dict:
    """The ``by_position`` JSON section of ``stats`` (which must have been computed ``by_position``)."""
    positions = stats.by_position
    heads = []
    for site, means in positions.sites.items():  # [M, h, B]
        queries = [int(count) for count in positions.counts[site].tolist()]
        for head in range(means.shape[1]):
            row: dict = {"stack": site.stack, "layer": site.layer, "head": stats.original_head(site, head)}
            for index, name in enumerate(POSITION_METRICS):
                row[name] = [_number(value) for value in means[index, head].tolist()]
            row["queries"] = queries
            heads.append(row)
    return {
        "bucket_size": positions.bucket_size,
        "recent_tokens": positions.recent_tokens,
        "bucket_starts": list(positions.bucket_starts),
        "heads": heads,
    }


def position_csv_text(records: dict | Sequence[dict]) -> str:
    """The long CSV of the ``by_position`` sections of JSON records (records without one add no row)."""
    records = [records] if isinstance(records, dict) else list(records)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for record in records:
        section = record.get("by_position")
        if section is None:
            continue
        starts, size = section["bucket_starts"], section["bucket_size"]
        for row in section["heads"]:
            for bucket, start in enumerate(starts):
                values = ["" if row[name][bucket] is None else repr(row[name][bucket]) for name in POSITION_METRICS]
                head = [record["model"], row["stack"], row["layer"], row["head"]]
                writer.writerow([*head, start, start + size, row["queries"][bucket], *values])
    return buffer.getvalue()


def write_position_csv(path: str | Path, records: dict | Sequence[dict]) -> Path:
    """Write :func:`position_csv_text` atomically."""
    return write_text_atomic(path, position_csv_text(records))


def position_path(path: Path) -> Path:
    """Where the by-position companion of an output goes: ``stats.csv`` → ``stats.by-position.csv``."""
    return path.with_name(f"{path.stem}.by-position{path.suffix}")
