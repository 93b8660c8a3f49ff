"""``attnviz heads``: what each head does — probe scores, function labels, head similarity."""

from __future__ import annotations

from pathlib import Path

import typer

from attnviz.cli.option_groups import MODEL_DEVICE, ModelDevice, expand_option_groups
from attnviz.cli.options import (
    INPUT_PANEL,
    OUTPUT_PANEL,
    VIEW_PANEL,
    AscendingOption,
    BatchSizeOption,
    CheckpointArgument,
    CsvOption,
    JsonOption,
    LimitOption,
    MaxLengthOption,
    NoTableOption,
    StackOption,
    TextOption,
    choice_enum,
    choice_option,
    option,
    stack_value,
)
from attnviz.heads.labels import SCORE_NAMES

PROBE_PANEL = "Probes"
LABEL_PANEL = "Label thresholds"
SIMILARITY_PANEL = "Head similarity"


ScoreName = choice_enum("ScoreName", SCORE_NAMES)


def _threshold(flag: str, help_text: str):
    return option(float | None, flag, help=help_text, panel=LABEL_PANEL, show_default=False, min=0.0, max=1.0)


@expand_option_groups
def heads(
    checkpoint: CheckpointArgument = "minilm",
    length: option(
        int | None,
        "--length",
        "-T",
        min=2,
        help="T: random tokens per block; each probe is [BOS] + the block twice (default 50; toy models: their "
        "task's longest sequence). Example: --length 30",
        panel=PROBE_PANEL,
        show_default=False,
    ) = None,
    sequences: option(
        int, "--sequences", min=1, help="Probe sequences. Example: --sequences 32", panel=PROBE_PANEL
    ) = 16,
    seed: option(int, "--seed", help="Seed of the probe tokens. Example: --seed 1", panel=PROBE_PANEL) = 0,
    batch_size: BatchSizeOption = 16,
    data: option(
        Path | None,
        "--data",
        "-d",
        help='Corpus (one example per line, or JSON Lines with "text"): adds the statistics and flags of '
        "'attnviz stats' over it, and head similarity is computed over it. Example: --data notes.txt",
        panel=INPUT_PANEL,
    ) = None,
    text: TextOption = None,
    max_length: MaxLengthOption = None,
    model_device: ModelDevice = MODEL_DEVICE,
    induction_min: _threshold(
        "--induction-min", "induction if the score is ≥ this (0.3). Example: --induction-min 0.5"
    ) = None,
    duplicate_token_min: _threshold(
        "--duplicate-token-min", "duplicate-token if the score is ≥ this (0.3). Example: --duplicate-token-min 0.5"
    ) = None,
    previous_token_min: _threshold(
        "--previous-token-min", "previous-token if the score is ≥ this (0.5). Example: --previous-token-min 0.7"
    ) = None,
    next_token_min: _threshold(
        "--next-token-min", "next-token if the score is ≥ this (0.5). Example: --next-token-min 0.7"
    ) = None,
    sort: choice_option(
        ScoreName,
        "--sort",
        "probe score",
        help="Sort the table by a probe score, largest first. Example: --sort induction",
        panel=VIEW_PANEL,
        optional=True,
    ) = None,
    ascending: AscendingOption = False,
    labelled_only: option(
        bool, "--labelled-only", help="List only heads with a label. Example: --labelled-only", panel=VIEW_PANEL
    ) = False,
    limit: LimitOption = None,
    no_table: NoTableOption = False,
    stack: StackOption = None,
    json_path: JsonOption = None,
    csv_path: CsvOption = None,
    plot: option(
        Path | None,
        "--plot",
        "-p",
        help="Figure (.png, .svg, .pdf): a layer × head panel per probe score. Example: --plot heads.png",
        panel=OUTPUT_PANEL,
    ) = None,
    similarity: option(
        Path | None,
        "--similarity",
        help="Figure of the mean Jensen–Shannon divergence between heads (clustered heatmap coloured by layer, "
        "and a 2-D MDS map), over --data/--text or else the probes; --json then holds the matrix. "
        "Example: --similarity similarity.png",
        panel=OUTPUT_PANEL,
    ) = None,
    similarity_examples: option(
        int,
        "--similarity-examples",
        min=1,
        help="Examples the divergence is averaged over. Example: --similarity-examples 16",
        panel=SIMILARITY_PANEL,
    ) = 8,
    similarity_tokens: option(
        int,
        "--similarity-tokens",
        min=2,
        help="Examples are cut to this many tokens for the divergence. Example: --similarity-tokens 32",
        panel=SIMILARITY_PANEL,
    ) = 64,
) -> None:
    """What each head does: induction, duplicate-token, previous-token (and next-token) heads, from probes.

    The probes are random ordinary tokens of the model's own vocabulary, written twice after the BOS token, so the scores do not depend on any corpus. With --data or --text the statistics and flags of 'attnviz stats' over that corpus join the table.

    Examples:

      attnviz heads smollm2

      attnviz heads smollm2 --sort induction --limit 10 --json heads.json --plot heads.png

      attnviz heads minilm --data notes.txt --labelled-only --similarity similarity.png

      attnviz heads sample_data/toy/induction
    """
    from attnviz.cli.stdin import corpus_from_options
    from attnviz.common.errors import InputError
    from attnviz.common.progress import status
    from attnviz.heads import FunctionThresholds, ProbeSettings, head_functions
    from attnviz.models.specs import load_model
    from attnviz.outputs.files import check_output_path
    from attnviz.render.heads_plots import FIGURE_SUFFIXES

    thresholds = FunctionThresholds().override(
        induction_min=induction_min,
        duplicate_token_min=duplicate_token_min,
        previous_token_min=previous_token_min,
        next_token_min=next_token_min,
    )
    probe = ProbeSettings(length=length, sequences=sequences, seed=seed, batch_size=batch_size)
    # the guard already refuses outputs that overlap each other or an input (--data, the model)
    for path, suffixes in (
        (json_path, (".json",)),
        (csv_path, (".csv",)),
        (plot, FIGURE_SUFFIXES),
        (similarity, FIGURE_SUFFIXES),
    ):
        if path is not None:
            check_output_path(path, suffixes)
    texts = corpus_from_options(data, text)

    with status(f"loading {checkpoint}"):
        loaded = load_model(checkpoint, **model_device.loading())
    stack = stack_value(stack)
    if stack is not None and stack not in loaded.stacks():  # before the probes run
        raise InputError(f"{loaded.name} has no {stack} attention; it has {', '.join(loaded.stacks())}")
    result = head_functions(  # its status lines go through the CLI's reporter
        loaded,
        probe=probe,
        thresholds=thresholds,
        texts=texts,
        batch_size=batch_size,
        max_length=max_length,
        similarity=similarity is not None,
        similarity_examples=similarity_examples,
        similarity_tokens=similarity_tokens,
    )
    # written (staged) first: a failing write stops the run before any table is shown
    _write(result, json_path, csv_path, plot, similarity, stack)
    _show(result, stack, labelled_only, sort, ascending, limit, no_table)


