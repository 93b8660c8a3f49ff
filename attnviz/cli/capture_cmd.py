"""``attnviz capture``: save every attention pattern of a sentence for scripts and other tools."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from attnviz.captures.choices import CAPTURE_BITS
from attnviz.cli.audio import AllFramesOption, AudioOption
from attnviz.cli.images import ImageOption
from attnviz.cli.option_groups import (
    GENERATION_OPTIONS,
    RUN_OPTIONS,
    GenerationOptions,
    RunOptions,
    expand_option_groups,
)
from attnviz.cli.options import (
    OUTPUT_PANEL,
    VIEW_PANEL,
    DeviceMapOption,
    ModelOption,
    StackChoice,
    TargetOption,
    WeightingOption,
    choice_enum,
    choice_option,
    option,
    stack_value,
)

#: bits per attention weight in the capture file
Bits = choice_enum("Bits", CAPTURE_BITS)
DEFAULT_BITS = Bits("32")


@expand_option_groups
def capture(
    out: option(
        Path,
        "--out",
        "-o",
        help="Output .safetensors file (format: docs/file-formats.md). Example: --out cat.safetensors",
        panel=OUTPUT_PANEL,
    ),
    text: Annotated[
        str | None,
        typer.Argument(
            help="The sentence to capture; '-' reads it from standard input. Example: \"The cat sat on the mat.\"",
            show_default=False,
        ),
    ] = None,
    bits: choice_option(
        Bits,
        "--bits",
        "number of bits",
        help="Bits per weight: 32 exact float32; 16 float16; 8 one byte per weight plus one scale per row "
        "(error at most row max / 510, file about 4x smaller). Example: --bits 8",
        panel=OUTPUT_PANEL,
    ) = DEFAULT_BITS,
    model: ModelOption = "minilm",
    image: ImageOption = None,
    audio: AudioOption = None,
    target: TargetOption = None,
    with_rollout: option(
        bool,
        "--rollout",
        help="Also store the attention rollout as the float32 tensor 'rollout' [query, key] (the encoder's for "
        "encoder-decoder models). Example: --rollout",
        panel=OUTPUT_PANEL,
    ) = False,
    layer: option(
        str,
        "--layer",
        "-l",
        help="Layers to record: index, negative index, comma list, or 'all'; the file keeps the model's "
        "layer numbers. Example: --layer 3",
        panel=VIEW_PANEL,
    ) = "all",
    head: option(
        str,
        "--head",
        help="Heads to record in each chosen layer: index, comma list, or 'all'. Example: --head 2",
        panel=VIEW_PANEL,
    ) = "all",
    stack: choice_option(
        StackChoice,
        "--stack",
        "stack",
        help="Encoder-decoder models: record only this stack, encoder, decoder or cross (default: all). "
        "Example: --stack cross",
        show_default=False,
        panel=VIEW_PANEL,
        optional=True,
    ) = None,
    running: RunOptions = RUN_OPTIONS,
    device_map: DeviceMapOption = None,
    generating: GenerationOptions = GENERATION_OPTIONS,
    all_frames: AllFramesOption = False,
    weighting: WeightingOption = "weights",
) -> None:
    """Save the attention patterns of TEXT as a safetensors file (one \\[head, query, key] tensor per layer).

    Every layer and head by default; --layer and --head record only those (with the model's numbers).

    Examples:

      attnviz capture "The cat sat on the mat." --out cat.safetensors

      attnviz heatmap --from-capture cat.safetensors --layer 0

      attnviz capture - --model smollm2 --layer 3 --head 2 --bits 8 --out l3h2.safetensors < long.txt

      attnviz capture "The capital of France is" --model smollm2 --generate 10 --bits 8 --out gen.safetensors

      attnviz capture --image odd.png --model toy-odd-patch --out odd.safetensors

      attnviz capture "The cat sat on the mat." --weighting norm --out cat-norm.safetensors

      attnviz capture --image shapes.png --model toy-caption --generate 4 --out caption.safetensors

      attnviz capture --audio speech.wav --model ./whisper-tiny --out speech.safetensors
    """
    from attnviz.cli.capturing import capture_text, max_bytes_value, print_summary
    from attnviz.cli.selection import parse_head_option, parse_layer_option
    from attnviz.cli.stdin import text_or_stdin
    from attnviz.common.errors import InputError
    from attnviz.outputs.files import check_output_path

    out = check_output_path(out, (".safetensors",))
    layers, heads = parse_layer_option(layer), parse_head_option(head)
    if heads is not None and not isinstance(heads, list):
        raise InputError("--head mean draws an average: a capture records heads, give numbers or all")
    byte_limit = max_bytes_value(running.max_bytes)
    partial = layers is not None or heads is not None or stack is not None
    norm = weighting.value == "norm"
    if norm and (image is not None or audio is not None or generating.generate is not None or with_rollout):
        raise InputError("--weighting norm captures a text: --image, --audio, --generate and --rollout do not apply")
    if audio is not None:  # Whisper on a sound (attnviz/cli/audio.py): every stack over its time frames
        from attnviz.cli.audio import capture_audio_option, print_audio_summary

        chosen = {"layers": layers, "heads": heads, "stacks": [stack_value(stack)] if stack else None}
        others = {"TEXT": text, "--image": image, "--rollout": with_rollout}
        result = capture_audio_option(
            audio, model, running, target, generating, others=others, all_frames=all_frames, max_bytes=byte_limit,
            **chosen,
        )  # fmt: skip
        path = result.save(out, bits=int(bits.value))
        print_audio_summary(result, stack_value(stack) or "cross")
        print(path)
        return
    if image is not None:
        from attnviz.cli.images import capture_image_option, print_image_summary

        if text is not None:  # a text with a picture in it: a vision-language model
            generation = generating.settings(target)
            chosen = {"layers": layers, "heads": heads} if generation is None else {}
            result = capture_image_option(
                image, model, running.device, running.dtype, text=text, generation=generation, **chosen
            )
        elif target is not None or generating.generate is not None:  # a captioner, on a given or its own caption
            from attnviz.cli.images import capture_caption_option

            generation = generating.settings(target)
            chosen = {"layers": layers, "heads": heads, "stacks": [stack_value(stack)] if stack else None}
            result = capture_caption_option(image, model, running.device, running.dtype, target, generation, **chosen)
        elif partial:
            raise InputError(
                "--image captures every layer and head of a vision model: give no --layer, --head or --stack with it "
                "(a captioner records only those with --target or --generate)"
            )
        else:
            result = capture_image_option(image, model, running.device, running.dtype)
        if with_rollout:
            from attnviz.heads.propagation import rollout

            result.extras["rollout"] = rollout(result)
        path = result.save(out, bits=int(bits.value))
        print_image_summary(result)
        print(path)
        return
    if text is None:
        raise InputError('no text given: attnviz capture "The cat sat on the mat." --out cat.safetensors (or --image)')
    text = text_or_stdin(text)
    if text is None or not text.strip():
        raise InputError("the text is empty: give at least one word")
    generation = generating.settings(target)
    if generation is not None and partial:
        raise InputError("--generate records every layer and head: give no --layer, --head or --stack with it")
    if with_rollout and partial:
        raise InputError("--rollout goes through every layer and head: give no --layer, --head or --stack with it")
    recording: dict[str, Any] = {} if generation is not None else {"max_bytes": byte_limit}
    if norm:
        recording["weighting"] = "norm"
    if partial:
        recording.update(layers=layers, heads=heads, stacks=[stack_value(stack)] if stack else None)
    result = capture_text(
        text,
        target,
        model,
        running,
        device_map.value if device_map else None,
        generation,
        **recording,
    )
    if with_rollout:
        from attnviz.heads.propagation import rollout

        result.extras["rollout"] = rollout(result)
    path = result.save(out, bits=int(bits.value))
    print_summary(result, None)
    print(path)


def register(app: typer.Typer) -> None:
    app.command("capture")(capture)
