"""``attnviz report``: the head atlas, one self-contained HTML page per model."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import typer

from attnviz.cli.option_groups import TEXT_INPUTS, BatchOptions, OptionGroup, TextInputs, expand_option_groups
from attnviz.cli.options import (
    OUTPUT_PANEL,
    CheckpointArgument,
    WeightingOption,
    option,
)

REPORT_PANEL = "Report"


#: --batch-size, --max-length, --device, --dtype, with this command's batch size
BATCHING: Any = OptionGroup(BatchOptions, batch_size=8)


@expand_option_groups
def report(
    checkpoint: CheckpointArgument = "minilm",
    out: option(
        Path, "--out", "-o", help="The page to write (.html). Example: --out atlas.html", panel=OUTPUT_PANEL
    ) = Path("report.html"),
    inputs: TextInputs = TEXT_INPUTS,
    prune_report: option(
        Path | None,
        "--prune-report",
        help="JSON written by 'attnviz prune --json': adds each head's importance score. "
        "Example: --prune-report prune.json",
        panel=REPORT_PANEL,
    ) = None,
    examples: option(
        int,
        "--examples",
        min=0,
        max=20,
        help="Example texts whose patterns the page shows for a clicked head. Example: --examples 5",
        panel=REPORT_PANEL,
    ) = 3,
    compare: option(
        str | None,
        "--compare",
        help="Another model spec (a fine-tuned, pruned or half-precision copy, a later checkpoint): adds each "
        "head's divergence from it and the change of every statistic as sortable columns. "
        "Example: --compare pruned-minilm",
        panel=REPORT_PANEL,
        show_default=False,
    ) = None,
    batching: BatchOptions = BATCHING,
    weighting: WeightingOption = "weights",
) -> None:
    """Write the head atlas: every head's statistics in a sortable table, a layer × head grid, example patterns.

    Examples:

      attnviz report

      attnviz report smollm2 --out smollm2-atlas.html

      attnviz report pruned-minilm --prune-report prune.json --data reviews.txt

      attnviz report minilm --compare pruned-minilm --out changes.html

      attnviz report minilm --weighting norm --out minilm-norm-atlas.html
    """
    from attnviz.atlas.build import build_head_atlas

    path = build_head_atlas(
        checkpoint,
        out,
        texts=inputs.texts(),
        prune_report=prune_report,
        examples=examples,
        **dataclasses.asdict(batching),
        compare=compare,
        weighting=weighting.value,
    )
    print(path)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
