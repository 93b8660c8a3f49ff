"""``attnviz patch``: which heads make this answer — activation patching, ablation, direct logit attribution."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from attnviz.cli.option_groups import PROMPT_PAIR, BatchOptions, OptionGroup, PromptPair, expand_option_groups
from attnviz.cli.options import (
    INPUT_PANEL,
    OUTPUT_PANEL,
    VIEW_PANEL,
    JsonOption,
    choice_enum,
    choice_option,
    option,
    terminal_list_option,
)
from attnviz.patching.choices import ABLATIONS, DIRECTIONS, PATCHED

PATCH_PANEL = "Patching"

Direction = choice_enum("Direction", DIRECTIONS)
Patched = choice_enum("Patched", PATCHED)
Ablation = choice_enum("Ablation", ABLATIONS)


#: --batch-size, --max-length, --device, --dtype, with this command's batch size
BATCHING: Any = OptionGroup(BatchOptions, batch_size=32)


@expand_option_groups
def patch(
    checkpoint: Annotated[
        str,
        typer.Argument(
            help="Model spec: 'smollm2' (default), a causal LM or masked-LM directory, a .gguf file, a hub id in the "
            "local cache, or an attnviz toy or pruned checkpoint. Example: smollm2"
        ),
    ] = "smollm2",
    prompts: PromptPair = PROMPT_PAIR,
    positions: option(
        str,
        "--positions",
        help="Where to put the patched head output: all positions, the last one, or one token position N "
        "(0-based). Example: --positions last",
        panel=PATCH_PANEL,
    ) = "all",
    direction: choice_option(
        Direction,
        "--direction",
        "direction",
        help="denoising: the corrupt run gets one head from the clean run; noising: the clean run gets one "
        "head from the corrupt run. Example: --direction noising",
        panel=PATCH_PANEL,
    ) = "denoising",
    what: choice_option(
        Patched,
        "--what",
        "what to patch",
        help="Patch each head's output (the vector entering the output projection) or its attention pattern. "
        "Example: --what pattern",
        panel=PATCH_PANEL,
    ) = "output",
    ablate: choice_option(
        Ablation,
        "--ablate",
        "ablation",
        help="Also ablate each head in the clean run: set its output to zero, or to its mean over the "
        "positions of --data. Example: --ablate zero",
        panel=PATCH_PANEL,
        show_default=False,
        optional=True,
    ) = None,
    data: option(
        Path | None,
        "--data",
        "-d",
        help='With --ablate mean: the corpus (one example per line, or JSON Lines with "text"). '
        "Example: --data notes.txt",
        panel=INPUT_PANEL,
    ) = None,
    batching: BatchOptions = BATCHING,
    top: option(int, "--top", min=1, help="Top heads to name and list. Example: --top 10", panel=VIEW_PANEL) = 5,
    terminal: terminal_list_option("heads") = False,
    image: option(
        str | None,
        "--image",
        help="A vision-language model (LLaVA, PaliGemma, Gemma 3, Idefics3, SmolVLM, Qwen2-VL, Mllama, …): the "
        "picture inside both prompts (where they name the image token, else before them); its language model's heads "
        "are patched. Example: --image cat.png",
        show_default=False,
        panel=INPUT_PANEL,
    ) = None,
    json_path: JsonOption = None,
    out: option(
        Path | None,
        "--out",
        "-o",
        help="Figure (.png, .svg, .pdf): normalised effects beside direct logit attributions per layer and "
        "head; or a page (.html) that also links each top head to its attention on the clean prompt. "
        "Example: --out patch.png",
        panel=OUTPUT_PANEL,
    ) = None,
) -> None:
    """Which heads make the model give this answer on this prompt: activation patching, ablation and direct logit attribution, for every layer and head.

    Each head gets one run of the corrupt prompt with that head's output from the clean run put in (denoising); the logit difference logit(answer) − logit(wrong) at the last position (an encoder's [MASK]) says how much of the clean behaviour that head alone brings back. Direct logit attribution is the head's own term of the clean logit difference through the final normalisation.

    Examples:

      attnviz patch smollm2 --clean "When Mary and John went to the store, John gave a drink to" --corrupt "When Mary and John went to the store, Mary gave a drink to" --answer " Mary" --wrong " John" --out patch.png

      attnviz patch smollm2 --clean ... --corrupt ... --answer ... --wrong ... --ablate mean --data notes.txt --json patch.json --out patch.html
    """
    from attnviz.cli.console import console
    from attnviz.cli.stdin import corpus_from_options
    from attnviz.common.errors import InputError
    from attnviz.common.progress import status
    from attnviz.models.specs import load_model
    from attnviz.outputs.files import check_output_path
    from attnviz.patching import patch_heads
    from attnviz.render.html_page import HTML_SUFFIXES
    from attnviz.render.patch_plots import FIGURE_SUFFIXES

    missing = prompts.missing()
    if missing is not None:
        raise InputError(f"give {missing}: attnviz patch needs --clean, --corrupt, --answer and --wrong")
    where = _positions(positions)
    if json_path is not None:
        check_output_path(json_path, (".json",))
    if out is not None:
        check_output_path(out, FIGURE_SUFFIXES + HTML_SUFFIXES)
    if data is not None and ablate is None:
        raise InputError("--data is the corpus of --ablate mean: add --ablate mean, or leave --data out")
    texts = corpus_from_options(data, None) if data is not None else None
    picture = None
    if image is not None:
        from attnviz.cli.images import image_source
        from attnviz.common.images import open_image

        picture = open_image(image_source(image))  # a bad image fails before the model loads

    with status(f"loading {checkpoint}"):
        loaded = load_model(checkpoint, device=batching.device, dtype=batching.dtype)
    result = patch_heads(
        loaded,
        **prompts.arguments(),
        positions=where,
        direction=direction.value,
        patched=what.value,
        ablate=ablate.value if ablate is not None else None,
        texts=texts,
        **batching.batching(),
        image=picture,
    )
    written = []
    if json_path is not None:
        written.append(result.save_json(json_path))
    if out is not None:
        written.append(_write_view(loaded, result, out, top, picture))
    for path in written:
        print(path)
    if terminal or not written:
        from attnviz.render.patch_plots import top_heads_table

        console.print(top_heads_table(result, top=top))


def _positions(value: str):
    text = value.strip().lower()
    if text in ("all", "last"):
        return text
    if text.isascii() and text.isdigit():  # "²" and "٣" are digits to isdigit, not to int
        return int(text)
    from attnviz.common.errors import InputError

    raise InputError(f"--positions must be all, last or a token position (0, 1, …), not {value!r}")


def _write_view(loaded, result, out: Path, top: int, picture=None) -> Path:
    from attnviz.render.html_page import HTML_SUFFIXES

    if out.suffix.lower() in HTML_SUFFIXES:
        from attnviz.captures.attention_capture import capture
        from attnviz.render.patch_page import write_patch_page

        return write_patch_page(out, result, capture(loaded, result.clean, image=picture), top=top)
    from attnviz.render.patch_plots import patch_figure, save_figure

    return save_figure(patch_figure(result, top=top), out)


def register(app: typer.Typer) -> None:
    """Add this command to ``app``."""
    app.command("patch")(patch)
