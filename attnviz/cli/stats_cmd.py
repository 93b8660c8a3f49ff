"""``attnviz stats``: per-head statistics over a corpus, problem-head flags, tables, JSON/CSV and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.documents import STDOUT, check_outputs, name_written, write_documents
from attnviz.cli.option_groups import PLACEMENT, TEXT_INPUTS, ModelPlacement, TextInputs, expand_option_groups
from attnviz.cli.options import (
    INPUT_PANEL,
    OUTPUT_PANEL,
    AscendingOption,
    BatchSizeOption,
    LimitOption,
    MaxLengthOption,
    MaxTokensPerBatchOption,
    NoTableOption,
    NoTruncateOption,
    StackOption,
    TextFileOption,
    ToyExamplesOption,
    WeightingOption,
    option,
    stack_value,
)
from attnviz.cli.stats_options import (
    BucketSizeOption,
    ByPositionOption,
    CollapsedEntropy,
    CollapsedMaxWeight,
    CollapsedNormalizedEntropy,
    ColorByOption,
    DiagonalMin,
    FirstTokenMin,
    FlaggedOnlyOption,
    LocalRatioMin,
    LocalWindowOption,
    PresetOption,
    PreviousTokenMin,
    SortStatisticOption,
    SpecialTokensMin,
    UnfocusedMaxWeight,
    UnfocusedNormalizedEntropy,
)


@expand_option_groups
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
    inputs: TextInputs = TEXT_INPUTS,
    text_files: TextFileOption = None,
    images_dir: option(
        Path | None,
        "--images",
        help="Vision models: a folder of images (PNG, JPEG, …) to measure on, read a batch at a time. "
        "Example: --images photos/",
        panel=INPUT_PANEL,
    ) = None,
    image: option(
        list[str] | None,
        "--image",
        help="Vision models: one image to measure on (repeat it for more); a vision-language model reads the "
        "images inside the texts (--text, --data), one per text in order. Example: --image a.png --image b.png",
        show_default=False,
        panel=INPUT_PANEL,
    ) = None,
    batch_size: BatchSizeOption = 8,
    max_tokens_per_batch: MaxTokensPerBatchOption = None,
    toy_examples: ToyExamplesOption = 128,
    seed: option(int, "--seed", help="Seed of the toy task examples. Example: --seed 1", panel=INPUT_PANEL) = 0,
    max_length: MaxLengthOption = None,
    no_truncate: NoTruncateOption = False,
    placement: ModelPlacement = PLACEMENT,
    local_window: LocalWindowOption = 2,
    by_position: ByPositionOption = False,
    bucket_size: BucketSizeOption = None,
    weighting: WeightingOption = "weights",
    stack: StackOption = None,
    preset: PresetOption = "normalized",
    collapsed_max_weight: CollapsedMaxWeight = None,
    collapsed_normalized_entropy: CollapsedNormalizedEntropy = None,
    collapsed_entropy: CollapsedEntropy = None,
    unfocused_normalized_entropy: UnfocusedNormalizedEntropy = None,
    unfocused_max_weight: UnfocusedMaxWeight = None,
    diagonal_min: DiagonalMin = None,
    previous_token_min: PreviousTokenMin = None,
    first_token_min: FirstTokenMin = None,
    special_tokens_min: SpecialTokensMin = None,
    local_ratio_min: LocalRatioMin = None,
    flagged_only: FlaggedOnlyOption = False,
    sort: SortStatisticOption = None,
    ascending: AscendingOption = False,
    limit: LimitOption = None,
    color_by: ColorByOption = "normalized_entropy",
    no_table: NoTableOption = False,
    json_path: option(
        Path | None,
        "--json",
        help="Write the results as JSON (fields: docs/file-formats.md); '-' writes to stdout. Example: --json stats.json",
        panel=OUTPUT_PANEL,
    ) = None,
    csv_path: option(
        Path | None,
        "--csv",
        help="Write one row per head as CSV; '-' writes to stdout. Example: --csv -",
        panel=OUTPUT_PANEL,
    ) = None,
    plot: option(
        Path | None,
        "--plot",
        "-p",
        help="Figure (.png, .svg, .pdf): layer × head heatmap per statistic with flagged heads marked; with "
        "several checkpoints, each statistic across them. Example: --plot stats.png",
        panel=OUTPUT_PANEL,
    ) = None,
) -> None:
    """Per-head attention statistics over a corpus, and the heads that look collapsed or unfocused.

    Entropy, normalized entropy, max weight, mean distance, diagonal, previous-token, local, first-token (sink) and special-token mass, per head, averaged over every real token of the corpus. Statistics are computed inside the attention core while each layer runs, so no attention pattern is ever stored.

    Examples:

      attnviz stats

      attnviz stats smollm2 --data notes.txt --json stats.json --plot stats.png

      attnviz stats minilm --flagged-only --sort max_weight --preset absolute

      attnviz stats minilm --weighting norm --json norm-stats.json

      attnviz stats run/step-100 run/step-1000 run/step-5000 --plot evolution.png

      attnviz stats toy-odd-patch --images photos/ --json vision-stats.json

      torchrun --standalone --nproc-per-node 4 -m attnviz stats smollm2 --data corpus.txt --json stats.json
    """
    from attnviz.common.errors import InputError
    from attnviz.render.stats_plots import FIGURE_SUFFIXES
    from attnviz.stats.measure import measure_checkpoints
    from attnviz.stats.thresholds import preset_thresholds

    # Check everything cheap before loading any model (the guard already refuses outputs over inputs).
    thresholds = preset_thresholds(preset.value).override(
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
    others = [(plot, FIGURE_SUFFIXES)]
    if by_position or bucket_size is not None:
        others += _check_by_position(by_position, bucket_size, csv_path, plot)
    check_outputs(json_path, csv_path, others)
    texts = inputs.texts(text_files)
    from attnviz.cli.images import images_from_options

    images = images_from_options(images_dir, image)
    if images is not None and by_position:
        raise InputError("--by-position is for text: images have no reading order")

    with placement.session() as parallel:
        results = measure_checkpoints(
            checkpoints or ["minilm"],
            texts,
            thresholds=thresholds,
            toy_examples=toy_examples,
            seed=seed,
            **placement.loading(),
            local_window=local_window,
            parallel=parallel,
            batch_size=batch_size,
            max_tokens_per_batch=max_tokens_per_batch,
            max_length=max_length,
            truncate=not no_truncate,
            images=images,
            by_position=by_position,
            bucket_size=bucket_size,
            weighting=weighting.value,
            stack=stack_value(stack),
        )
        if parallel.is_main:  # only rank 0 prints and writes
            stack = stack_value(stack)
            view = {
                "flagged_only": flagged_only,
                "sort": sort.value if sort else None,
                "ascending": ascending,
                "limit": limit,
            }
            # written (staged) first: a failing write stops the run before any table is shown
            _write(results, preset.value, json_path, csv_path, plot, stack)
            _show(results, stack, **view, color_by=color_by.value, no_table=no_table)


def _check_by_position(by_position, bucket_size, csv_path, plot) -> list:
    """Refuse what --by-position cannot do before any model loads; the extra files it writes, to check."""
    from attnviz.common.errors import InputError
    from attnviz.stats.by_position import check_bucket_size
    from attnviz.stats.position_export import position_path

    if not by_position:
        raise InputError("--bucket-size sets the width of the --by-position buckets: add --by-position")
    check_bucket_size(bucket_size)
    if csv_path == STDOUT:
        raise InputError("--csv - cannot also hold the by-position table: give --csv a file name")
    companions = []
    for path in (csv_path, plot):
        if path is not None:
            companions.append((position_path(path), (path.suffix.lower(),)))
    return companions


def _show(results, stack, *, flagged_only, sort, ascending, limit, color_by, no_table) -> None:
    from attnviz.cli.console import console
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
        if stats.image is not None:
            from attnviz.stats.images import sink_summary

            console.print(sink_summary(stats), highlight=False)
        if stats.picture is not None:
            from attnviz.stats.vision_language import picture_summary

            console.print(picture_summary(stats.picture), highlight=False)
    if len(results) > 1:
        console.print(evolution_table(results, stack, statistics=table_statistics(console.width)))
    from attnviz.cli.distributed import throughput_line

    for stats, _ in results:
        console.print(throughput_line(stats), highlight=False)


def _stacks(stats, stack) -> list[str]:
    from attnviz.common.errors import InputError

    if stack is None:
        return stats.stacks
    if stack not in stats.stacks:
        raise InputError(f"{stats.model} has no {stack} attention; it has {', '.join(stats.stacks)}")
    return [stack]


def _write(results, preset, json_path, csv_path, plot, stack) -> None:
    from attnviz.render.stats_plots import head_statistics_evolution_figure, head_statistics_figure, save_figure
    from attnviz.stats.export import csv_text, json_text, stats_record, write_csv, write_json
    from attnviz.stats.position_export import position_path, write_position_csv

    records = [stats_record(stats, detection, preset) for stats, detection in results]
    written = write_documents(
        records, json_path, csv_path, as_json=(json_text, write_json), as_csv=(csv_text, write_csv)
    )
    by_position = [stats for stats, _ in results if stats.by_position is not None]
    if by_position and csv_path is not None:  # the long by-position table next to the per-head one
        written.append(write_position_csv(position_path(csv_path), records))
    if plot is not None:
        all_stats = [stats for stats, _ in results]
        detections = [detection for _, detection in results]
        name_of_stack = stack or all_stats[0].stacks[0]
        if len(results) == 1:
            figure = head_statistics_figure(all_stats[0], detections[0], stack=name_of_stack)
        else:
            figure = head_statistics_evolution_figure(all_stats, detections, stack=name_of_stack)
        written.append(save_figure(figure, plot))
        if by_position:
            from attnviz.render.position_plots import position_figure

            written.append(save_figure(position_figure(by_position, stack=name_of_stack), position_path(plot)))
    name_written(written, json_path, csv_path)


def register(app: typer.Typer) -> None:
    """Add this command to ``app``."""
    app.command("stats")(stats)
