"""``attnviz heatmap --query N`` on text: one query's attention over every key, as strips per layer and head.

``--query`` also picks an image's query patch (``cls``, ``mean``, ``ROW,COL``: :mod:`attnviz.cli.images`);
a token position (an integer, negative from the end, or ``last``) means a text's query. The text path
records only that query's row (:func:`attnviz.captures.query_rows.capture_query_rows`), so it works at
any length the model allows.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnviz.cli.option_groups import GenerationOptions, RunOptions

#: image syntax of ``--query``: left to the image path
_IMAGE_QUERY = re.compile(r"^(cls|mean|[+-]?\d+\s*,\s*[+-]?\d+)$")


def parse_text_query(query: str):
    """``5``, ``-1`` -> an int, ``last`` -> ``"last"``; None for an image's ``cls``/``mean``/``ROW,COL``."""
    from attnviz.captures.query_rows import LAST
    from attnviz.common.errors import InputError

    value = query.strip().lower()
    if value == LAST:
        return LAST
    try:
        return int(value)
    except ValueError:
        pass
    if _IMAGE_QUERY.match(value):
        return None
    raise InputError(
        f"--query {query!r}: give a token position for text (an integer, negative from the end, or last), "
        "or cls, mean or ROW,COL for an image"
    )


def query_strips(
    query: str,
    *,
    text: str | None,
    model: str,
    layer: str | None,
    head: str,
    out: Path,
    terminal: bool,
    words: bool,
    view: str,
    stack: str | None,
    cross: bool,
    target: str | None,
    from_capture: Path | None,
    generating: GenerationOptions,
    running: RunOptions,
    style,
    dpi: int,
) -> bool:
    """Draw the strips of a text's query (``--out`` figure or ``--terminal``); False to leave an image to its path.

    ``generating``, ``running``: the command's option groups (:mod:`attnviz.cli.option_groups`).
    """
    from attnviz.cli.capturing import capture_text
    from attnviz.cli.selection import parse_head_option, parse_layer_option
    from attnviz.cli.stdin import text_or_stdin
    from attnviz.common.errors import InputError
    from attnviz.outputs.files import check_output_path
    from attnviz.render.heatmap import FIGURE_SUFFIXES

    position = parse_text_query(query)
    if position is None:
        if from_capture is not None:  # an image's patch: the image path draws it (and refuses a capture of text)
            return False
        raise InputError(
            f"--query {query} is for images (cls, mean or ROW,COL); for text give a token position: "
            "an integer (negative counts from the end) or last"
        )
    if view != "heads":
        raise InputError(f"--query draws one query's attention head by head: --view {view} does not apply")
    if words:
        raise InputError("--query picks a token position: --words does not apply (drop it)")
    layers = parse_layer_option(layer) if layer is not None else [-1]
    heads = parse_head_option(head)
    if not terminal:
        if out.suffix.lower() in (".html", ".htm"):
            raise InputError("--query draws strips as a figure (.png, .svg, .pdf) or with --terminal, not a page")
        out = check_output_path(out, FIGURE_SUFFIXES)
    style.check()
    text = text_or_stdin(text)
    if cross:
        if stack not in (None, "cross"):
            raise InputError("--cross and --stack disagree: give one of them")
        stack = "cross"
    generation = generating.settings(target)
    if from_capture is not None:
        rows = _rows_of_file(from_capture, query, position, text, generation, layers, heads, stack)
    elif text is None:
        raise InputError('no text given: attnviz heatmap "The cat sat on the mat." --query last')
    elif not text.strip():
        raise InputError("the text is empty: give at least one word")
    elif generation is not None:
        from attnviz.captures.query_rows import query_rows_of_capture

        result = capture_text(text, target, model, running, generation=generation)
        rows = query_rows_of_capture(result, position, layers, heads, stack=stack)
    else:
        from attnviz.captures.query_rows import capture_query_rows
        from attnviz.common.progress import status
        from attnviz.models.specs import load_model

        with status(f"loading {model}"):
            loaded = load_model(model, device=running.device, dtype=running.dtype)
        # its own progress: one step per layer
        rows = capture_query_rows(
            loaded,
            text,
            position,
            layers,
            heads,
            stack=stack,
            target=target,
            max_length=running.max_length,
            truncate=not running.no_truncate,
        )
    _draw(rows, out, terminal, style, dpi)
    return True


def _rows_of_file(path: Path, query: str, position, text, generation, layers, heads, stack):
    """The rows of a saved capture of text (a capture of an image is refused: its queries are patches)."""
    from attnviz.captures.attention_capture import AttentionCapture
    from attnviz.captures.query_rows import query_rows_of_capture
    from attnviz.common.errors import InputError

    if text is not None:
        raise InputError("give either TEXT or --from-capture, not both")
    if generation is not None:
        raise InputError("--generate runs a model; a saved capture already holds what was generated")
    capture = AttentionCapture.load(path)
    if capture.image_grid is not None:
        raise InputError(f"--query {query}: this capture is of an image: give cls, mean or a patch as ROW,COL")
    return query_rows_of_capture(capture, position, layers, heads, stack=stack)


def _draw(rows, out: Path, terminal: bool, style, dpi: int) -> None:
    """Print the strips in the terminal (stdout), or write the figure and print its path; the summary on stderr."""
    from attnviz.cli.console import console
    from attnviz.common.tokens import display_token
    from attnviz.common.wording import plural

    path = None
    if terminal:
        from attnviz.cli.console import in_colour, view_console
        from attnviz.render.strip_terminal import terminal_strip

        view = view_console()  # the view is the product: stdout
        view.print(terminal_strip(rows, width=view.width, style=style, colour=in_colour(view)))
    else:
        from attnviz.render.heatmap import save_figure
        from attnviz.render.query_strip import query_strip

        path = save_figure(query_strip(rows, style=style), out, dpi=dpi)
    strips = sum(row.shape[0] for row in rows.rows)
    console.print(
        f"[bold]{rows.model}[/bold] · {plural(len(rows.key_tokens), 'token')} · query {rows.query} "
        f"('{display_token(rows.query_token)}') · {plural(strips, 'strip')} of {plural(len(rows.layers), 'layer')}",
        highlight=False,
    )
    if path is not None:
        print(path)
