"""``attnviz align``: how well each cross-attention head aligns words, as alignment error rates."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.option_groups import BATCH_OPTIONS, BatchOptions, expand_option_groups
from attnviz.cli.options import (
    INPUT_PANEL,
    OUTPUT_PANEL,
    JsonOption,
    choice_enum,
    choice_option,
    option,
)
from attnviz.heads.choices import ALIGNMENT_ROWS

ALIGN_PANEL = "Alignment"


#: which decoder rows stand for a target word
RowChoice = choice_enum("RowChoice", ALIGNMENT_ROWS)


@expand_option_groups
def align(
    checkpoint: Annotated[
        str,
        typer.Argument(
            help="Encoder-decoder model spec: a toy checkpoint, a Hugging Face directory or a hub id in the local "
            "cache. Example: toy-reverse",
            show_default=False,
        ),
    ],
    data: option(
        Path,
        "--data",
        "-d",
        help='JSON Lines, one pair per line: {"source": ..., "target": ..., "alignment": "0-0 1-2 2?1"} '
        "(Pharaoh links over whitespace words; i?j, i-j?, ipj possible). '-' reads standard input. "
        "Example: --data pairs.jsonl",
        panel=INPUT_PANEL,
        show_default=False,
    ),
    threshold: option(
        float,
        "--threshold",
        min=0.0,
        max=1.0,
        help="Weight at or above which the threshold variant links a target word to a source word. "
        "Example: --threshold 0.5",
        panel=ALIGN_PANEL,
    ) = 0.3,
    rows: choice_option(
        RowChoice,
        "--rows",
        "row choice",
        help="Decoder rows of a target word: 'predicting' (the step that predicts it) or 'reading' "
        "(the step that reads it). Example: --rows reading",
        panel=ALIGN_PANEL,
    ) = RowChoice.predicting,
    limit: option(
        int | None, "--limit", min=1, help="Show only the N best heads. Example: --limit 10", panel=OUTPUT_PANEL
    ) = None,
    json_path: JsonOption = None,
    plot: option(
        Path | None,
        "--plot",
        help="Layer × head picture of the AER (.png, .svg, .pdf). Example: --plot align.png",
        panel=OUTPUT_PANEL,
    ) = None,
    batching: BatchOptions = BATCH_OPTIONS,
) -> None:
    """Score every cross-attention head (and layer mean) by its alignment error rate against gold word alignments.

    Examples:

      attnviz align toy-reverse --data pairs.jsonl --plot align.png

      cat pairs.jsonl | attnviz align ./my-marian --data - --json align.json --limit 10
    """
    from attnviz.cli.console import console
    from attnviz.cli.stdin import STDIN, read_stdin
    from attnviz.common.progress import status
    from attnviz.heads.alignment import align_heads, read_alignment_pairs, write_alignment_json
    from attnviz.models.specs import load_model
    from attnviz.outputs.files import check_output_path, check_outputs
    from attnviz.render.align_plot import alignment_grid_figure, alignment_table
    from attnviz.render.heatmap import FIGURE_SUFFIXES, save_figure

    if json_path is not None:
        json_path = check_output_path(json_path, (".json",))
    if plot is not None:
        plot = check_output_path(plot, FIGURE_SUFFIXES)
    from_stdin = str(data) == STDIN
    check_outputs([json_path, plot], [] if from_stdin else [data])
    pairs = read_alignment_pairs(text=read_stdin("alignment pairs")) if from_stdin else read_alignment_pairs(data)
    with status(f"loading {checkpoint}"):
        loaded = load_model(checkpoint, device=batching.device, dtype=batching.dtype)
    with status(f"aligning {len(pairs)} pairs"):
        result = align_heads(loaded, pairs, threshold=threshold, rows=rows.value, **batching.batching())
    console.print(alignment_table(result, limit=limit))
    if json_path is not None:
        print(write_alignment_json(json_path, result))
    if plot is not None:
        figure = alignment_grid_figure(result.aer_grid(), title=f"{result.model} · cross-attention AER (argmax)")
        print(save_figure(figure, plot))


def register(app: typer.Typer) -> None:
    app.command("align")(align)
