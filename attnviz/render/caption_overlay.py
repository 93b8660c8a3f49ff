"""A captioner's attention drawn on the picture: one overlay per written word (its cross-attention over the image).

From a capture of a captioner (:mod:`attnviz.captures.captioning`): the picture first, then for each
caption token the cross-attention of the step that **wrote** it (the query one position earlier, whose
output predicted the token) over the image tokens, as a translucent heat overlay on the picture
(:func:`~attnviz.render.image_overlay.draw_overlay`), extra tokens beside it. By default the mean over
the heads of the last decoder layer; ``layers``/``heads`` choose others (one row of overlays per layer
and head). One line of the figure says what is averaged.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.captures.vision_language import caption_view, is_vision_language_capture
from attnviz.common.errors import InputError
from attnviz.common.tokens import display_token, word_groups, word_label
from attnviz.render.figures import model_title
from attnviz.render.heatmap import FigureStyle
from attnviz.render.image_overlay import (
    ImagePanel,
    draw_overlay,
    image_grid_of,
    overlay_grid,
    overlay_scale,
    split_keys,
    weight_colorbar,
)
from attnviz.render.selection import HeadSelection, LayerSelection, MeanOfHeads, resolve_heads, resolve_layers

_PANEL_INCHES = 1.9
#: the most written tokens a figure draws, one overlay each (a long text would make hundreds of panels); the page
#: (``.html``) shows every token
MAX_WORD_PANELS = 32
#: overlays side by side before a row of them continues on the next line
PANELS_PER_LINE = 8


def is_caption_capture(capture: AttentionCapture) -> bool:
    """Whether ``capture`` is of a captioner (an image on the source side, a caption on the target side) or of a
    vision-language model (a text with a picture in it), drawn word by word."""
    if is_vision_language_capture(capture):
        return True
    return capture.image_grid is not None and capture.target_tokens is not None and "cross" in capture.patterns


def written_words(capture: AttentionCapture) -> list[tuple[int, str]]:
    """``(query row, label)`` of every caption token after the start token: token ``t`` was written by row ``t - 1``
    (of the captioning view, :func:`~attnviz.captures.vision_language.caption_view`, for a vision-language model)."""
    capture = caption_view(capture)
    if not is_caption_capture(capture):
        raise InputError(f"this capture of {capture.model} holds no caption: capture an image with a caption first")
    tokens = capture.target_tokens or []
    return [(position - 1, display_token(tokens[position])) for position in range(1, len(tokens))]


def caption_text(capture: AttentionCapture) -> str:
    """The caption as words (pieces joined), without the start token: ``a red cat``."""
    tokens, word_ids = capture.target_tokens or [], capture.target_word_ids or []
    if len(word_ids) != len(tokens):
        return " ".join(display_token(token) for token in tokens[1:])
    groups = [group for group in word_groups(word_ids) if group[0] > 0]
    return " ".join(word_label(tokens, group) for group in groups)


def cross_layers(capture: AttentionCapture, layers: LayerSelection) -> list[int]:
    """The chosen layers of the ``cross`` stack (None: all it holds; a model whose cross-attention layers sit
    between its self-attention layers, Mllama, holds those only)."""
    held = capture.recorded_layers("cross")
    count = capture.num_layers("cross")
    return resolve_layers(layers, count, None if held == list(range(count)) else held)


@dataclass
class CaptionRow:
    """One row of overlays: a layer and a head (or the mean of heads), one panel per written word."""

    layer: int
    head: int | None  # the model's head number; None for the mean of heads
    panels: list[ImagePanel]


#: heads of a caption figure: None or ``MeanOfHeads`` the mean of each layer's heads, ``"all"`` every head, a list those
CaptionHeads = HeadSelection | Literal["all"]


def caption_rows(
    capture: AttentionCapture, *, layers: LayerSelection = (-1,), heads: CaptionHeads = None
) -> list[CaptionRow]:
    """The overlays of every written word: one :class:`CaptionRow` per chosen layer × head (see :data:`CaptionHeads`)."""
    capture = caption_view(capture)
    grid = image_grid_of(capture)
    words = written_words(capture)
    if not words:
        raise InputError("the caption has no token after the start token: give a caption or let the model write")
    rows = []
    for layer in cross_layers(capture, layers):
        pattern = capture.layer(layer, "cross")  # [head, query, key]: caption tokens × image tokens
        ids = capture.identity.ids("cross", layer, pattern.shape[0]) if capture.identity else list(range(len(pattern)))
        picked = MeanOfHeads() if heads is None else resolve_heads(None if heads == "all" else heads, ids)
        chosen: list[tuple[int | None, Tensor]] = (
            [(None, pattern.mean(dim=0))]
            if isinstance(picked, MeanOfHeads)
            else [(ids[position], pattern[position]) for position in picked]
        )  # each [query, key]
        for number, weights in chosen:
            panels = []
            for row, label in words:
                patches, extras = split_keys(weights[row], grid)
                panels.append(ImagePanel(patches, extras, label))
            rows.append(CaptionRow(layer, number, panels))
    return rows


def averaging_line(capture: AttentionCapture, rows: list[CaptionRow], *, vision_language: bool = False) -> str:
    """The figure's line saying what each overlay shows, and what is averaged (``vision_language``: the rows are a
    vision-language model's self-attention, over the image tokens only)."""
    heads = {row.layer: capture.layer(row.layer, "cross").shape[0] for row in rows}
    if all(row.head is None for row in rows):
        what = "; ".join(f"layer {layer}: mean over its {count} heads" for layer, count in heads.items())
    else:
        what = "one head per row (no averaging)"
    if vision_language:
        return (
            f"each word: the language model's attention over the image tokens of the step that wrote it (the query "
            f"one token earlier; the rest of its weight goes to the text) · {what}"
        )
    return (
        f"each word: the cross-attention over the image of the step that wrote it (the query one token earlier) · "
        f"{what}"
    )


