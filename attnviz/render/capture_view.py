"""From a capture to heatmap panels: pick layers and heads, merge words, mark masked cells; and :func:`heatmap`, the
one figure call, which draws whatever it is given (a capture of text, of an image or of a captioned image, one
query's rows, a query–key breakdown or map) with the renderer of that kind."""

from __future__ import annotations

import dataclasses
from typing import Any

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.common.errors import InputError, ParameterError
from attnviz.common.tokens import merge_visibility, merge_words, word_groups
from attnviz.common.wording import plural
from attnviz.render.figures import model_title
from attnviz.render.heatmap import FigureStyle, HeatmapPanel, causal_visibility, render_heatmaps
from attnviz.render.selection import HeadSelection, LayerSelection, MeanOfHeads, resolve_heads, resolve_layers

__all__ = ["FigureStyle", "capture_heatmap", "capture_panels", "heatmap", "model_title"]

STACK_TITLES = {"self": "", "encoder": "encoder ", "decoder": "decoder ", "cross": "cross-attention "}


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
    if not capture.stacks:  # a pruned model whose chosen layers lost every head records nothing
        raise InputError(
            "this capture holds no attention head: every head of the layers recorded was pruned away; choose "
            "another layer (--layer)"
        )
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
    if capture.generated_from is not None and stack != "encoder":  # the encoder's source was not generated
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


#: kind of figure -> (what it is, the options it draws with beyond ``result``): an option given to a figure that
#: does not draw with it is refused, not ignored
_FIGURE_OPTIONS = {
    "grid": ("a text's patterns", {"layers", "heads", "stack", "words", "annotate", "style"}),
    "rollout": ("a text's rollout or flow", {"stack", "annotate", "view"}),
    "strips": ("one query's strips", {"layers", "heads", "stack", "query", "style", "top_k", "max_columns", "title"}),
    "image": ("an image", {"layers", "heads", "query", "view", "style"}),
    "caption": ("a captioned image", {"layers", "heads", "style"}),
    "rows": ("query rows (they hold their layers and heads)", {"style", "top_k", "max_columns", "title"}),
    "query-key": ("a query–key breakdown or map", set()),
}


def heatmap(
    result: Any,
    *,
    layers: LayerSelection = (-1,),
    heads: Any = None,
    stack: str | None = None,
    query: Any = None,
    view: str = "heads",
    words: bool = False,
    annotate: bool | None = None,
    style: FigureStyle | None = None,
    **strip_options: Any,
):
    """A matplotlib figure of ``result``, drawn as what it is:

    * a capture of text (:func:`attnviz.capture`): the patterns of the chosen ``layers`` (default the last) and
      ``heads`` (default all; :data:`~attnviz.render.selection.MEAN_OF_HEADS`: their mean) of ``stack`` as
      heatmaps, one row per layer; ``words`` merges sub-word pieces, ``annotate`` prints the weights;
      ``view="rollout"`` or ``"flow"``: attention rollout or flow through every layer; ``query`` (a token
      position, or ``"last"``): that query's attention over every key as strips, one per layer and head;
    * a capture of an image: each head's attention laid over the picture; ``query``: ``"cls"``, ``"mean"`` or
      a patch ``(row, col)`` (default the class token, else the mean); ``view="rollout"``;
    * a captioned image: the picture, then one overlay per written word (``heads`` default: their mean;
      ``"all"``: one row per head);
    * one query's rows (:func:`attnviz.query_rows`): one strip per layer and head (``strip_options``:
      ``top_k``, ``max_columns``, ``title``, as :func:`attnviz.render.query_strip.query_strip` takes them);
    * a query–key breakdown or map (:func:`attnviz.explain_logit`, :func:`attnviz.query_key_map`), or the pair
      ``(breakdown, mapping)``: side by side.

    ``style``: colour scale, top of the scale and colour map (:class:`~attnviz.render.heatmap.FigureStyle`).
    Save it with :func:`attnviz.save_figure`; a notebook shows it as it is.
    """
    from attnviz.captures.query_rows import QueryRows, query_rows_of_capture
    from attnviz.heads.query_key import LogitBreakdown, QueryKeyMap
    from attnviz.render.caption_overlay import is_caption_capture

    given = {
        "layers": None if layers == (-1,) else layers, "heads": heads, "stack": stack, "query": query,
        "view": None if view == "heads" else view, "words": words or None, "annotate": annotate, "style": style,
        **strip_options,
    }  # fmt: skip
    parts = result if isinstance(result, tuple) else (result,)  # a breakdown, a map, or both
    breakdown = next((part for part in parts if isinstance(part, LogitBreakdown)), None)
    mapping = next((part for part in parts if isinstance(part, QueryKeyMap)), None)
    if (breakdown is not None or mapping is not None) and len(parts) == (breakdown is not None) + (mapping is not None):
        from attnviz.render.query_key import query_key_figure

        _check_options("query-key", given)
        return query_key_figure(breakdown, mapping)
    if isinstance(result, QueryRows):
        from attnviz.render.query_strip import query_strip

        _check_options("rows", given)
        return query_strip(result, style=style, **strip_options)
    if not isinstance(result, AttentionCapture):
        raise TypeError(
            "attnviz.heatmap draws a capture, one query's rows, or a query–key breakdown or map; got a "
            f"{type(result).__name__}"
        )
    if is_caption_capture(result):
        from attnviz.render.caption_overlay import caption_heatmap

        _check_options("caption", given)
        return caption_heatmap(result, layers=layers, heads=heads, style=style)
    if result.image_grid is not None:
        from attnviz.render.image_overlay import image_heatmap

        _check_options("image", given)
        return image_heatmap(result, layers=layers, heads=heads, query=query, view=view, style=style)  # type: ignore[arg-type]
    if query is not None:
        from attnviz.render.query_strip import query_strip

        _check_options("strips", given)
        rows = query_rows_of_capture(result, query, layers, heads, stack=stack)
        return query_strip(rows, style=style, **strip_options)
    if view != "heads":
        from attnviz.render.heads_plots import capture_rollout_figure

        _check_options("rollout", given)
        return capture_rollout_figure(result, stack=stack, annotate=annotate, flow=view == "flow")
    _check_options("grid", given)
    return capture_heatmap(result, layers=layers, heads=heads, stack=stack, words=words, annotate=annotate, style=style)


def _check_options(kind: str, given: dict[str, Any]) -> None:
    """Refuse an option the figure of ``kind`` does not draw with (``given``: option -> value, None: not given)."""
    what, allowed = _FIGURE_OPTIONS[kind]
    for name, value in given.items():
        if value is not None and name not in allowed:
            raise ParameterError(name, f"{{{name}}} does not apply to the figure of {what}", value)
