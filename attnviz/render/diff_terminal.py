"""``attnviz diff`` in the terminal: a layer × head grid of the divergence and the heads that changed most.

Rendering only: it reads a :class:`~attnviz.compare.result.ModelComparison` (or an input
comparison's record) and returns rich renderables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from attnviz.common.wording import plural
from attnviz.compare.result import ModelComparison

#: the unit of the divergence grid and of the most-changed table's JS and TV columns
THOUSANDTHS = "10⁻³"
#: statistics shown as Δ columns of the most-changed table (the rest are in the JSON and CSV)
DELTA_COLUMNS = ("entropy", "max_weight", "mean_distance", "first_token", "previous_token")
#: status marks in the grid
STATUS_MARKS = {"only_a": "  A  ", "only_b": "  B  "}


def _colour(fraction: float) -> str:
    import matplotlib

    r, g, b, _ = matplotlib.colormaps["magma"](min(max(fraction, 0.0), 1.0))
    return f"rgb({int(r * 255)},{int(g * 255)},{int(b * 255)})"


def divergence_grid(comparison: ModelComparison, *, stack: str | None = None, measure: str = "js_divergence") -> Text:
    """Layer × head grid of ``measure`` in 10⁻³ nats (JS) or 10⁻³ (TV); ``A``/``B``: the head is in one model only."""
    stack = stack or comparison.stacks[0]
    matrix = comparison.matrix(measure, stack)  # [layer, original head]
    finite = matrix[~matrix.isnan()]
    top = float(finite.max()) if finite.numel() else 0.0
    unit = f"{THOUSANDTHS} nats" if measure == "js_divergence" else THOUSANDTHS
    text = Text(
        f"{measure.replace('_', ' ')} ({unit}) of {comparison.model_b} against {comparison.model_a}, by layer (rows) "
        "and head (columns); A: head only in A, B: only in B\n",
        style="bold",
    )
    text.append("      " + "".join(f"{head:>6}" for head in range(matrix.shape[1])) + "\n", style="dim")
    status = {(h.site.layer, h.head): h.status for h in comparison.heads if h.site.stack == stack}
    for row, site in enumerate(comparison.sites(stack)):
        text.append(f"{site.layer:>5} ", style="dim")
        for head in range(matrix.shape[1]):
            value = float(matrix[row, head])
            mark = STATUS_MARKS.get(status.get((site.layer, head), ""))
            if mark is not None:
                text.append(" " + mark, style="bold yellow")
            elif math.isnan(value):
                text.append("      ")
            else:
                fraction = value / top if top > 0 else 0.0
                foreground = "black" if fraction > 0.55 else "white"
                text.append(" ")
                text.append(f"{value * 1000:5.2f}", style=f"{foreground} on {_colour(fraction)}")
        text.append("\n")
    return text


def most_changed_table(
    comparison: ModelComparison, *, count: int = 10, measure: str = "js_divergence", width: int = 100
) -> Table:
    """The ``count`` matched heads with the largest ``measure``, with JS, TV and as many statistic deltas as fit ``width``."""
    deltas = DELTA_COLUMNS[: max(1, (width - 40) // 12)]
    one_stack = len(comparison.stacks) == 1
    table = Table(
        box=box.SIMPLE_HEAD,
        title=f"heads that changed most ({measure.replace('_', ' ')})",
        caption=f"JS and TV in {THOUSANDTHS}, as in the grid (JS is at most ln 2 = 0.693 nats); "
        "Δ: B − A of the mean over every query",
    )
    headers = ("layer", "head", f"JS ({THOUSANDTHS} nats)", f"TV ({THOUSANDTHS})", *(f"Δ {name}" for name in deltas))
    for header in headers if one_stack else ("stack", *headers):
        table.add_column(header, justify="left" if header == "stack" else "right", no_wrap=True)
    entries = comparison.most_changed(count, measure)
    js = ranked_numbers([entry.js_divergence for entry in entries])
    tv = ranked_numbers([entry.total_variation for entry in entries])
    for index, entry in enumerate(entries):
        delta = entry.delta or {}
        cells = [
            str(entry.site.layer),
            str(entry.head),
            js[index],
            tv[index],
            *(_format(delta.get(name), signed=True) for name in deltas),
        ]
        table.add_row(*(cells if one_stack else [entry.site.stack, *cells]))
    return table


def ranked_numbers(
    values: Sequence[float | None], *, scale: float = 1000.0, least: int = 2, most: int = 9
) -> list[str]:
    """``values`` times ``scale`` (thousandths, as the grid), each printed with the fewest decimals (at least
    ``least``) at which values that differ print differently, so a ranking reads in the order it was made
    (a bfloat16 diff's divergences are all below 10⁻⁴ nats: at four decimals every row would read 0.0000)."""
    finite = sorted({value for value in values if value is not None and not math.isnan(value)})
    decimals = next(
        (
            places
            for places in range(least, most + 1)
            if len({f"{value * scale:.{places}f}" for value in finite}) == len(finite)
        ),
        most,
    )
    return ["–" if value is None or math.isnan(value) else f"{value * scale:.{decimals}f}" for value in values]


def summary_lines(comparison: ModelComparison) -> list[str]:
    """What was compared, and the heads present in one model only."""
    lines = [
        f"{comparison.model_a} (A) against {comparison.model_b} (B): {plural(comparison.texts_compared, 'text')}, "
        f"{plural(comparison.stats_a.num_tokens, 'token')}"
        + (
            f"; {plural(comparison.texts_skipped, 'text')} left out (tokenised differently)"
            if comparison.texts_skipped
            else ""
        )
        + ("; statistics only (--by-statistics)" if comparison.mode == "statistics" else "")
        + ("; norm-based attention α·‖f(x)‖, rows renormalised to sum 1" if comparison.weighting == "norm" else "")
    ]
    for status, where in (("only_a", "only in A"), ("only_b", "only in B")):
        heads = comparison.only(status)  # type: ignore[arg-type]
        if heads:
            named = ", ".join(f"L{layer} H{head}" for _, layer, head in heads[:24])
            lines.append(f"{plural(len(heads), 'head')} {where}: {named}" + (" …" if len(heads) > 24 else ""))
    return lines


def _format(value: float | None, *, signed: bool = False) -> str:
    if value is None or math.isnan(value):
        return "–"
    return f"{value:+.4f}" if signed else f"{value:.4f}"
