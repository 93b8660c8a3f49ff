"""The head atlas page (``attnviz report``): every head's statistics, a layer × head grid, example patterns.

Rendering only: it takes computed statistics, flags, example captures and optional
per-head columns, and never loads a model (:mod:`attnviz.atlas.build` does that).

Extra per-head columns (importance from a prune report, head functions from another
analysis) are a mapping ``column name -> {(stack, layer, head): value}`` with numbers
or short strings; heads without a value show an empty cell.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.models.identity import HeadIdentity
from attnviz.render.capture_view import model_title
from attnviz.render.html_page import build_page, write_page
from attnviz.render.html_view import STACK_NAMES, stack_payload
from attnviz.stats.carriers import CARRIER_FIELDS, CARRIER_HELP
from attnviz.stats.definitions import STATISTICS
from attnviz.stats.detect import Detection
from attnviz.stats.result import HeadStatistics

HeadKey = tuple[str, int, int]  # (stack, layer, head)
ExtraColumns = Mapping[str, Mapping[HeadKey, float | str | None]]


def _clean(value):
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 6)
    return value


def _stack_order(stack: str) -> int:
    """Stacks in the order they run: self / encoder, decoder, cross."""
    order = list(STACK_NAMES)
    return order.index(stack) if stack in order else len(order)


def atlas_payload(
    stats: HeadStatistics,
    detection: Detection,
    examples: Sequence[AttentionCapture] = (),
    *,
    extra_columns: ExtraColumns | None = None,
    identity: HeadIdentity | None = None,
    title: str | None = None,
) -> dict:
    """Everything the atlas page shows, JSON-ready."""
    extra_columns = dict(extra_columns or {})
    columns = [{"name": s.name, "kind": "number", "help": f"{s.formula} ({s.unit})"} for s in STATISTICS]
    carried = CARRIER_FIELDS if stats.carriers is not None else ()  # what each token carries, where measured
    columns += [{"name": name, "kind": "number", "help": CARRIER_HELP[name]} for name in carried]
    for name, column in extra_columns.items():
        numeric = all(isinstance(v, (int, float)) or v is None for v in column.values())
        columns.append({"name": name, "kind": "number" if numeric else "text", "help": "extra column"})
    identity = identity or stats.identity or HeadIdentity()
    rows = []
    for site, head, values in stats.heads():
        original = identity.ids(site.stack, site.layer, stats.sites[site].num_heads)[head]  # number before pruning
        key = (site.stack, site.layer, original)
        row: dict[str, Any] = {
            "stack": site.stack,
            "layer": site.layer,
            "head": original,
            "position": head,  # index in the (possibly pruned) model, for the example patterns
            "flags": list(detection.flags[site][head]),
            "values": [_clean(values[s.name]) for s in STATISTICS]
            + [_clean(stats.carriers.head(site, head).get(name, math.nan)) for name in carried]
            + [_clean(extra_columns[name].get(key)) for name in extra_columns],
            "std": [_clean(values[f"{s.name}_std"]) for s in STATISTICS],
        }
        if original in identity.masked_ids(site.stack, site.layer):
            row["flags"].append("masked-by-pruning")
        rows.append(row)
    stacks = [
        {
            "name": stack,
            "label": STACK_NAMES.get(stack, stack),
            "numLayers": stats.num_layers(stack),
            "numHeads": stats.num_heads(stack),
        }
        for stack in sorted(stats.stacks, key=_stack_order)
    ]
    return {
        "format": "attnviz-atlas",
        "version": 1,
        "title": (title or (model_title(examples[0]) if examples else stats.model))
        + (" · norm-based attention α·‖f(x)‖, rows renormalised" if stats.weighting == "norm" else ""),
        "causal": stats.causal,
        "numExamples": stats.num_examples,
        "numTokens": stats.num_tokens,
        "columns": columns,
        "heads": rows,
        "stacks": stacks,
        "examples": [
            {"stacks": [stack_payload(example, stack, identity=identity) for stack in example.stacks]}
            for example in examples
        ],
    }


def atlas_html(
    stats: HeadStatistics, detection: Detection, examples: Sequence[AttentionCapture] = (), **options
) -> str:
    """The self-contained atlas page; options as :func:`atlas_payload`."""
    payload = atlas_payload(stats, detection, examples, **options)
    return build_page(f"attnviz head atlas · {payload['title']}", payload, ["common.js", "atlas.js"], ["style.css"])


def write_atlas(path: str | Path, stats: HeadStatistics, detection: Detection, examples=(), **options) -> Path:
    """Write :func:`atlas_html` to ``path`` (``.html``), atomically."""
    return write_page(path, atlas_html(stats, detection, examples, **options))
