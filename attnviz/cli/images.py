"""What the commands share for images: ``--image`` (a file or ``-``), ``--query``, capturing, drawing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from attnviz.cli.options import INPUT_PANEL, option

ImageOption = option(
    str | None,
    "--image",
    help="A PNG or JPEG image for a vision model (ViT, DeiT, DINOv2, CLIP/SigLIP vision tower, toy-odd-patch), "
    "an image captioner (VisionEncoderDecoderModel, toy-caption: with --target or --generate) or, with a TEXT, "
    "a vision-language model (LLaVA, PaliGemma, Gemma 3, Idefics3, SmolVLM, Qwen2-VL and its kin, Mllama: the picture "
    "inside the text; --generate N lets it write); '-' reads it from standard input. Example: --image cat.png --model "
    "toy-odd-patch",
    show_default=False,
    panel=INPUT_PANEL,
)
QueryOption = option(
    str | None,
    "--query",
    help="Text: one query's attention over every key as strips, one per layer and head (any length): a token "
    "position, negative from the end, or last. Images: whose attention to draw: cls (the class token; the default "
    "when the model has one), mean (the mean over patch queries; the default otherwise) or ROW,COL (one patch). "
    "Example: --query last",
    show_default=False,
    panel="What to show",
)


def images_from_options(folder: Path | None, files: list[str] | None) -> list[Path] | None:
    """The images of ``--images DIR`` (its image files, sorted) then ``--image FILE`` (repeatable); None without
    either. A folder without image files is refused here; each image is read (and checked) when it is used."""
    if folder is None and not files:
        return None
    from attnviz.common.images import image_files

    return (image_files(folder) if folder is not None else []) + [Path(file).expanduser() for file in files or []]


def parse_query(text: str | None):
    """``cls``/``mean``/``ROW,COL`` -> the library's :data:`~attnviz.render.image_overlay.ImageQuery`."""
    from attnviz.common.errors import InputError

    if text is None:
        return None
    value = text.strip().lower()
    if value in ("cls", "mean"):
        return value
    parts = value.split(",")
    try:
        row, col = (int(part) for part in parts)
    except ValueError:
        raise InputError(f"--query {text!r}: give cls, mean or a patch as ROW,COL, e.g. --query 1,2") from None
    return row, col


def image_source(image: str) -> str | bytes:
    """The path, or the bytes of standard input for ``-`` (refusing a terminal or empty input)."""
    from attnviz.cli.stdin import STDIN
    from attnviz.common.errors import InputError

    if image != STDIN:
        return str(Path(image).expanduser())
    if sys.stdin is None or sys.stdin.isatty():
        raise InputError(
            "--image - reads the image from standard input, but nothing is piped in: attnviz ... < cat.png"
        )
    data = sys.stdin.buffer.read()
    if not data:
        raise InputError("standard input is empty: pipe a PNG or JPEG image in")
    return data


def capture_image_option(
    image: str, model: str, device: str, dtype: str, *, text: str | None = None, generation=None, **recording
):
    """Read ``--image`` (before loading anything), load ``model`` and capture the image; with ``text``, the text
    with the picture in it (a vision-language model), while the model continues it with ``generation`` (the
    settings of :func:`attnviz.cli.capturing.generation_settings`); ``recording``: ``layers``, ``heads``."""
    from attnviz.cli.console import console
    from attnviz.common.errors import InputError
    from attnviz.common.images import open_image
    from attnviz.models.specs import load_model

    source = image_source(image)
    picture = open_image(source)  # a bad image fails before the model loads
    if text is not None and not text.strip():
        raise InputError("the text is empty: give at least one word")
    with console.status(f"loading {model}"):
        loaded = load_model(model, device=device, dtype=dtype)
    if text is None:
        from attnviz.captures.images import capture_image

        return capture_image(loaded, picture)
    if generation is None:
        from attnviz.captures.attention_capture import capture

        return capture(loaded, text, image=picture, **recording)
    from attnviz.captures.writing import generate
    from attnviz.common.progress import status

    with status(f"writing up to {generation['max_new_tokens']} tokens"):
        written = generate(loaded, text, image=picture, **generation)
    console.print(f"[bold]written:[/bold] {written.text!r} ({len(written.token_ids)} tokens)", highlight=False)
    return written.capture


