"""``attnviz stats``: per-head statistics over a corpus, problem-head flags, tables, JSON/CSV and plots."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.options import (
    INPUT_PANEL,
    OUTPUT_PANEL,
    DataOption,
    DeviceMapOption,
    DeviceOption,
    DtypeOption,
    MaxLengthOption,
    MaxTokensPerBatchOption,
    NoTruncateOption,
    StackChoice,
    TextOption,
    stack_value,
)

STATS_PANEL = "Statistics"
#: ``--json -`` / ``--csv -``: write the document to stdout
STDOUT = Path("-")
DETECT_PANEL = "Detection thresholds (override the preset)"
VIEW_PANEL = "What to show"


def _threshold(option: str, help_text: str):
    return Annotated[
        float | None,
        typer.Option(option, help=help_text, rich_help_panel=DETECT_PANEL, show_default=False),
    ]


def stats(
    checkpoints: Annotated[
        list[str] | None,
        typer.Argument(
            help="Model spec(s): 'minilm' (default), 'smollm2', a Hugging Face directory, a .gguf file, a hub id "
            "in the local cache, or an attnviz toy/pruned checkpoint. Several give an evolution plot. "
            "Example: attnviz stats ckpt_a ckpt_b ckpt_c",
            show_default=False,
        ),
    ] = None,
    data: DataOption = None,
    text: TextOption = None,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            "-b",
            help="Examples per forward pass. Example: --batch-size 16",
            rich_help_panel=INPUT_PANEL,
        ),
    ] = 8,
    max_tokens_per_batch: MaxTokensPerBatchOption = None,
    toy_examples: Annotated[
        int,
        typer.Option(
            "--toy-examples",
            help="Toy checkpoints without --data: task examples to draw. Example: --toy-examples 256",
            rich_help_panel=INPUT_PANEL,
        ),
    ] = 128,
    seed: Annotated[
        int,
        typer.Option("--seed", help="Seed of the toy task examples. Example: --seed 1", rich_help_panel=INPUT_PANEL),
    ] = 0,
    max_length: MaxLengthOption = None,
    no_truncate: NoTruncateOption = False,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "auto",
    device_map: DeviceMapOption = None,
    local_window: Annotated[
        int,
        typer.Option(
            "--local-window",
            "-w",
            help="w of local_ratio: mass within ±w positions. Example: -w 3",
            rich_help_panel=STATS_PANEL,
        ),
    ] = 2,
    stack: Annotated[
        StackChoice | None,
        typer.Option(
            "--stack",
            help="Encoder-decoder models: encoder, decoder or cross (default: all). Example: --stack decoder",
            rich_help_panel=VIEW_PANEL,
        ),
    ] = None,
    preset: Annotated[
        str,
        typer.Option(
            "--preset",
            help="Threshold set: 'normalized' (length-independent, default) or 'seed' (collapsed if mean entropy "
            "< 1.0 nats, unfocused if mean max weight < 0.3). Example: --preset seed",
            rich_help_panel=DETECT_PANEL,
        ),
    ] = "normalized",
    collapsed_max_weight: _threshold(
        "--collapsed-max-weight",
        "collapsed if mean max weight ≥ this (normalized 0.9; seed: off). Example: --collapsed-max-weight 0.85",
    ) = None,
    collapsed_normalized_entropy: _threshold(
        "--collapsed-normalized-entropy",
        "collapsed if mean normalized entropy < this (normalized 0.1; seed: off). "
        "Example: --collapsed-normalized-entropy 0.15",
    ) = None,
    collapsed_entropy: _threshold(
        "--collapsed-entropy",
        "collapsed if mean entropy < this many nats (seed 1.0; normalized: off). Example: --collapsed-entropy 0.5",
    ) = None,
    unfocused_normalized_entropy: _threshold(
        "--unfocused-normalized-entropy",
        "unfocused needs mean normalized entropy ≥ this (normalized 0.9; seed: off). "
        "Example: --unfocused-normalized-entropy 0.95",
    ) = None,
    unfocused_max_weight: _threshold(
        "--unfocused-max-weight",
        "unfocused needs mean max weight < this (normalized 0.5; seed 0.3). Example: --unfocused-max-weight 0.4",
    ) = None,
    diagonal_min: _threshold(
        "--diagonal-min", "diagonal if mean weight on the own position ≥ this (0.5). Example: --diagonal-min 0.6"
    ) = None,
    previous_token_min: _threshold(
        "--previous-token-min",
        "previous-token if mean weight on the previous token ≥ this (0.5). Example: --previous-token-min 0.6",
    ) = None,
    first_token_min: _threshold(
        "--first-token-min",
        "first-token-sink if mean weight on the first token ≥ this (0.5). Example: --first-token-min 0.7",
    ) = None,
    special_tokens_min: _threshold(
        "--special-tokens-min",
        "special-token if mean weight on special tokens ≥ this (0.5). Example: --special-tokens-min 0.6",
    ) = None,
    local_ratio_min: _threshold(
        "--local-ratio-min", "local if mean weight within ±w positions ≥ this (0.8). Example: --local-ratio-min 0.9"
    ) = None,
    flagged_only: Annotated[
        bool,
        typer.Option(
            "--flagged-only",
            help="List only heads with a flag. Example: --flagged-only --sort max_weight",
            rich_help_panel=VIEW_PANEL,
        ),
    ] = False,
    sort: Annotated[
        str | None,
        typer.Option(
            "--sort",
            help="Sort the table by a statistic, largest first: entropy, normalized_entropy, "
            "max_weight, mean_distance, normalized_distance, diagonal, previous_token, local_ratio, "
            "first_token or special_tokens. Example: --sort entropy",
            rich_help_panel=VIEW_PANEL,
        ),
    ] = None,
    ascending: Annotated[
        bool,
        typer.Option(
            "--ascending",
            help="With --sort: smallest first. Example: --sort entropy --ascending",
            rich_help_panel=VIEW_PANEL,
        ),
    ] = False,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit", "-n", help="Show at most this many table rows. Example: --limit 20", rich_help_panel=VIEW_PANEL
        ),
    ] = None,
    color_by: Annotated[
        str,
        typer.Option(
            "--color-by",
            help="Statistic that colours the layer × head overview. Example: --color-by first_token",
            rich_help_panel=VIEW_PANEL,
        ),
    ] = "normalized_entropy",
    no_table: Annotated[
        bool,
        typer.Option(
            "--no-table",
            help="Skip the per-head table (overview and summary only). Example: --no-table",
            rich_help_panel=VIEW_PANEL,
        ),
    ] = False,
    json_path: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="Write the results as JSON (schema in the README); '-' writes to stdout. Example: --json stats.json",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = None,
    csv_path: Annotated[
        Path | None,
        typer.Option(
            "--csv",
            help="Write one row per head as CSV; '-' writes to stdout. Example: --csv -",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            "-p",
            help="Figure (.png, .svg, .pdf): layer × head heatmap per statistic with flagged heads marked; with "
            "several checkpoints, each statistic across them. Example: --plot stats.png",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = None,
) -> None:
    """Per-head attention statistics over a corpus, and the heads that look collapsed or unfocused.

    Entropy, normalized entropy, max weight, mean distance, diagonal, previous-token, local, first-token (sink) and special-token mass, per head, averaged over every real token of the corpus. Statistics are computed inside the attention core while each layer runs, so no attention pattern is ever stored.

    Examples:

      attnviz stats

      attnviz stats smollm2 --data notes.txt --json stats.json --plot stats.png

      attnviz stats minilm --flagged-only --sort max_weight --preset seed

      attnviz stats run/step-100 run/step-1000 run/step-5000 --plot evolution.png

      torchrun --standalone --nproc-per-node 4 -m attnviz stats smollm2 --data corpus.txt --json stats.json
    """
    from attnviz.data import load_texts
    from attnviz.errors import InputError
    from attnviz.io import check_output_path
    from attnviz.render.stats_plots import FIGURE_SUFFIXES
    from attnviz.stats.definitions import statistic_index
    from attnviz.stats.detect import preset_thresholds

    # Check everything cheap before loading any model.
    checkpoints = list(checkpoints or ["minilm"])
    thresholds = preset_thresholds(preset).override(
        collapsed_max_weight=collapsed_max_weight,
        collapsed_normalized_entropy=collapsed_normalized_entropy,
        collapsed_entropy=collapsed_entropy,
        unfocused_normalized_entropy=unfocused_normalized_entropy,
        unfocused_max_weight=unfocused_max_weight,
        diagonal_min=diagonal_min,
        previous_token_min=previous_token_min,
        first_token_min=first_token_min,
        special_tokens_min=special_tokens_min,
        local_ratio_min=local_ratio_min,
    )
    if sort is not None:
        statistic_index(sort)
    statistic_index(color_by)
    for name, value, least in (
        ("--batch-size", batch_size, 1),
        ("--toy-examples", toy_examples, 1),
        ("--local-window", local_window, 0),
        ("--limit", limit, 0),
    ):
        if value is not None and value < least:
            raise InputError(f"{name} must be at least {least}, got {value}")
    stack = stack_value(stack)
    if json_path == STDOUT and csv_path == STDOUT:
        raise InputError("only one of --json and --csv can write to stdout ('-')")
    outputs = [
        check_output_path(path, suffixes)
        for path, suffixes in ((json_path, (".json",)), (csv_path, (".csv",)), (plot, FIGURE_SUFFIXES))
        if path is not None and path != STDOUT
    ]
    if len({p.resolve() for p in outputs}) < len(outputs):
        raise InputError("--json, --csv and --plot must be different files")
    from attnviz.cli.stdin import STDIN, read_stdin

    if data is not None and str(data) == STDIN:
        from attnviz.data import examples_from_text

        texts = examples_from_text(read_stdin("data")) + (load_texts(None, text) if text else [])
    elif data is not None and any(p.resolve() == data.expanduser().resolve() for p in outputs):
        raise InputError(f"an output path would overwrite the --data input {data}: choose another path")
    else:
        texts = load_texts(data, text) if data is not None or text else None

    from attnviz.cli.distributed import cli_session

    with cli_session(device, device_map) as parallel:
        results = [
            _run_one(
                spec,
                texts,
                thresholds,
                batch_size=batch_size,
                max_tokens_per_batch=max_tokens_per_batch,
                max_length=max_length,
                truncate=not no_truncate,
                device=parallel.device_for(device),
                device_map=device_map.value if device_map else None,
                dtype=dtype,
                local_window=local_window,
                toy_examples=toy_examples,
                seed=seed,
                parallel=parallel,
            )
            for spec in checkpoints
        ]
        if parallel.is_main:  # only rank 0 prints and writes
            view = {"flagged_only": flagged_only, "sort": sort, "ascending": ascending, "limit": limit}
            _show(results, stack, **view, color_by=color_by, no_table=no_table)
            _write(results, preset, json_path, csv_path, plot, stack)


def _run_one(spec, texts, thresholds, *, device, device_map, dtype, toy_examples, seed, parallel, **common):
    """Load one checkpoint, compute its statistics over the texts (or its toy task), flag its heads."""
    from attnviz.console import console
    from attnviz.data import load_texts
    from attnviz.models.specs import load_model
    from attnviz.stats import compute_statistics, detect_heads

    with console.status(f"loading {spec}"):
        loaded = load_model(spec, device=device, dtype=dtype, device_map=device_map)
    own = loaded.own_examples(toy_examples, seed) if texts is None else None
    if own is not None:
        stats = compute_statistics(loaded, batches=[own], local_window=common["local_window"], parallel=parallel)
    else:
        stats = compute_statistics(loaded, texts if texts is not None else load_texts(), parallel=parallel, **common)
    return stats, detect_heads(stats, thresholds)


def _show(results, stack, *, flagged_only, sort, ascending, limit, color_by, no_table) -> None:
    from attnviz.console import console
    from attnviz.stats.tables import evolution_table, head_rows, head_table, layer_summary, overview, table_statistics

    for stats, detection in results:
        for name in _stacks(stats, stack):
            if not no_table:
                rows = head_rows(
                    stats,
                    detection,
                    stack=name,
                    flagged_only=flagged_only,
                    sort=sort,
                    descending=not ascending,
                    limit=limit,
                )
                console.print(head_table(stats, rows, stack=name, statistics=table_statistics(console.width)))
            console.print(overview(stats, detection, color_by, stack=name))
            for line in layer_summary(stats, detection, stack=name):
                console.print(line, highlight=False)
    if len(results) > 1:
        console.print(evolution_table(results, stack, statistics=table_statistics(console.width)))
    from attnviz.cli.distributed import throughput_line

    for stats, _ in results:
        console.print(throughput_line(stats), highlight=False)


def _stacks(stats, stack) -> list[str]:
    from attnviz.errors import InputError

    if stack is None:
        return stats.stacks
    if stack not in stats.stacks:
        raise InputError(f"{stats.model} has no {stack} attention; it has {', '.join(stats.stacks)}")
    return [stack]


def _write(results, preset, json_path, csv_path, plot, stack) -> None:
    from attnviz.render.stats_plots import head_statistics_evolution_figure, head_statistics_figure, save_figure
    from attnviz.stats.export import csv_text, json_text, stats_record, write_csv, write_json

    records = [stats_record(stats, detection, preset) for stats, detection in results]
    written = []
    for path, text_of, writer in ((json_path, json_text, write_json), (csv_path, csv_text, write_csv)):
        if path == STDOUT:  # the document itself is stdout; tables and paths stay off it
            sys.stdout.write(text_of(records))
        elif path is not None:
            written.append(writer(path, records))
    if plot is not None:
        all_stats = [stats for stats, _ in results]
        detections = [detection for _, detection in results]
        name_of_stack = stack or all_stats[0].stacks[0]
        if len(results) == 1:
            figure = head_statistics_figure(all_stats[0], detections[0], stack=name_of_stack)
        else:
            figure = head_statistics_evolution_figure(all_stats, detections, stack=name_of_stack)
        written.append(save_figure(figure, plot))
    for path in written:
        if STDOUT in (json_path, csv_path):  # stdout holds the document: the paths go to the terminal
            from attnviz.console import console

            console.print(f"wrote {path}", highlight=False)
        else:
            print(path)


def register(app: typer.Typer) -> None:
    """Add this command to ``app``."""
    app.command("stats")(stats)
