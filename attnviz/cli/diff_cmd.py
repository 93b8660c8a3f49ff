"""``attnviz diff``: what changed between two models, checkpoints, precisions or inputs, head by head."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from attnviz.cli.options import (
    INPUT_PANEL,
    MODEL_PANEL,
    MODEL_SPECS,
    OUTPUT_PANEL,
    VIEW_PANEL,
    BatchSizeOption,
    DataOption,
    DeviceOption,
    DtypeOption,
    MaxLengthOption,
    MaxTokensPerBatchOption,
    NoTruncateOption,
    StackOption,
    TextOption,
    ToyExamplesOption,
    WeightingOption,
    parse_device,
    parse_dtype,
    stack_value,
)
from attnviz.cli.stats_options import LocalWindowOption
from attnviz.common.wording import plural

STDOUT = Path("-")
DIFF_PANEL = "Comparison"
FIGURE_AND_PAGE_SUFFIXES = (".png", ".svg", ".pdf", ".html", ".htm")


def diff(
    models: Annotated[
        list[str],
        typer.Argument(
            help=f"Model specs: A and B ({MODEL_SPECS}); more than two: checkpoints over training; one, with "
            "--against: two inputs on that model. Example: attnviz diff minilm pruned-minilm",
            show_default=False,
        ),
    ],
    data: DataOption = None,
    text: TextOption = None,
    against: Annotated[
        str | None,
        typer.Option(
            "--against",
            help="Compare one model on --text and on this text (a minimal pair). "
            'Example: --text "The keys to the cabinet are" --against "The keys to the cabinet is"',
            rich_help_panel=INPUT_PANEL,
            show_default=False,
        ),
    ] = None,
    by_statistics: Annotated[
        bool,
        typer.Option(
            "--by-statistics",
            help="Compare per-head statistics only (no divergence): for models whose heads or tokenizers differ. "
            "Example: --by-statistics",
            rich_help_panel=DIFF_PANEL,
        ),
    ] = False,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "auto",
    device_b: Annotated[
        str | None,
        typer.Option(
            "--device-b",
            parser=parse_device,
            metavar="<device>",
            help="Device of model B (default: --device). Example: --device-b cpu",
            rich_help_panel=MODEL_PANEL,
            show_default=False,
        ),
    ] = None,
    dtype_b: Annotated[
        str | None,
        typer.Option(
            "--dtype-b",
            parser=parse_dtype,
            metavar="<dtype>",
            help="Precision of model B (default: --dtype): compare a model with itself in another precision. "
            "Example: attnviz diff minilm minilm --dtype-b bfloat16",
            rich_help_panel=MODEL_PANEL,
            show_default=False,
        ),
    ] = None,
    batch_size: BatchSizeOption = 8,
    max_tokens_per_batch: MaxTokensPerBatchOption = None,
    max_length: MaxLengthOption = None,
    no_truncate: NoTruncateOption = False,
    toy_examples: ToyExamplesOption = 128,
    seed: Annotated[
        int,
        typer.Option("--seed", help="Seed of the toy task examples. Example: --seed 1", rich_help_panel=INPUT_PANEL),
    ] = 0,
    local_window: LocalWindowOption = 2,
    weighting: WeightingOption = "weights",
    stack: StackOption = None,
    layer: Annotated[
        int | None,
        typer.Option(
            "--layer",
            help="Two inputs: the layer the figure shows (default: that of the head that changed most). "
            "Example: --layer 3",
            rich_help_panel=VIEW_PANEL,
            show_default=False,
        ),
    ] = None,
    head: Annotated[
        int | None,
        typer.Option(
            "--head",
            min=0,
            help="Two inputs: the head the figure shows (default: the head that changed most). Example: --head 5",
            rich_help_panel=VIEW_PANEL,
            show_default=False,
        ),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            "--limit", "-n", min=0, help="Heads listed as changed most. Example: --limit 20", rich_help_panel=VIEW_PANEL
        ),
    ] = 10,
    json_path: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="Write the comparison as JSON (one entry per head; see docs/diff.md); '-' writes to stdout. "
            "Example: --json diff.json",
            rich_help_panel=OUTPUT_PANEL,
            show_default=False,
        ),
    ] = None,
    csv_path: Annotated[
        Path | None,
        typer.Option(
            "--csv",
            help="Write one row per head as CSV; '-' writes to stdout. Example: --csv diff.csv",
            rich_help_panel=OUTPUT_PANEL,
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Figure (.png, .svg, .pdf) or self-contained page (.html): the divergence grid of two models, "
            "A | B | B − A of two inputs, a line per head across checkpoints. Example: --out diff.html",
            rich_help_panel=OUTPUT_PANEL,
            show_default=False,
        ),
    ] = None,
) -> None:
    """What changed between two models, checkpoints, precisions or inputs: head by head.

    For every head present in both models: the mean Jensen–Shannon divergence (nats) and total variation between their attention over every query of every text, every statistic of 'attnviz stats' for A and B, and B − A. A pruned checkpoint's heads are matched to the original's by its pruning record.

    Examples:

      attnviz diff minilm pruned-minilm --json diff.json

      attnviz diff minilm minilm --dtype-b bfloat16

      attnviz diff smollm2 --text "The keys to the cabinet are" --against "The keys to the cabinet is" --out pair.html

      attnviz diff run/step-100 run/step-1000 run/step-5000 --out evolution.png
    """
    from attnviz.cli.stdin import corpus_from_options
    from attnviz.common.errors import InputError
    from attnviz.outputs.files import check_output_path

    if json_path == STDOUT and csv_path == STDOUT:
        raise InputError("only one of --json and --csv can write to stdout ('-')")
    for path, suffixes in ((json_path, (".json",)), (csv_path, (".csv",)), (out, FIGURE_AND_PAGE_SUFFIXES)):
        if path is not None and path != STDOUT:
            check_output_path(path, suffixes)
    if against is not None:
        if len(models) != 1:
            raise InputError(f"--against compares two inputs on one model: give one model spec, not {len(models)}")
        if not text or len(text) != 1 or data is not None:
            raise InputError('--against needs exactly one --text (input A) and no --data: --text "…" --against "…"')
    elif len(models) < 2:
        raise InputError(
            "give two model specs to compare (A B), more for checkpoints, or one with --text and --against"
        )
    if (layer is not None or head is not None) and against is None:
        raise InputError("--layer and --head choose the head the figure of two inputs shows: they apply with --against")
    texts = None if against is not None else corpus_from_options(data, text)
    stack_name = stack_value(stack)

    from attnviz.common.progress import status
    from attnviz.models.specs import load_model

    def load(spec: str, *, second: bool = False):
        with status(f"loading {spec}"):
            return load_model(
                spec,
                device=(device_b or device) if second else device,
                dtype=(dtype_b or dtype) if second else dtype,
            )

    result: Any
    options: dict[str, Any] = {
        "by_statistics": by_statistics,
        "batch_size": batch_size,
        "max_tokens_per_batch": max_tokens_per_batch,
        "max_length": max_length,
        "truncate": not no_truncate,
        "local_window": local_window,
        "toy_examples": toy_examples,
        "seed": seed,
        "weighting": weighting.value,
    }
    if against is not None and options["weighting"] != "weights":
        from attnviz.common.errors import InputError

        raise InputError("--weighting norm compares two models or checkpoints: --against compares inputs by weights")
    if against is not None:
        from attnviz.compare.inputs import compare_inputs

        assert text is not None
        loaded = load(models[0])
        _check_selection(loaded, stack_name, layer, head)  # before the comparison runs
        result = compare_inputs(loaded, text[0], against, max_length=max_length, local_window=local_window)
        _show_inputs(result, limit)
    elif len(models) == 2:
        from attnviz.compare.models import compare_models

        pair = (load(models[0]), load(models[1], second=True))
        for loaded in pair:
            _check_selection(loaded, stack_name, None, None)
        result = compare_models(*pair, texts, **options)
        _show_models(result, stack_name, limit)
    else:
        from attnviz.compare.checkpoints import compare_checkpoints

        result = compare_checkpoints(models, lambda spec: load(spec, second=spec != models[0]), texts, **options)
        _show_checkpoints(result, stack_name, limit)
    _write(result, json_path, csv_path, out, stack_name, layer, head)


def _check_selection(loaded, stack: str | None, layer: int | None, head: int | None) -> None:
    """Refuse a --stack, --layer or --head the model does not have, once its layout is known (before it runs)."""
    from attnviz.common.errors import InputError
    from attnviz.models.identity import model_identity

    stacks = loaded.stacks()
    if stack is not None and stack not in stacks:
        raise InputError(f"--stack {stack}: {loaded.name} has {', '.join(stacks)} attention only")
    chosen = stack or ("self" if "self" in stacks else stacks[0])
    layout = {site.layer: count for site, count in loaded.layout().items() if site.stack == chosen}
    if layer is not None and layer not in layout:
        raise InputError(f"--layer {layer} is out of range: {loaded.name} has layers 0–{max(layout)}")
    if head is not None:
        identity = model_identity(loaded)
        ids = {
            number
            for at, count in layout.items()
            if layer is None or at == layer
            for number in (identity.ids(chosen, at, count) if identity is not None else range(count))
        }
        if head not in ids:
            where = f"layer {layer}" if layer is not None else loaded.name
            raise InputError(f"--head {head} is out of range: {where} has heads {min(ids)}–{max(ids)}")


def _show_models(result, stack, limit) -> None:
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


def _show_checkpoints(result, stack, limit) -> None:
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


def _show_inputs(result, limit) -> None:
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


def _write(result, json_path, csv_path, out, stack, layer, head) -> None:
    from attnviz.compare.export import csv_text, json_text, write_csv, write_json

    record = result.record()
    written = []
    for path, text_of, writer in ((json_path, json_text, write_json), (csv_path, csv_text, write_csv)):
        if path == STDOUT:
            sys.stdout.write(text_of(record))
        elif path is not None:
            written.append(writer(path, record))
    if out is not None:
        written.append(_render(result, out, stack, layer, head))
    for path in written:
        if STDOUT in (json_path, csv_path):
            from attnviz.cli.console import console

            console.print(f"wrote {path}", highlight=False)
        else:
            print(path)


def _render(result, out: Path, stack, layer, head) -> Path:
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
        chosen = _chosen_head(result, stack or "self", layer, head)
        return save_figure(inputs_figure(result, stack=chosen[0], layer=chosen[1], head=chosen[2]), out)
    if isinstance(result, CheckpointComparison):
        return save_figure(checkpoints_figure(result, stack=stack), out)
    if result.mode != "patterns":
        raise InputError("--by-statistics computes no divergence to draw: write --json or --csv instead")
    return save_figure(divergence_figure(result, stack=stack), out)


def _chosen_head(result, stack: str, layer: int | None, head: int | None) -> tuple[str, int, int]:
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


def register(app: typer.Typer) -> None:
    """Add this command to ``app``."""
    app.command("diff")(diff)