def capture_caption_option(image: str, model: str, device: str, dtype: str, target, generation, **recording):
    """Read ``--image`` (before loading anything), load a captioner and capture it on ``target`` (teacher-forced)
    or while it writes (``generation``: the settings of :func:`attnviz.cli.capturing.generation_settings`)."""
    from attnviz.captures.attention_capture import capture
    from attnviz.captures.writing import generate
    from attnviz.cli.console import console
    from attnviz.common.images import open_image
    from attnviz.common.progress import status
    from attnviz.models.caption import captioner_of
    from attnviz.models.specs import load_model

    picture = open_image(image_source(image))  # a bad image fails before the model loads
    with console.status(f"loading {model}"):
        loaded = captioner_of(load_model(model, device=device, dtype=dtype))
    if generation is None:
        return capture(loaded, picture, target=target, **recording)
    with status(f"writing up to {generation['max_new_tokens']} tokens"):
        written = generate(loaded, picture, **generation, **recording)
    console.print(f"[bold]caption:[/bold] {written.text!r} ({len(written.token_ids)} tokens)", highlight=False)
    return written.capture


def draw_image(
    result, out: Path, *, html: bool, layers, heads, query, view: str, style, dpi: int, head_given: bool = True
) -> Path:
    """Write the overlay figure (or the interactive page) of an image capture (a captioned one: one overlay per word;
    without ``head_given``, the mean of the heads)."""
    from attnviz.common.errors import InputError
    from attnviz.render.caption_overlay import is_caption_capture

    if is_caption_capture(result):
        if query is not None or view != "heads":
            raise InputError("a captioned image is drawn word by word: --query and --view do not apply")
        if result.target_tokens is not None and len(result.target_tokens) < 2:  # the start token alone: nothing written
            raise InputError(
                f"{result.model} is an image captioner: give its caption with --target TEXT, or let it write with "
                "--generate N"
            )
        if html:
            from attnviz.render.caption_view import write_caption_view

            return write_caption_view(out, result, layers=layers)
        from attnviz.render.caption_overlay import caption_heatmap
        from attnviz.render.heatmap import save_figure

        chosen: Any = (heads if heads is not None else "all") if head_given else None  # parsed by the option
        return save_figure(caption_heatmap(result, layers=layers, heads=chosen, style=style), out, dpi=dpi)
    if html:
        from attnviz.render.image_view import write_image_view

        return write_image_view(out, result, layers=layers)
    from attnviz.render.heatmap import save_figure
    from attnviz.render.image_overlay import image_heatmap

    figure = image_heatmap(result, layers=layers, heads=heads, query=parse_query(query), view=view, style=style)  # type: ignore[arg-type]  # parsed by the option
    return save_figure(figure, out, dpi=dpi)


def print_image_summary(result) -> None:
    """One line on stderr: the model, the grid and the extra tokens, layers × heads (as the model has them)."""
    from attnviz.cli.capturing import stack_size
    from attnviz.cli.console import console

    if result.target_tokens is not None:  # a captioner
        from attnviz.cli.capturing import print_summary

        print_summary(result, "cross")
        return
    grid = result.image_grid
    extras = ", ".join(grid.token_labels()[: grid.num_extra]) or "no extra tokens"
    if len(result.tokens) > grid.num_tokens:  # a text with a picture in it
        console.print(
            f"[bold]{result.model}[/bold] (vision-language) · {len(result.tokens)} tokens, the picture at positions "
            f"{grid.start}–{grid.start + grid.num_tokens - 1}: {grid.rows}×{grid.cols} patches + {extras} · "
            f"{stack_size(result, 'self')}",
            highlight=False,
        )
        return
    console.print(
        f"[bold]{result.model}[/bold] (vision) · {grid.rows}×{grid.cols} patches + {extras} · "
        f"{stack_size(result, 'self')}",
        highlight=False,
    )


def check_image_options(terminal: bool, words: bool, view: str, stack: str | None) -> None:
    """An image is drawn as overlays (a captioner's as cross-attention): refuse the text-only drawing options."""
    from attnviz.common.errors import InputError

    given = [
        name
        for name, used in (
            ("--terminal", terminal),
            ("--words", words),
            ("--view flow", view == "flow"),
            (f"--stack {stack}", stack not in (None, "cross")),
        )
        if used
    ]
    if given:
        raise InputError(
            f"{' and '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to an image: an image is drawn as "
            "overlays on the picture (--out FILE.png, or .html for every head)"
        )
