"""``attnviz heads`` results as JSON (the documented contract) and CSV.

JSON object::

    {"format": "attnviz-heads", "version": 1, "model": str, "causal": bool,
     "probe": {"kind": "repeated-random-tokens", "length": int, "sequences": int, "seed": int},
     "thresholds": {"induction_min": float | null, ...},
     "heads": [{"stack": str, "layer": int, "head": int,
                "induction": float, "duplicate_token": float, "previous_token": float,
                "next_token": float | null,          # null on causal stacks
                "labels": [str], "main_label": str | null,
                "statistics": {name: float | null, ...}   # only with a corpus
               }],
     "corpus": {"examples": int, "tokens": int},    # only with a corpus
     "similarity": {"heads": [[stack, layer, head], ...], "js_divergence": [[float]],
                    "source": "probes" | "corpus", "examples": int, "max_tokens": int}   # when asked}
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from attnviz.heads.labels import SCORE_NAMES
from attnviz.heads.result import HeadFunctions
from attnviz.outputs.files import write_text_atomic

FORMAT_NAME = "attnviz-heads"
FORMAT_VERSION = 1


def _number(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 7)


def heads_record(result: HeadFunctions) -> dict:
    """The documented JSON object of one model's head functions."""
    from attnviz.stats.definitions import STATISTIC_NAMES

    heads = []
    for site, head in result.heads():
        scores = result.head_scores(site, head)
        row: dict = {"stack": site.stack, "layer": site.layer, "head": head}
        row.update({name: _number(scores[name]) for name in SCORE_NAMES})
        row["labels"] = list(result.labels(site, head))
        row["main_label"] = result.main_label(site, head)
        if result.statistics is not None and site in result.statistics.sites:
            means = result.statistics.sites[site].mean  # [S, h]
            row["statistics"] = {name: _number(float(means[i, head])) for i, name in enumerate(STATISTIC_NAMES)}
        heads.append(row)
    record: dict = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "model": result.model,
        "causal": result.causal,
        "probe": result.probe.record(),
        "thresholds": result.thresholds.to_dict(),
        "heads": heads,
    }
    if result.statistics is not None:
        record["corpus"] = {"examples": result.statistics.num_examples, "tokens": result.statistics.num_tokens}
    if result.similarity is not None:
        similarity = result.similarity
        record["similarity"] = {
            "heads": [list(head) for head in similarity.heads],
            "js_divergence": [[round(float(v), 7) for v in row] for row in similarity.divergence],
            "source": similarity.source,
            "examples": similarity.examples,
            "max_tokens": similarity.max_tokens,
        }
    return record


def write_heads_json(path: str | Path, record: dict) -> Path:
    return write_text_atomic(path, json.dumps(record, indent=2, allow_nan=False) + "\n")


def write_heads_csv(path: str | Path, record: dict) -> Path:
    """One row per head: model, stack, layer, head, the probe scores, main label, labels joined by ``;``."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["model", "stack", "layer", "head", *SCORE_NAMES, "main_label", "labels"])
    for row in record["heads"]:
        numbers = ["" if row[name] is None else repr(row[name]) for name in SCORE_NAMES]
        writer.writerow(
            [
                record["model"],
                row["stack"],
                row["layer"],
                row["head"],
                *numbers,
                row["main_label"] or "",
                ";".join(row["labels"]),
            ]
        )
    return write_text_atomic(path, buffer.getvalue())
