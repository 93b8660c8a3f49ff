"""What ``attnviz diff`` shows and writes: the terminal summary of two models, a run of checkpoints or two inputs,
and the files asked for (JSON and CSV, ``-`` for standard output; a figure or a page)."""

from __future__ import annotations

from pathlib import Path

from attnviz.cli.documents import name_written, write_documents
from attnviz.common.wording import plural


def show_models(result, stack, limit) -> None:
    from attnviz.cli.console import console
    from attnviz.render.diff_terminal import divergence_grid, most_changed_table, summary_lines

    for line in summary_lines(result):
        console.print(line, highlight=False)
    if result.mode == "patterns":
        for name in [stack] if stack else result.stacks:
            console.print(divergence_grid(result, stack=name))
    if limit:
        measure = "js_divergence" if result.mode == "patterns" else "delta:entropy"
        console.print(most_changed_table(result, count=limit, measure=measure, width=console.width))


def show_checkpoints(result, stack, limit) -> None:
    from attnviz.cli.console import console
    from attnviz.render.diff_terminal import divergence_grid

    for pair in result.consecutive:
        console.print(f"{pair.model_a} → {pair.model_b}", style="bold", highlight=False)
        if pair.mode == "patterns":
            console.print(divergence_grid(pair, stack=stack))
    last = result.from_first[-1]
    if last is not result.consecutive[0] and last.mode == "patterns":
        console.print(f"{last.model_a} → {last.model_b} (first against last)", style="bold", highlight=False)
        console.print(divergence_grid(last, stack=stack))


def show_inputs(result, limit) -> None:
    from rich.table import Table

    from attnviz.cli.console import console
    from attnviz.render.diff_terminal import THOUSANDTHS, ranked_numbers

    console.print(
        f"{result.model}: A = {result.text_a!r} ({plural(len(result.capture_a.tokens), 'token')}), B = {result.text_b!r} "
        f"({plural(len(result.capture_b.tokens), 'token')}); aligned by {result.alignment}",
        highlight=False,
    )
    heads = [h for h in result.heads() if h["js_divergence"] is not None]
    if not heads:
        console.print("no word in common: statistics only (see --json)", highlight=False)
        return
    table = Table(
        title="heads whose pattern changed most",
        caption=f"JS, TV: mean over the queries of the common grid, in {THOUSANDTHS}",
    )
    for column in (
        "stack",
        "layer",
        "head",
        f"JS ({THOUSANDTHS} nats)",
        f"TV ({THOUSANDTHS})",
        "Δ entropy",
        "Δ max weight",
    ):
        table.add_column(column, justify="left" if column == "stack" else "right")
    ranked = sorted(heads, key=lambda entry: -entry["js_divergence"])[:limit]
    js = ranked_numbers([h["js_divergence"] for h in ranked])
    tv = ranked_numbers([h["total_variation"] for h in ranked])
    for index, h in enumerate(ranked):
        table.add_row(
            h["stack"],
            str(h["layer"]),
            str(h["head"]),
            js[index],
            tv[index],
            f"{h['delta']['entropy']:+.4f}",
            f"{h['delta']['max_weight']:+.4f}",
        )
    console.print(table)


def write_outputs(result, json_path, csv_path, out, stack, layer, head) -> None:
    from attnviz.compare.export import csv_text, json_text, write_csv, write_json

    written = write_documents(
        result.record(), json_path, csv_path, as_json=(json_text, write_json), as_csv=(csv_text, write_csv)
    )
    if out is not None:
        written.append(render_figure(result, out, stack, layer, head))
    name_written(written, json_path, csv_path)


def render_figure(result, out: Path, stack, layer, head) -> Path:
    from attnviz.common.errors import InputError
    from attnviz.compare.checkpoints import CheckpointComparison
    from attnviz.compare.inputs import InputComparison
    from attnviz.render.diff_plots import checkpoints_figure, divergence_figure, inputs_figure
    from attnviz.render.stats_plots import save_figure

    if out.suffix.lower() in (".html", ".htm"):
        from attnviz.render.diff_page import write_diff_page

        return write_diff_page(out, result)
    if isinstance(result, InputComparison):
        if not result.patterns_a:
            raise InputError(
                "the two inputs share no word: there is no common grid to draw (see --json for statistics)"
            )
        chosen = chosen_head(result, stack or "self", layer, head)
        return save_figure(inputs_figure(result, stack=chosen[0], layer=chosen[1], head=chosen[2]), out)
    if isinstance(result, CheckpointComparison):
        return save_figure(checkpoints_figure(result, stack=stack), out)
    if result.mode != "patterns":
        raise InputError("--by-statistics computes no divergence to draw: write --json or --csv instead")
    return save_figure(divergence_figure(result, stack=stack), out)


def chosen_head(result, stack: str, layer: int | None, head: int | None) -> tuple[str, int, int]:
    """The (stack, layer, head position) the inputs figure shows: the one given, else the most changed."""
    from attnviz.common.errors import InputError

    layers = [site.layer for site in result.sites if site.stack == stack]
    if layer is not None and layer not in layers:
        raise InputError(f"--layer {layer} is out of range: {result.model} has layers 0–{max(layers)}")
    candidates = [h for h in result.heads() if h["stack"] == stack and (layer is None or h["layer"] == layer)]
    if head is not None:
        ids = {h["head"] for h in candidates}
        if head not in ids:
            raise InputError(f"--head {head} is out of range: the layer has heads {min(ids)}–{max(ids)}")
        candidates = [h for h in candidates if h["head"] == head]
    best = max(candidates, key=lambda h: h["js_divergence"] or 0.0)
    from attnviz.core import AttentionSite

    position = result.stats_a.original_ids(AttentionSite(stack, best["layer"])).index(best["head"])
    return stack, best["layer"], position
