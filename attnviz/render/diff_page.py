"""The self-contained HTML page of ``attnviz diff`` (as the other pages: every script and datum inline).

Two models (or checkpoints): a layer × head grid coloured by any column and a sortable table of
every head (divergence, total variation, the B − A change of each statistic). Two inputs: for a
chosen head, A, B and B − A side by side, B − A on a diverging scale centred on 0.
"""

from __future__ import annotations

from pathlib import Path

from attnviz.common.wording import plural
from attnviz.compare.checkpoints import CheckpointComparison
from attnviz.compare.inputs import InputComparison
from attnviz.compare.result import ModelComparison
from attnviz.render.html_page import build_page, write_page
from attnviz.stats.definitions import STATISTICS

#: digits kept for pattern weights in the inputs page (it shows differences of weights: no 8-bit coding)
WEIGHT_DIGITS = 6


def _columns(include_divergence: bool) -> list[dict]:
    columns = []
    if include_divergence:
        columns += [
            {"name": "js_divergence", "help": "mean JS divergence, nats (≤ ln 2)", "scale": 1000, "signed": False},
            {"name": "total_variation", "help": "mean total variation (≤ 1)", "scale": 1000, "signed": False},
        ]
    columns += [
        {"name": f"Δ {s.name}", "help": f"B − A of {s.formula} ({s.unit})", "scale": 1, "signed": True}
        for s in STATISTICS
    ]
    return columns


def models_payload(comparison: ModelComparison | CheckpointComparison) -> dict:
    """JSON-ready data of the models page; checkpoints show JS and TV from the first, one column per checkpoint."""
    if isinstance(comparison, CheckpointComparison):
        columns: list[dict] = []
        values: dict[tuple, dict] = {}
        for result in comparison.from_first:
            for measure, label in (("js_divergence", "JS"), ("total_variation", "TV")):
                columns.append(
                    {
                        "name": f"{label} @ {result.model_b}",
                        "help": f"{measure} from {comparison.models[0]}",
                        "scale": 1000,
                        "signed": False,
                    }
                )
                for head in result.heads:
                    values.setdefault((head.site, head.head), {"status": head.status})[len(columns) - 1] = getattr(
                        head, measure
                    )
        heads = [
            {
                "stack": site.stack,
                "layer": site.layer,
                "head": head,
                "status": entry["status"],
                "values": [entry.get(i) for i in range(len(columns))],
            }
            for (site, head), entry in sorted(values.items())
        ]
        title = f"attnviz diff · {' → '.join(comparison.models)}"
        hint = "each column: a checkpoint against the first; JS divergence in nats, total variation in [0, 1]"
        return {"kind": "models", "title": title, "hint": hint, "columns": columns, "heads": heads}
    columns = _columns(comparison.mode == "patterns")
    heads = []
    for head in comparison.heads:
        record = head.record()
        delta = record["delta"] or {}
        numbers = [record["js_divergence"], record["total_variation"]] if comparison.mode == "patterns" else []
        numbers += [delta.get(s.name) for s in STATISTICS]
        heads.append(
            {
                "stack": head.site.stack,
                "layer": head.site.layer,
                "head": head.head,
                "status": head.status,
                "values": numbers,
            }
        )
    title = f"attnviz diff · {comparison.model_b} (B) against {comparison.model_a} (A)"
    hint = (
        f"{plural(comparison.texts_compared, 'text')}, {plural(comparison.stats_a.num_tokens, 'token')}; JS divergence in nats (≤ ln 2), "
        "Δ = B − A of each statistic's mean"
    )
    return {"kind": "models", "title": title, "hint": hint, "columns": columns, "heads": heads}


def inputs_payload(comparison: InputComparison) -> dict:
    """JSON-ready data of the inputs page: every site's patterns of A and B on the common grid, and JS per head."""
    sites = []
    best = (-1.0, "self", 0, 0)
    for site in comparison.sites:
        if site not in comparison.patterns_a:
            continue
        js, tv = comparison.query_divergence(site.stack, site.layer)  # [h, n]
        js_mean, tv_mean = js.double().mean(-1), tv.double().mean(-1)  # [h]
        for head in range(js_mean.shape[0]):
            if float(js_mean[head]) > best[0]:
                best = (float(js_mean[head]), site.stack, site.layer, head)
        sites.append(
            {
                "stack": site.stack,
                "layer": site.layer,
                "heads": comparison.stats_a.original_ids(site),
                "a": comparison.patterns_a[site].double().round(decimals=WEIGHT_DIGITS).tolist(),
                "b": comparison.patterns_b[site].double().round(decimals=WEIGHT_DIGITS).tolist(),
                "js": [round(float(v), 7) for v in js_mean],
                "tv": [round(float(v), 7) for v in tv_mean],
            }
        )
    return {
        "kind": "inputs",
        "title": f"attnviz diff · {comparison.model}: two inputs",
        "hint": f"aligned by {comparison.alignment}; B − A on a diverging scale centred on 0 (blue: lower in B, red: higher)",
        "textA": comparison.text_a,
        "textB": comparison.text_b,
        "labelsA": comparison.labels_a,  # each panel is labelled with its own side's tokens
        "labelsB": comparison.labels_b,
        "alignment": comparison.alignment,
        "sites": sites,
        "best": {"stack": best[1], "layer": best[2], "head": best[3]},
    }


def diff_html(comparison: ModelComparison | CheckpointComparison | InputComparison) -> str:
    payload = inputs_payload(comparison) if isinstance(comparison, InputComparison) else models_payload(comparison)
    return build_page(payload["title"], payload, ["common.js", "diff.js"], ["style.css"])


def write_diff_page(path: str | Path, comparison: ModelComparison | CheckpointComparison | InputComparison) -> Path:
    """Write :func:`diff_html` to ``path`` (``.html``), atomically."""
    return write_page(path, diff_html(comparison))
