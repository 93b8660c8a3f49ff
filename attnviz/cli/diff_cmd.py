"""``attnviz diff``: what changed between two models, checkpoints, precisions or inputs, head by head."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from attnviz.cli.diff_output import show_checkpoints, show_inputs, show_models, write_outputs
from attnviz.cli.option_groups import MODEL_DEVICE, TEXT_INPUTS, ModelDevice, TextInputs, expand_option_groups
from attnviz.cli.options import (
    INPUT_PANEL,
    MODEL_PANEL,
    MODEL_SPECS,
    OUTPUT_PANEL,
    VIEW_PANEL,
    BatchSizeOption,
    MaxLengthOption,
    MaxTokensPerBatchOption,
    NoTruncateOption,
    StackOption,
    ToyExamplesOption,
    WeightingOption,
    option,
    parse_device,
    parse_dtype,
    stack_value,
)
from attnviz.cli.stats_options import LocalWindowOption

DIFF_PANEL = "Comparison"
FIGURE_AND_PAGE_SUFFIXES = (".png", ".svg", ".pdf", ".html", ".htm")


@expand_option_groups
def diff(
    models: Annotated[
        list[str],
        typer.Argument(
            help=f"Model specs: A and B ({MODEL_SPECS}); more than two: checkpoints over training; one, with "
            "--against: two inputs on that model. Example: attnviz diff minilm pruned-minilm",
            show_default=False,
        ),
    ],
    inputs: TextInputs = TEXT_INPUTS,
    against: option(
        str | None,
        "--against",
        help="Compare one model on --text and on this text (a minimal pair). "
        'Example: --text "The keys to the cabinet are" --against "The keys to the cabinet is"',
        panel=INPUT_PANEL,
        show_default=False,
    ) = None,
    by_statistics: option(
        bool,
        "--by-statistics",
        help="Compare per-head statistics only (no divergence): for models whose heads or tokenizers differ. "
        "Example: --by-statistics",
        panel=DIFF_PANEL,
    ) = False,
    model_device: ModelDevice = MODEL_DEVICE,
    device_b: option(
        str | None,
        "--device-b",
        parser=parse_device,
        metavar="<device>",
        help="Device of model B (default: --device). Example: --device-b cpu",
        panel=MODEL_PANEL,
        show_default=False,
    ) = None,
    dtype_b: option(
        str | None,
        "--dtype-b",
        parser=parse_dtype,
        metavar="<dtype>",
        help="Precision of model B (default: --dtype): compare a model with itself in another precision. "
        "Example: attnviz diff minilm minilm --dtype-b bfloat16",
        panel=MODEL_PANEL,
        show_default=False,
    ) = None,
    batch_size: BatchSizeOption = 8,
    max_tokens_per_batch: MaxTokensPerBatchOption = None,
    max_length: MaxLengthOption = None,
    no_truncate: NoTruncateOption = False,
    toy_examples: ToyExamplesOption = 128,
    seed: option(int, "--seed", help="Seed of the toy task examples. Example: --seed 1", panel=INPUT_PANEL) = 0,
    local_window: LocalWindowOption = 2,
    weighting: WeightingOption = "weights",
    stack: StackOption = None,
    layer: option(
        int | None,
        "--layer",
        help="Two inputs: the layer the figure shows (default: that of the head that changed most). Example: --layer 3",
        panel=VIEW_PANEL,
        show_default=False,
    ) = None,
    head: option(
        int | None,
        "--head",
        min=0,
        help="Two inputs: the head the figure shows (default: the head that changed most). Example: --head 5",
        panel=VIEW_PANEL,
        show_default=False,
    ) = None,
    limit: option(
        int, "--limit", "-n", min=0, help="Heads listed as changed most. Example: --limit 20", panel=VIEW_PANEL
    ) = 10,
    json_path: option(
        Path | None,
        "--json",
        help="Write the comparison as JSON (one entry per head; see docs/diff.md); '-' writes to stdout. "
        "Example: --json diff.json",
        panel=OUTPUT_PANEL,
        show_default=False,
    ) = None,
    csv_path: option(
        Path | None,
        "--csv",
        help="Write one row per head as CSV; '-' writes to stdout. Example: --csv diff.csv",
        panel=OUTPUT_PANEL,
        show_default=False,
    ) = None,
    out: option(
        Path | None,
        "--out",
        "-o",
        help="Figure (.png, .svg, .pdf) or self-contained page (.html): the divergence grid of two models, "
        "A | B | B − A of two inputs, a line per head across checkpoints. Example: --out diff.html",
        panel=OUTPUT_PANEL,
        show_default=False,
    ) = None,
) -> None:
    """What changed between two models, checkpoints, precisions or inputs: head by head.

    For every head present in both models: the mean Jensen–Shannon divergence (nats) and total variation between their attention over every query of every text, every statistic of 'attnviz stats' for A and B, and B − A. A pruned checkpoint's heads are matched to the original's by its pruning record.

    Examples:

      attnviz diff minilm pruned-minilm --json diff.json

      attnviz diff minilm minilm --dtype-b bfloat16

      attnviz diff smollm2 --text "The keys to the cabinet are" --against "The keys to the cabinet is" --out pair.html

      attnviz diff run/step-100 run/step-1000 run/step-5000 --out evolution.png
    """
    from attnviz.cli.documents import check_outputs
    from attnviz.common.errors import InputError

    check_outputs(json_path, csv_path, [(out, FIGURE_AND_PAGE_SUFFIXES)])
    if against is not None:
        if len(models) != 1:
            raise InputError(f"--against compares two inputs on one model: give one model spec, not {len(models)}")
        if not inputs.text or len(inputs.text) != 1 or inputs.data is not None:
            raise InputError('--against needs exactly one --text (input A) and no --data: --text "…" --against "…"')
    elif len(models) < 2:
        raise InputError(
            "give two model specs to compare (A B), more for checkpoints, or one with --text and --against"
        )
    if (layer is not None or head is not None) and against is None:
        raise InputError("--layer and --head choose the head the figure of two inputs shows: they apply with --against")
    texts = None if against is not None else inputs.texts()
    stack_name = stack_value(stack)

    from attnviz.common.progress import status
    from attnviz.models.specs import load_model

    def load(spec: str, *, second: bool = False):
        with status(f"loading {spec}"):
            return load_model(
                spec,
                device=(device_b or model_device.device) if second else model_device.device,
                dtype=(dtype_b or model_device.dtype) if second else model_device.dtype,
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

        assert inputs.text is not None
        loaded = load(models[0])
        _check_selection(loaded, stack_name, layer, head)  # before the comparison runs
        result = compare_inputs(loaded, inputs.text[0], against, max_length=max_length, local_window=local_window)
        show_inputs(result, limit)
    elif len(models) == 2:
        from attnviz.compare.models import compare_models

        pair = (load(models[0]), load(models[1], second=True))
        for loaded in pair:
            _check_selection(loaded, stack_name, None, None)
        result = compare_models(*pair, texts, **options)
        show_models(result, stack_name, limit)
    else:
        from attnviz.compare.checkpoints import compare_checkpoints

        result = compare_checkpoints(models, lambda spec: load(spec, second=spec != models[0]), texts, **options)
        show_checkpoints(result, stack_name, limit)
    write_outputs(result, json_path, csv_path, out, stack_name, layer, head)


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


def register(app: typer.Typer) -> None:
    """Add this command to ``app``."""
    app.command("diff")(diff)
