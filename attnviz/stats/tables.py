"""Terminal views of per-head statistics: the per-head table, the layer × head overview, summaries.

Each function returns a rich renderable (or lines); printing is the caller's business.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from rich.table import Table
from rich.text import Text

from attnviz.common.wording import plural
from attnviz.stats.carriers import CARRIER_FIELDS
from attnviz.stats.definitions import STATISTIC_NAMES, statistic_index
from attnviz.stats.detect import FLAGS, PROBLEM_FLAGS, Detection
from attnviz.stats.result import HeadStatistics

#: Short column headers of the per-head table (explained in the table's caption).
HEADERS: dict[str, str] = {
    "entropy": "ent",
    "normalized_entropy": "nent",
    "max_weight": "maxw",
    "mean_distance": "dist",
    "normalized_distance": "ndist",
    "diagonal": "diag",
    "previous_token": "prev",
    "local_ratio": "local",
    "first_token": "first",
    "special_tokens": "spec",
    "sink_share": "sinkw",
    "first_value_norm": "‖f₀‖",
    "other_value_norm": "‖f‖",
    "first_token_weight_share": "w₀",
    "first_token_norm_share": "n₀",
}

#: What each column header means, printed under the table.
LEGEND: dict[str, str] = {
    "entropy": "ent entropy (nats)",
    "normalized_entropy": "nent normalized entropy",
    "max_weight": "maxw max weight",
    "mean_distance": "dist mean distance (tokens)",
    "normalized_distance": "ndist normalized distance",
    "diagonal": "diag mass on own position",
    "previous_token": "prev on previous token",
    "local_ratio": "local on ±w window",
    "first_token": "first on first token",
    "special_tokens": "spec on special tokens",
    "sink_share": "sinkw on the learned attention sink",
    "first_value_norm": "‖f₀‖ first token's value norm ‖f(x₀)‖",
    "other_value_norm": "‖f‖ other tokens' mean value norm",
    "first_token_weight_share": "w₀ first token's share of the weights",
    "first_token_norm_share": "n₀ its share of the norm-weighted mass",
}
FLAG_LEGEND = "flags: sink first-token sink, spec special-token, prev previous-token, diag diagonal"

#: Columns kept when the terminal is too narrow for all of them (the rest are in --json/--csv).
COMPACT_STATISTICS = (
    "normalized_entropy",
    "max_weight",
    "normalized_distance",
    "diagonal",
    "previous_token",
    "first_token",
    "special_tokens",
)
#: Terminal width below which :data:`COMPACT_STATISTICS` are shown instead of all statistics.
FULL_TABLE_WIDTH = 100

#: Flags as the table writes them (to keep the row on one line of a narrow terminal).
_FLAG_LABELS = {"first-token-sink": "sink", "special-token": "spec", "previous-token": "prev", "diagonal": "diag"}

_FLAG_STYLES = {"collapsed": "bold red", "unfocused": "bold blue"}
#: Overview cell markers for the problem flags.
_PROBLEM_MARKS = {"collapsed": "×", "unfocused": "○"}


def _format(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.2f}" if value < 10 else f"{value:.1f}"


#: Marks a head that pruning removed but kept in the weights with zeroed output (grouped-query attention).
MASKED_FLAG = "masked-by-pruning"


def head_rows(
    stats: HeadStatistics,
    detection: Detection,
    *,
    stack: str = "self",
    flagged_only: bool = False,
    sort: str | None = None,
    descending: bool = True,
    limit: int | None = None,
) -> list[tuple[int, int, dict[str, float], tuple[str, ...]]]:
    """``(layer, head, means, flags)`` rows of ``stack``, filtered and sorted as asked.

    ``flagged_only`` keeps heads with any flag; ``sort`` orders by a statistic (NaN last).
    """
    rows = []
    for site, head, values in stats.heads():
        if site.stack != stack:
            continue
        flags = detection.flags[site][head]
        if flagged_only and not flags:
            continue
        if stats.is_masked(site, head):  # pruned away, kept in the weights with zeroed output
            flags = (*flags, MASKED_FLAG)
        if stats.carriers is not None:  # what each token carries, next to the statistics
            values = {**values, **stats.carriers.head(site, head)}
        rows.append((site.layer, stats.original_head(site, head), values, flags))
    if sort is not None:
        name = STATISTIC_NAMES[statistic_index(sort)]
        sign = -1.0 if descending else 1.0
        rows.sort(
            key=lambda row: (math.isnan(row[2][name]), sign * row[2][name] if not math.isnan(row[2][name]) else 0)
        )
    return rows[:limit] if limit is not None else rows


def plain_table(title: str, *, caption: str | None = None, collapse_padding: bool = False) -> Table:
    """An empty rich table of numbers without a box or padding at its edges (it fits a narrow terminal and copies
    as plain text), title and caption flush left, headers in bold; ``collapse_padding`` keeps one space between
    columns where there would be two."""
    return Table(
        title=title,
        title_justify="left",
        caption=caption,
        caption_justify="left",
        header_style="bold",
        box=None,
        pad_edge=False,
        collapse_padding=collapse_padding,
    )


def per_head_table(title: str, caption: str, headers: Sequence[str], tag_header: str) -> Table:
    """An empty rich table with one row per head: layer, head, one number column per header, then tags."""
    table = plain_table(title, caption=caption)
    table.add_column("layer", justify="right", no_wrap=True)
    table.add_column("head", justify="right", no_wrap=True)
    for header in headers:
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column(tag_header, overflow="fold", min_width=15)
    return table


def tag_text(tags: Iterable[tuple[str, str]]) -> Text:
    """``(label, style)`` pairs as one comma-separated rich text (flags, labels)."""
    text = Text()
    for index, (label, style) in enumerate(tags):
        if index:
            text.append(", ")
        text.append(label, style=style)
    return text


def head_table(stats: HeadStatistics, rows, *, stack: str = "self", statistics: tuple[str, ...] | None = None) -> Table:
    """The per-head table: one row per head, the mean of each statistic (all by default), and the flags.

    The sink share is shown only for a model with attention sinks (elsewhere it is 0 throughout)."""
    statistics = shown_statistics(stats, STATISTIC_NAMES if statistics is None else statistics, stack)
    if stats.carriers is not None and tuple(statistics) == shown_statistics(stats, STATISTIC_NAMES, stack):
        # the full table: room for them
        statistics = (*statistics, *CARRIER_FIELDS)
    image_queries = stats.image is not None and stack in ("self", "encoder")  # distances on the patch grid
    queries = plural(stats.stack_tokens(stack), "image token" if image_queries else "token")
    title = f"{stats.model} · {stack} attention · {plural(stats.num_examples, 'example')}, {queries}"
    if stats.weighting == "norm":
        title += " · norm-based (α·‖f(x)‖, rows renormalised to sum 1)"
    legend = {**LEGEND, "mean_distance": "dist mean distance (patches on the grid)"} if image_queries else LEGEND
    caption = " · ".join(legend[name] for name in statistics) + " · " + FLAG_LEGEND
    table = per_head_table(title, caption, [HEADERS[name] for name in statistics], "flags")
    for layer, head, values, flags in rows:
        flag_text = tag_text((_FLAG_LABELS.get(flag, flag), _FLAG_STYLES.get(flag, "")) for flag in flags)
        table.add_row(str(layer), str(head), *(_format(values.get(name, math.nan)) for name in statistics), flag_text)
    return table


def shown_statistics(stats: HeadStatistics, statistics: Sequence[str], stack: str) -> tuple[str, ...]:
    """``statistics`` without ``sink_share`` where no head of ``stack`` gives a learned sink any weight."""
    if "sink_share" not in statistics or bool((stats.matrix("sink_share", stack).nan_to_num() > 0).any()):
        return tuple(statistics)
    return tuple(name for name in statistics if name != "sink_share")


def table_statistics(width: int) -> tuple[str, ...]:
    """The statistics a per-head table shows on a terminal ``width`` characters wide."""
    return STATISTIC_NAMES if width >= FULL_TABLE_WIDTH else COMPACT_STATISTICS


def _colour(fraction: float) -> str:
    """A dark-blue → teal → yellow ramp (viridis-like) for ``fraction`` in [0, 1]."""
    stops = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]
    fraction = min(1.0, max(0.0, fraction)) * (len(stops) - 1)
    low = int(fraction)
    high = min(low + 1, len(stops) - 1)
    t = fraction - low
    r, g, b = (round(a + (c - a) * t) for a, c in zip(stops[low], stops[high]))
    return f"rgb({r},{g},{b})"


def overview(stats: HeadStatistics, detection: Detection, statistic: str, *, stack: str = "self") -> Text:
    """A compact layer × head grid of one statistic, coloured by value; × collapsed, ○ unfocused."""
    name = STATISTIC_NAMES[statistic_index(statistic)]
    matrix = stats.original_matrix(name, stack)  # [layer, original head]: pruning never renumbers heads
    finite = matrix[~matrix.isnan()]
    top = float(finite.max()) if name in ("entropy", "mean_distance") and finite.numel() else 1.0
    text = Text(f"{name} by layer (rows) and head (columns); × collapsed, ○ unfocused\n", style="bold")
    text.append("      " + "".join(f"{head:>5}" for head in range(matrix.shape[1])) + "\n", style="dim")
    for site in stats.layers(stack):
        row = site.layer
        text.append(f"{site.layer:>5} ", style="dim")
        position = {original: head for head, original in enumerate(stats.original_ids(site))}
        for column in range(matrix.shape[1]):
            value = float(matrix[row, column])
            if math.isnan(value):
                text.append("     ")
                continue
            head = position.get(column, column)
            flags = detection.flags[site][head] if head < len(detection.flags[site]) else ()
            mark = next((_PROBLEM_MARKS[f] for f in PROBLEM_FLAGS if f in flags), " ")
            fraction = value / top if top > 0 else 0.0
            foreground = "black" if fraction > 0.55 else "white"
            text.append(f"{value:4.2f}{mark}", style=f"{foreground} on {_colour(fraction)}")
        text.append("\n")
    return text


def layer_summary(stats: HeadStatistics, detection: Detection, *, stack: str = "self") -> list[str]:
    """One line per layer with flagged heads (counts per flag), then a total line."""
    lines = []
    total: Counter = Counter()
    heads = 0
    for site in stats.layers(stack):
        counts = detection.counts(site)
        heads += len(detection.flags[site])
        total.update(counts)
        if counts:
            parts = ", ".join(f"{counts[flag]} {flag}" for flag in FLAGS if counts[flag])
            lines.append(f"layer {site.layer:>2}: {parts}")
    problems = ", ".join(f"{total[flag]} {flag}" for flag in PROBLEM_FLAGS)
    labels = ", ".join(f"{total[flag]} {flag}" for flag in FLAGS if flag not in PROBLEM_FLAGS and total[flag])
    lines.append(f"{stack} attention, {plural(heads, 'head')}: {problems}" + (f"; {labels}" if labels else ""))
    if stats.weighting == "norm":
        lines.append(
            "statistics of norm-based attention: each weight times the norm of the value vector it moves, "
            "α_ij·‖f_h(x_j)‖, rows renormalised to sum 1"
        )
    carried = carrier_summary(stats, stack)
    if carried:
        lines.append(carried)
    return lines


def carrier_summary(stats: HeadStatistics, stack: str = "self") -> str:
    """One line on what the first token carries, averaged over the heads of ``stack`` ("" when not measured)."""
    if stats.carriers is None:
        return ""
    means = {name: stats.carriers.matrix(name, stack).nanmean().item() for name in CARRIER_FIELDS}
    if any(math.isnan(value) for value in means.values()):
        return ""
    return (
        f"first token, mean over heads: {means['first_token_weight_share']:.0%} of the weights but "
        f"{means['first_token_norm_share']:.0%} of the norm-weighted mass; value norm ‖f(x₀)‖ "
        f"{means['first_value_norm']:.2f} vs {means['other_value_norm']:.2f} for the other tokens"
    )


def evolution_table(
    results: list[tuple[HeadStatistics, Detection]],
    stack: str | None = None,
    *,
    statistics: tuple[str, ...] | None = None,
) -> Table:
    """Across checkpoints: mean of each statistic over all heads of ``stack``, and problem-head counts."""
    statistics = STATISTIC_NAMES if statistics is None else statistics
    # the sink share where some checkpoint has attention sinks
    shown = {name for stats, _ in results for name in shown_statistics(stats, statistics, stack or stats.stacks[0])}
    statistics = tuple(name for name in statistics if name in shown)
    table = plain_table("across checkpoints (mean over heads)")
    table.add_column("checkpoint", no_wrap=True)
    for name in statistics:
        table.add_column(HEADERS[name], justify="right", no_wrap=True)
    table.add_column("coll.", justify="right", no_wrap=True)  # collapsed heads
    table.add_column("unf.", justify="right", no_wrap=True)  # unfocused heads
    for stats, detection in results:
        name_of_stack = stack or stats.stacks[0]
        means = []
        for name in statistics:
            matrix = stats.matrix(name, name_of_stack)
            finite = matrix[~matrix.isnan()]
            means.append(f"{float(finite.mean()):.2f}" if finite.numel() else "–")
        sites = stats.layers(name_of_stack)
        collapsed = sum(detection.counts(site)["collapsed"] for site in sites)
        unfocused = sum(detection.counts(site)["unfocused"] for site in sites)
        label = stats.model.rstrip("/").rsplit("/", 1)[-1] or stats.model
        table.add_row(label, *means, str(collapsed), str(unfocused))
    return table
