"""From a capture to heatmap panels: pick layers and heads, merge words, mark masked cells."""

from __future__ import annotations

import dataclasses

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.common.errors import InputError
from attnviz.common.tokens import merge_visibility, merge_words, word_groups
from attnviz.common.wording import plural
from attnviz.models.names import full_model_name
from attnviz.render.heatmap import FigureStyle, HeatmapPanel, causal_visibility, render_heatmaps
from attnviz.render.selection import HeadSelection, LayerSelection, MeanOfHeads, resolve_heads, resolve_layers

__all__ = ["FigureStyle", "capture_heatmap", "capture_panels", "model_title"]

STACK_TITLES = {"self": "", "encoder": "encoder ", "decoder": "decoder ", "cross": "cross-attention "}


def model_title(capture: AttentionCapture) -> str:
    """``all-MiniLM-L6-v2 (minilm)``: the model's own name, and the spec it was loaded by when that differs."""
    full = full_model_name(capture.model)
    return full if full == capture.model else f"{full} ({capture.model})"


def capture_panels(
    capture: AttentionCapture,
    *,
    layers: LayerSelection = (-1,),
    heads: HeadSelection = None,
    stack: str | None = None,
    words: bool = False,
) -> tuple[list[list[HeatmapPanel]], list[str], list[str], str]:
    """Panels of the chosen layers and heads (one list per layer), the query and key labels, and a title.

    Selections as in :mod:`attnviz.render.selection`; a pruned model's heads are chosen by their original numbers.
    """
    stack = stack or capture.stacks[0]
    if stack not in capture.patterns:
        raise InputError(f"this capture has no {stack} attention (it has {', '.join(capture.stacks)})")
    # None: every layer the capture holds (a capture of some layers holds no heads in the others)
    layer_indices = (
        capture.recorded_layers(stack) if layers is None else resolve_layers(layers, capture.num_layers(stack))
    )
    query_words, key_words = capture.axis_word_ids(stack)
    query_labels, key_labels = capture.axis_labels(stack, words)  # refuses words without word boundaries

    query_boundary, key_boundary = generated_boundaries(capture, stack, words)
    rows: list[list[HeatmapPanel]] = []
    long_titles: list[str] = []
    for layer_index in layer_indices:
        patterns = capture.layer(layer_index, stack)  # [head, query, key]
        ids = capture.identity.ids(stack, layer_index, patterns.shape[0]) if capture.identity else None
        # a pruned model's heads are chosen by their original numbers, as its figures name them
        count = capture.identity.head_count(stack, layer_index) if capture.identity else None
        selection = resolve_heads(
            heads, ids if ids is not None else range(patterns.shape[0]), count=count, recorded_only=count is not None
        )
        if isinstance(selection, MeanOfHeads):
            head_count = patterns.shape[0]
            chosen = [
                (
                    f"L{layer_index} mean",
                    f"layer {layer_index}, mean of {plural(head_count, 'head')}",
                    patterns.mean(dim=0),
                )
            ]
        else:
            masked = set(capture.identity.masked_ids(stack, layer_index)) if capture.identity else set()
            chosen = []
            for h in selection:
                original = ids[h] if ids else h  # heads keep their numbers from before pruning
                note = " (masked)" if original in masked else ""
                chosen.append(
                    (f"L{layer_index} H{original}{note}", f"layer {layer_index}, head {original}{note}", patterns[h])
                )
        row = []
        for title, long_title, pattern in chosen:
            visible = None
            if capture.is_causal(stack):
                visible = causal_visibility(*pattern.shape)  # [query, key]
            if words:
                pattern = merge_words(pattern, query_words, key_words)  # [Wq, Wk]
                if visible is not None:
                    visible = merge_visibility(visible, query_words, key_words)
            row.append(
                HeatmapPanel(
                    pattern=pattern,
                    title=title,
                    visible=visible,
                    query_boundary=query_boundary,
                    key_boundary=key_boundary,
                )
            )
            long_titles.append(long_title)
        rows.append(row)

    name = model_title(capture)
    if len(long_titles) == 1:
        title = f"{name} · {STACK_TITLES[stack]}{long_titles[0]}"
    elif len(layer_indices) == 1:
        title = f"{name} · {STACK_TITLES[stack]}layer {layer_indices[0]}"
    else:
        per_row = " (one row per layer)" if any(len(row) > 1 for row in rows) else ""
        title = f"{name} · {STACK_TITLES[stack]}layers {_ranges(layer_indices)}{per_row}"
    if capture.generated_from is not None:
        title += " · generated after the dashed line"
    if capture.weighting == "norm":
        title += " · norm-based α·‖f(x)‖"
    return rows, query_labels, key_labels, title


def generated_boundaries(capture: AttentionCapture, stack: str, words: bool) -> tuple[int | None, int | None]:
    """(query, key) index of the first generated token on each axis of ``stack``, or None where none is."""
    if capture.generated_from is None or stack == "encoder":
        return None, None
    first = capture.generated_from
    if words:
        # the word group holding the first generated token (a generated token never joins a prompt word)
        groups = word_groups(capture.axis_word_ids(stack)[0])
        first = next(index for index, group in enumerate(groups) if first in group)
    return first, (None if stack == "cross" else first)


def _ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0–2, 5``."""
    parts: list[str] = []
    start = previous = indices[0]
    for index in [*indices[1:], None]:
        if index is not None and index == previous + 1:
            previous = index
            continue
        parts.append(str(start) if start == previous else f"{start}–{previous}")
        if index is not None:
            start = previous = index
    return ", ".join(parts)


def capture_heatmap(
    capture: AttentionCapture,
    *,
    layers: LayerSelection = (-1,),
    heads: HeadSelection = None,
    stack: str | None = None,
    words: bool = False,
    annotate: bool | None = None,
    style: FigureStyle | None = None,
):
    """A figure of ``capture``'s attention for the chosen layers and heads.

    ``layers``: indices (negative from the end) or None for all, default the last layer;
    ``heads``: head numbers, None for all (default) or :data:`attnviz.render.selection.MEAN_OF_HEADS`.
    ``stack`` defaults to ``self`` (or ``encoder`` for encoder-decoder captures). Several
    layers are drawn one row per layer, heads across.
    """
    rows, query_labels, key_labels, title = capture_panels(
        capture, layers=layers, heads=heads, stack=stack, words=words
    )
    if capture.weighting == "norm":  # the colours are weights times value norms, not probabilities
        style = dataclasses.replace(style or FigureStyle(), label="α·‖f(x)‖, weight × value norm")
    return render_heatmaps(rows, query_labels, key_labels, title=title, annotate=annotate, style=style)
