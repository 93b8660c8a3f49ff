"""``attnviz heatmap``: render a model's attention on a sentence (or a saved capture)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.options import (
    INPUT_PANEL,
    OUTPUT_PANEL,
    DeviceOption,
    DtypeOption,
    GenerateOption,
    MaxLengthOption,
    ModelOption,
    NoTruncateOption,
    SampleOption,
    SampleSeedOption,
    TargetOption,
    TemperatureOption,
)

VIEW_PANEL = "What to show"


def heatmap(
    text: Annotated[
        str | None,
        typer.Argument(
            help="The sentence to analyse; '-' reads it from standard input. "
            'Example: "The cat sat on the mat because it was tired."',
            show_default=False,
        ),
    ] = None,
    model: ModelOption = "minilm",
    layer: Annotated[
        str,
        typer.Option(
            "--layer",
            "-l",
            help="Layer index, negative index, comma list, or 'all'. Example: --layer 0,-1",
            rich_help_panel=VIEW_PANEL,
        ),
    ] = "-1",
    head: Annotated[
        str,
        typer.Option(
            "--head",
            help="Head index, comma list, 'all', or 'mean' (average over heads). Example: --head 3",
            rich_help_panel=VIEW_PANEL,
        ),
    ] = "all",
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="Output file; .png, .svg or .pdf by suffix. Example: --out attention.svg",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = Path("heatmap.png"),
    annotate: Annotated[
        bool | None,
        typer.Option(
            "--annotate/--no-annotate",
            help="Print weights in the cells (default: on for a single heatmap of at most 20 tokens). "
            "Example: --no-annotate",
            show_default=False,
            rich_help_panel=VIEW_PANEL,
        ),
    ] = None,
    words: Annotated[
        bool,
        typer.Option(
            "--words",
            help="Merge sub-word pieces into words: attention to a word is the sum over its pieces, "
            "from a word the mean. Example: --words",
            rich_help_panel=VIEW_PANEL,
        ),
    ] = False,
    cross: Annotated[
        bool,
        typer.Option(
            "--cross",
            help="Encoder-decoder models: show cross-attention of --target tokens over TEXT tokens. "
            'Example: --cross --target "Le chat"',
            rich_help_panel=VIEW_PANEL,
        ),
    ] = False,
    stack: Annotated[
        str | None,
        typer.Option(
            "--stack",
            help="Encoder-decoder models: encoder, decoder or cross (default encoder; --cross means cross). "
            "Example: --stack decoder",
            rich_help_panel=VIEW_PANEL,
        ),
    ] = None,
    target: TargetOption = None,
    from_capture: Annotated[
        Path | None,
        typer.Option(
            "--from-capture",
            help="Render a capture saved by 'attnviz capture' instead of running a model. "
            "Example: --from-capture cat.safetensors",
            rich_help_panel=INPUT_PANEL,
        ),
    ] = None,
    max_length: MaxLengthOption = None,
    no_truncate: NoTruncateOption = False,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "auto",
    generate: GenerateOption = None,
    sample: SampleOption = False,
    temperature: TemperatureOption = 1.0,
    seed: SampleSeedOption = None,
) -> None:
    """Draw a heatmap of attention weights: queries on rows, keys on columns.

    Examples:

      attnviz heatmap "The cat sat on the mat because it was tired."

      attnviz heatmap "The cat sat on the mat." --layer 2 --head 5 --out head.svg

      attnviz heatmap "The cat sat on the mat." --model smollm2 --layer all --head mean --words

      attnviz heatmap --from-capture cat.safetensors --layer 0

      attnviz heatmap "The capital of France is" --model smollm2 --generate 8 --head mean
    """
    from attnviz.captures import AttentionCapture
    from attnviz.cli.stdin import text_or_stdin
    from attnviz.errors import InputError
    from attnviz.io import check_output_path
    from attnviz.render.capture_view import capture_heatmap
    from attnviz.render.heatmap import FIGURE_SUFFIXES, save_figure

    out = check_output_path(out, FIGURE_SUFFIXES)
    text = text_or_stdin(text)
    if cross:
        if stack not in (None, "cross"):
            raise InputError("--cross and --stack disagree: give one of them")
        stack = "cross"
    if stack is not None and stack not in ("self", "encoder", "decoder", "cross"):
        raise InputError(f"unknown --stack {stack!r}: use encoder, decoder or cross")
    if from_capture is not None:
        if text is not None:
            raise InputError("give either TEXT or --from-capture, not both")
        if generate is not None:
            raise InputError("--generate runs a model; a saved capture already holds what was generated")
        result = AttentionCapture.load(from_capture)
    else:
        if text is None:
            raise InputError('no text given: attnviz heatmap "The cat sat on the mat."')
        if not text.strip():
            raise InputError("the text is empty: give at least one word")
        if stack == "cross" and target is None and generate is None:
            raise InputError('cross-attention needs the decoder text: add --target "..." (or --generate N)')
        generation = _generation_settings(generate, sample, temperature, seed, target)
        result = _capture(text, target, model, max_length, no_truncate, device, dtype, generation)
    if stack in ("decoder", "cross") and not result.encoder_decoder:
        raise InputError(f"{result.model} is not an encoder-decoder model: it has no {stack} attention")
    figure = capture_heatmap(result, layer=layer, head=head, stack=stack, words=words, annotate=annotate)
    path = save_figure(figure, out)
    _summary(result, stack)
    print(path)


def _generation_settings(generate, sample, temperature, seed, target) -> dict | None:
    """Keyword arguments of ``generate_capture`` from the options, or None without --generate."""
    from attnviz.errors import InputError

    if generate is None:
        if sample or seed is not None or temperature != 1.0:
            raise InputError("--sample, --temperature and --seed apply only with --generate N")
        return None
    if target is not None:
        raise InputError("give either --target (a fixed decoder text) or --generate N, not both")
    if not sample and (seed is not None or temperature != 1.0):
        raise InputError("--temperature and --seed apply only with --sample (greedy decoding has no randomness)")
    return {"max_new_tokens": generate, "sample": sample, "temperature": temperature, "seed": seed}


def _capture(text, target, model, max_length, no_truncate, device, dtype, generation=None):
    from attnviz.captures import capture
    from attnviz.console import console
    from attnviz.models.specs import load_model

    with console.status(f"loading {model}"):
        loaded = load_model(model, device=device, dtype=dtype)
    if generation is None:
        return capture(loaded, text, target=target, max_length=max_length, truncate=not no_truncate)
    from attnviz.generation import generate_capture

    with console.status(f"generating up to {generation['max_new_tokens']} tokens"):
        result = generate_capture(loaded, text, max_length=max_length, truncate=not no_truncate, **generation)
    console.print(f"[bold]generated:[/bold] {result.text!r} ({len(result.token_ids)} tokens)", highlight=False)
    return result.capture


def _summary(result, stack) -> None:
    from attnviz.console import console

    stack = stack or result.stacks[0]
    queries, keys = result.axis_tokens(stack)
    kind = "causal" if result.causal else "encoder-decoder" if result.encoder_decoder else "bidirectional"
    console.print(
        f"[bold]{result.model}[/bold] ({kind}) · {len(keys)} tokens"
        + (f" → {len(queries)} target tokens" if stack in ("cross", "decoder") else "")
        + f" · {result.num_layers(stack)} layers × {result.num_heads(stack)} heads",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.command("heatmap")(heatmap)
