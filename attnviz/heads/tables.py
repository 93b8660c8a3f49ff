"""Terminal views of head functions: the per-head table and the layer × head grid of main labels.

Each function returns a rich renderable; printing is the caller's business.
"""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text

from attnviz.common.wording import plural
from attnviz.heads.labels import SCORE_NAMES
from attnviz.heads.result import HeadFunctions
from attnviz.heads.scores import SCORE_INDEX
from attnviz.stats.tables import per_head_table, tag_text

HEADERS = {"induction": "induct", "duplicate_token": "dup", "previous_token": "prev", "next_token": "next"}

#: Grid cells: a short code and a style per main label (corpus flags included).
LABEL_CODES: dict[str, tuple[str, str]] = {
    "induction": ("IND", "bold black on rgb(253,231,37)"),
    "duplicate-token": ("DUP", "bold black on rgb(94,201,98)"),
    "previous-token": ("PRV", "bold white on rgb(59,82,139)"),
    "next-token": ("NXT", "bold white on rgb(33,145,140)"),
    "first-token-sink": ("snk", "white on rgb(90,90,90)"),
    "special-token": ("spc", "white on rgb(90,90,90)"),
    "diagonal": ("dia", "white on rgb(68,1,84)"),
    "local": ("loc", "white on rgb(68,1,84)"),
    "collapsed": ("col", "red"),
    "unfocused": ("unf", "blue"),
}


def _format(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.2f}"


def head_rows(
    result: HeadFunctions,
    *,
    stack: str,
    labelled_only: bool = False,
    sort: str | None = None,
    descending: bool = True,
    limit: int | None = None,
) -> list[tuple[int, int, dict[str, float], tuple[str, ...]]]:
    """``(layer, head, scores, labels)`` of ``stack``, filtered and sorted (NaN last)."""
    rows = []
    for site, head in result.heads(stack):
        labels = result.labels(site, head)
        if labelled_only and not labels:
            continue
        rows.append((site.layer, head, result.head_scores(site, head), labels))
    if sort is not None:
        name = SCORE_NAMES[SCORE_INDEX[sort]]
        sign = -1.0 if descending else 1.0
        rows.sort(
            key=lambda row: (math.isnan(row[2][name]), sign * row[2][name] if not math.isnan(row[2][name]) else 0)
        )
    return rows[:limit] if limit is not None else rows


def head_table(result: HeadFunctions, rows, *, stack: str) -> Table:
    """One row per head: the probe scores and the labels."""
    probe = result.probe
    scores = [name for name in SCORE_NAMES if not all(math.isnan(row[2][name]) for row in rows)] or list(SCORE_NAMES)
    title = f"{result.model} · {stack} attention · probes: {probe.sequences} × (2 × {probe.length} random tokens)" + (
        f" · corpus: {plural(result.statistics.num_examples, 'example')}" if result.statistics is not None else ""
    )
    caption = (
        "induct: weight on the token after the earlier occurrence · dup: on the earlier occurrence · "
        "prev / next: on position i − 1 / i + 1 (random tokens)"
    )
    table = per_head_table(title, caption, [HEADERS[name] for name in scores], "labels")
    for layer, head, values, labels in rows:
        text = tag_text((label, "bold" if label.replace("-", "_") in SCORE_INDEX else "") for label in labels)
        table.add_row(str(layer), str(head), *(_format(values[name]) for name in scores), text)
    return table


def label_grid(result: HeadFunctions, *, stack: str) -> Text:
    """A layer × head grid of each head's main label (short codes, legend underneath)."""
    layers = result.layers(stack)
    heads = result.num_heads(stack)
    text = Text(f"main label by layer (rows) and head (columns) · {stack} attention\n", style="bold")
    text.append("      " + "".join(f"{head:>4}" for head in range(heads)) + "\n", style="dim")
    used: list[str] = []
    for site in layers:
        text.append(f"{site.layer:>5} ", style="dim")
        for head in range(heads):
            if head >= result.scores[site].shape[1]:
                text.append("    ")
                continue
            label = result.main_label(site, head)
            if label is None:
                text.append("  · ", style="dim")
                continue
            code, style = LABEL_CODES.get(label, (label[:3], ""))
            if label not in used:
                used.append(label)
            text.append(" ")
            text.append(code, style=style)
        text.append("\n")
    if used:
        text.append("  ".join(f"{LABEL_CODES.get(label, (label[:3], ''))[0]} {label}" for label in used), style="dim")
        text.append("\n")
    return text


def summary_line(result: HeadFunctions, *, stack: str) -> str:
    """How many heads carry each probe label, and the top induction heads."""
    from attnviz.heads.labels import LABELS

    counts = {label: 0 for label in LABELS.values()}
    total = 0
    for site, head in result.heads(stack):
        total += 1
        for label in result.labels(site, head):
            if label in counts:
                counts[label] += 1
    parts = ", ".join(f"{count} {label}" for label, count in counts.items() if count)
    top = [f"L{site.layer}H{head} {value:.2f}" for site, head, value in result.ranking("induction", stack)[:3]]
    return f"{stack} attention, {plural(total, 'head')}: {parts or 'no probe labels'} · top induction: {', '.join(top)}"
