"""``attnviz heatmap``: render a model's attention on a sentence (or a saved capture)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.audio import AllFramesOption, AudioOption
from attnviz.cli.figure_options import CmapOption, ColourScale, DpiOption, ScaleOption, VmaxOption
from attnviz.cli.images import ImageOption, QueryOption, check_image_options
from attnviz.cli.option_groups import (
    GENERATION_OPTIONS,
    RUN_OPTIONS,
    GenerationOptions,
    RunOptions,
    expand_option_groups,
)
from attnviz.cli.options import (
    INPUT_PANEL,
    OUTPUT_PANEL,
    ModelOption,
    StackChoice,
    TargetOption,
    WeightingOption,
    choice_option,
    option,
    stack_value,
)

VIEW_PANEL = "What to show"


class HeatmapView(str, Enum):
    heads = "heads"  # the chosen layers' and heads' patterns
    rollout = "rollout"  # attention rollout (Abnar & Zuidema 2020) through all layers
    flow = "flow"  # attention flow (max-flow through the layers; short inputs only)


@expand_option_groups
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
    image: ImageOption = None,
    audio: AudioOption = None,
    query: QueryOption = None,
    layer: option(
        str | None,
        "--layer",
        "-l",
        help="Layer index, negative index, comma list, or 'all' (default: the last layer; every layer in "
        ".html pages). Example: --layer 0,-1",
        show_default=False,
        panel=VIEW_PANEL,
    ) = None,
    head: option(
        str | None,
        "--head",
        help="Head index, comma list, 'all', or 'mean' (average over heads); default all (for a captioned "
        "image: the mean). Example: --head 3",
        show_default=False,
        panel=VIEW_PANEL,
    ) = None,
    out: option(
        Path,
        "--out",
        "-o",
        help="Output file; .png, .svg or .pdf figure, or .html interactive page (head view and model view) "
        "by suffix. Example: --out view.html",
        panel=OUTPUT_PANEL,
    ) = Path("heatmap.png"),
    annotate: option(
        bool | None,
        "--annotate/--no-annotate",
        help="Print weights in the cells (default: on for a single heatmap of at most 20 tokens). "
        "Example: --no-annotate",
        show_default=False,
        panel=VIEW_PANEL,
    ) = None,
    words: option(
        bool,
        "--words",
        help="Merge sub-word pieces into words: attention to a word is the sum over its pieces, "
        "from a word the mean. Example: --words",
        panel=VIEW_PANEL,
    ) = False,
    cross: option(
        bool,
        "--cross",
        help="Encoder-decoder models: show cross-attention of --target tokens over TEXT tokens. "
        'Example: --cross --target "Le chat"',
        panel=VIEW_PANEL,
    ) = False,
    stack: choice_option(
        StackChoice,
        "--stack",
        "stack",
        help="Encoder-decoder models: encoder, decoder or cross (default encoder; --cross means cross). "
        "Example: --stack decoder",
        panel=VIEW_PANEL,
        optional=True,
    ) = None,
    view: choice_option(
        HeatmapView,
        "--view",
        "view",
        help="heads: the patterns of --layer/--head; rollout: attention rollout through every layer "
        "(Abnar & Zuidema 2020; the encoder's for encoder-decoder models); flow: attention flow, the max-flow "
        "variant (at most 32 tokens). Example: --view rollout",
        panel=VIEW_PANEL,
    ) = HeatmapView.heads,
    target: TargetOption = None,
    from_capture: option(
        Path | None,
        "--from-capture",
        help="Render a capture saved by 'attnviz capture' instead of running a model. "
        "Example: --from-capture cat.safetensors",
        panel=INPUT_PANEL,
    ) = None,
    running: RunOptions = RUN_OPTIONS,
    generating: GenerationOptions = GENERATION_OPTIONS,
    all_frames: AllFramesOption = False,
    weighting: WeightingOption = "weights",
    terminal: option(
        bool,
        "--terminal",
        help="Draw one head (or --head mean) in the terminal instead of writing a file. "
        "Example: --layer 0 --head 3 --terminal",
        panel=OUTPUT_PANEL,
    ) = False,
    scale: ScaleOption = ColourScale.linear,
    vmax: VmaxOption = None,
    cmap: CmapOption = "viridis",
    dpi: DpiOption = 150,
) -> None:
    """Draw attention weights: a heatmap figure, an interactive page, or a view in the terminal.

    Rows are queries, columns keys.

    Examples:

      attnviz heatmap "The cat sat on the mat because it was tired."

      attnviz heatmap "The cat sat on the mat." --layer 2 --head 5 --out head.svg

      attnviz heatmap "The cat sat on the mat." --out view.html

      attnviz heatmap "The cat sat on the mat." --layer 0 --head 3 --terminal

      attnviz heatmap "The cat sat on the mat." --model smollm2 --layer all --head mean --words --scale sqrt

      attnviz heatmap --from-capture cat.safetensors --layer 0

      attnviz heatmap "The capital of France is" --model smollm2 --generate 8 --head mean

      attnviz heatmap "The capital of France is Paris." --model smollm2 --query last --layer all --scale sqrt

      attnviz heatmap --image odd.png --model toy-odd-patch --query 1,2

      attnviz heatmap "The cat sat on the mat." --weighting norm --out cat-norm.png

      attnviz heatmap --image shapes.png --model toy-caption --generate 4

      attnviz heatmap --audio speech.wav --model ./whisper-tiny --target " Hello there."
    """
    from attnviz.captures.attention_capture import AttentionCapture
    from attnviz.cli.capturing import (
        capture_text,
        check_weighting,
        load_quietly,
        max_bytes_value,
        print_page_summary,
        print_summary,
    )
    from attnviz.cli.selection import check_one_pattern, parse_head_option, parse_layer_option
    from attnviz.cli.stdin import text_or_stdin
    from attnviz.common.errors import InputError
    from attnviz.outputs.files import check_output_path
    from attnviz.render.capture_view import FigureStyle, capture_heatmap
    from attnviz.render.heatmap import FIGURE_SUFFIXES, save_figure
    from attnviz.render.html_page import HTML_SUFFIXES

    norm = check_weighting(
        weighting.value,
        query=query,
        image=image or audio,
        generate=generating.generate,
        view=view.value,
        from_capture=from_capture,
    )
    byte_limit = max_bytes_value(
        running.max_bytes
    )  # every option is checked before any model runs, whichever path draws
    if (
        query is not None and image is None and audio is None
    ):  # a text's query position draws strips (attnviz/cli/strips.py)
        from attnviz.cli.strips import query_strips

        style = FigureStyle(scale=scale.value, vmax=vmax, cmap=cmap)
        if query_strips(
            query, text=text, model=model, layer=layer, head=head or "all", out=out, terminal=terminal, words=words,
            view=view.value, stack=stack_value(stack), cross=cross, target=target, from_capture=from_capture,
            generating=generating, running=running, style=style, dpi=dpi,
        ):  # fmt: skip
            return
    html = False
    if image is not None:  # the reason an image refuses an option comes before any advice on that option
        check_image_options(terminal, words, view.value, stack_value(stack))
    if view != HeatmapView.heads and words:
        raise InputError(f"--words applies to --view heads only: --view {view.value} draws sub-word tokens")
    if view != HeatmapView.heads and terminal:
        raise InputError(f"--terminal draws one head's pattern: --view {view.value} is a figure (give --out)")
    # figures and the terminal default to the last layer, pages to every layer
    layers = parse_layer_option(layer) if layer is not None else [-1]
    heads = parse_head_option(head or "all")
    if terminal:
        one_layer, one_head = check_one_pattern(layers, heads)
    else:
        out = check_output_path(out, FIGURE_SUFFIXES + (HTML_SUFFIXES if view == HeatmapView.heads else ()))
        html = out.suffix.lower() in HTML_SUFFIXES
        if html and layer is None:
            layers = None
    style = FigureStyle(scale=scale.value, vmax=vmax, cmap=cmap)
    style.check()
    text = text_or_stdin(text)
    stack = stack_value(stack)
    if cross:
        if stack not in (None, "cross"):
            raise InputError("--cross and --stack disagree: give one of them")
        stack = "cross"
    if audio is not None:  # Whisper on a sound (attnviz/cli/audio.py): its cross-attention over time by default
        from attnviz.cli.audio import capture_audio_option

        stack = stack or "cross"
        chosen = {"layers": layers, "heads": None if html else heads, "stacks": [stack]}
        others = {"TEXT": text, "--image": image, "--from-capture": from_capture, "--query": query}
        result = capture_audio_option(
            audio, model, running, target, generating, others=others, all_frames=all_frames, max_bytes=byte_limit,
            **chosen,
        )  # fmt: skip
    elif image is not None:
        if from_capture is not None:
            raise InputError("--image draws an image: give no --from-capture with it")
        from attnviz.cli.images import capture_image_option, parse_query

        check_image_options(terminal, words, view.value, stack)
        parse_query(query)  # a bad --query fails before the model loads
        if text is not None:  # a text with a picture in it: a vision-language model
            generation = generating.settings(target)
            result = capture_image_option(image, model, running.device, running.dtype, text=text, generation=generation)
        elif (
            target is not None or generating.generate is not None
        ):  # a captioner, on a given caption or the one it writes
            from attnviz.cli.images import capture_caption_option

            generation = generating.settings(target)
            result = capture_caption_option(image, model, running.device, running.dtype, target, generation)
        else:
            result = capture_image_option(image, model, running.device, running.dtype)
    elif from_capture is not None:
        if text is not None:
            raise InputError("give either TEXT or --from-capture, not both")
        if generating.generate is not None:
            raise InputError("--generate runs a model; a saved capture already holds what was generated")
        result = AttentionCapture.load(from_capture)
    else:
        if text is None:
            raise InputError('no text given: attnviz heatmap "The cat sat on the mat." (or --image PATH)')
        if not text.strip():
            raise InputError("the text is empty: give at least one word")
        if stack == "cross" and target is None and generating.generate is None:
            raise InputError('cross-attention needs the decoder text: add --target "..." (or --generate N)')
        generation = generating.settings(target)
        if html and generation is None and not norm:  # a page of any length: streamed when a capture would not fit
            from attnviz.render.html_stream import write_attention_view_of_text

            loaded = load_quietly(model, running.device, running.dtype)
            if stack in ("decoder", "cross") and not loaded.encoder_decoder:
                raise InputError(f"{loaded.name} is not an encoder-decoder model: it has no {stack} attention")
            path, result = write_attention_view_of_text(
                out,
                loaded,
                text,
                target=target,
                max_length=running.max_length,
                truncate=not running.no_truncate,
                words=words,
                layers=layers,
                stacks=[stack] if stack else None,
            )
            print_page_summary(loaded, result, stack)
            print(path)
            return
        # record only what is drawn: the chosen layers (and heads, for a figure) of the stack shown;
        # rollout and flow go through every layer, and a generation records everything
        recording = {}
        if generation is None:
            recording = {"max_bytes": byte_limit, "stacks": [stack] if stack else None}
            if view == HeatmapView.heads:
                recording["layers"] = layers
                recording["heads"] = None if html else heads
            recording["weighting"] = "norm" if norm else "weights"
        result = capture_text(text, target, model, running, generation=generation, **recording)
    if layer is None and result.identity is not None and result.identity.is_subset():
        # the default "last layer" of a capture of some layers is the last one it holds
        pictured = result.image_grid is not None and "cross" in result.stacks  # drawn word by word: its cross layers
        held = result.recorded_layers(stack or ("cross" if pictured else result.stacks[0]))
        layers = held[-1:] if not html else None
        if terminal and layers:
            one_layer = layers[0]
    if result.image_grid is not None:
        from attnviz.cli.images import draw_image, print_image_summary

        check_image_options(terminal, words, view.value, stack)
        drawn = draw_image(
            result, out, html=html, layers=layers, heads=heads, query=query, view=view.value, style=style, dpi=dpi,
            head_given=head is not None,
        )  # fmt: skip
        print_image_summary(result)
        print(drawn)
        return
    if query is not None:
        raise InputError("--query picks a query patch of an image: give --image (or a capture of an image)")
    if stack in ("decoder", "cross") and not result.encoder_decoder:
        raise InputError(f"{result.model} is not an encoder-decoder model: it has no {stack} attention")
    summary = print_summary
    if audio is not None:
        from attnviz.cli.audio import print_audio_summary as summary
    if terminal:
        from attnviz.cli.console import in_colour, view_console
        from attnviz.render.terminal import terminal_heatmap

        screen = view_console()  # the view is the product: stdout
        screen.print(
            terminal_heatmap(
                result,
                layer=one_layer,
                head=one_head,
                stack=stack,
                words=words,
                width=screen.width,
                style=style,
                colour=in_colour(screen),
            )
        )
        summary(result, stack)
        return
    if view != HeatmapView.heads:
        from attnviz.render.heads_plots import capture_rollout_figure

        figure = capture_rollout_figure(result, stack=stack, annotate=annotate, flow=view == HeatmapView.flow)
        path = save_figure(figure, out, dpi=dpi)
    elif html:
        from attnviz.render.html_view import write_attention_view

        # the page draws distributions: norm-based rows are renormalised to sum 1 (its title says so)
        page = result.renormalised() if result.weighting == "norm" else result
        path = write_attention_view(out, page, words=words, layers=layers, stacks=[stack] if stack else None)
    else:
        figure = capture_heatmap(
            result, layers=layers, heads=heads, stack=stack, words=words, annotate=annotate, style=style
        )
        path = save_figure(figure, out, dpi=dpi)
    summary(result, stack)
    print(path)


def register(app: typer.Typer) -> None:
    app.command("heatmap")(heatmap)