def caption_heatmap(
    capture: AttentionCapture,
    *,
    layers: LayerSelection = (-1,),
    heads: CaptionHeads = None,
    style: FigureStyle | None = None,
):
    """A matplotlib figure: the picture, then one overlay per written word for each chosen layer × head.

    ``layers``: the decoder layers (default the last); ``heads``: see :data:`CaptionHeads` (default the mean)."""
    style = style or FigureStyle()
    style.check()
    grid = capture.image_grid
    # a text with the picture in it: its self-attention's rows give the rest of their weight to the text
    vision_language = is_vision_language_capture(capture) and grid is not None and grid.placeholder is None
    capture = caption_view(capture)
    grid = image_grid_of(capture)
    rows = caption_rows(capture, layers=layers, heads=heads)
    total = len(rows[0].panels)
    for row in rows:  # the first tokens only, past MAX_WORD_PANELS: the title says so
        row.panels = row.panels[:MAX_WORD_PANELS]
    image = capture.extras["image"].numpy()  # [H, W, 3] in 0–1
    panels = [panel for row in rows for panel in row.panels]
    norm, cmap = overlay_scale(style, panels)
    # each row of overlays in lines of at most PANELS_PER_LINE, the picture (or the row's name) before its first line
    per_line = min(PANELS_PER_LINE, len(rows[0].panels))
    lines_per_row = -(-len(rows[0].panels) // per_line)
    figure, axes = overlay_grid(
        len(rows) * lines_per_row, 1 + per_line, grid, panel=_PANEL_INCHES, extra_room=0.5, label_room=0.45,
        title_room=0.9,
    )  # fmt: skip
    for r, row in enumerate(rows):
        picture_axis = axes[r * lines_per_row][0]
        if r == 0:
            picture_axis.imshow(image)
            picture_axis.set_title("the image", fontsize=8)
        else:
            picture_axis.set_axis_off()
        picture_axis.set_xticks([])
        picture_axis.set_yticks([])
        who = "mean of heads" if row.head is None else f"head {row.head}"
        picture_axis.set_ylabel(f"layer {row.layer}\n{who}", fontsize=8)
        if r:
            picture_axis.text(0.5, 0.5, f"layer {row.layer}\n{who}", ha="center", va="center", fontsize=8)
        for line in range(1, lines_per_row):  # no picture before the row's later lines
            axes[r * lines_per_row + line][0].set_axis_off()
        for index in range(lines_per_row * per_line):
            axis = axes[r * lines_per_row + index // per_line][1 + index % per_line]
            if index < len(row.panels):
                draw_overlay(axis, image, row.panels[index], grid, norm, cmap)
            else:
                axis.set_axis_off()  # the last line's empty places
    weight_colorbar(figure, axes, norm, cmap)
    caption = caption_text(capture)
    # wrapped to the figure's width (about 13 characters an inch at 9 points): a caption of one or two words makes
    # a figure narrower than the line saying what is averaged, which would be cut off at both edges
    characters = max(20, int(figure.get_figwidth() * 13))
    what = "written" if vision_language else "caption"
    shown = len(rows[0].panels)
    if shown < total:  # the text is cut to two lines, and the figure says which tokens it draws
        caption = textwrap.shorten(caption, width=2 * characters, placeholder=" …")
        caption += f" (the first {shown} of {total} tokens drawn; an .html page shows every one)"
    lines = [
        f"{model_title(capture)} · {what}: {caption}",
        averaging_line(capture, rows, vision_language=vision_language),
    ]
    figure.suptitle("\n".join(textwrap.fill(line, characters) for line in lines), fontsize=9)
    return figure


def peak_patches(capture: AttentionCapture, *, layer: int = -1) -> list[tuple[str, tuple[int, int]]]:
    """``(word, (row, col))``: for each written word, the patch where the cross-attention of the step that wrote it,
    maximum over the heads of ``layer``, peaks."""
    capture = caption_view(capture)
    grid = image_grid_of(capture)
    pattern = capture.layer(layer, "cross")  # [head, query, key]
    strongest = pattern[:, :, grid.patch_indices()].amax(dim=0)  # [query, patches] row-major over the picture
    peaks = []
    for row, label in written_words(capture):
        index = int(torch.argmax(strongest[row]))
        peaks.append((label, (index // grid.cols, index % grid.cols)))
    return peaks