def _show(result, stack, labelled_only, sort, ascending, limit, no_table) -> None:
    from attnviz.cli.console import console
    from attnviz.common.errors import InputError
    from attnviz.heads.tables import head_rows, head_table, label_grid, summary_line

    if stack is not None and stack not in result.stacks:
        raise InputError(f"{result.model} has no {stack} attention; it has {', '.join(result.stacks)}")
    for name in [stack] if stack else result.stacks:
        if not no_table:
            rows = head_rows(
                result,
                stack=name,
                labelled_only=labelled_only,
                sort=sort.value if sort else None,
                descending=not ascending,
                limit=limit,
            )
            console.print(head_table(result, rows, stack=name))
        console.print(label_grid(result, stack=name))
        console.print(summary_line(result, stack=name), highlight=False)


def _write(result, json_path, csv_path, plot, similarity, stack) -> None:
    from attnviz.heads.export import heads_record, write_heads_csv, write_heads_json
    from attnviz.render.heads_plots import head_similarity_figure, probe_scores_figure, save_figure

    record = heads_record(result)
    written = []
    if json_path is not None:
        written.append(write_heads_json(json_path, record))
    if csv_path is not None:
        written.append(write_heads_csv(csv_path, record))
    if plot is not None:
        written.append(save_figure(probe_scores_figure(result, stack=stack or result.stacks[0]), plot))
    if similarity is not None and result.similarity is not None:
        written.append(save_figure(head_similarity_figure(result.similarity, model=result.model), similarity))
    for path in written:
        print(path)


def register(app: typer.Typer) -> None:
    """Add this command to ``app``."""
    app.command("heads")(heads)
