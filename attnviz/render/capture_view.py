"""From a capture to heatmap panels: pick layers and heads, merge words, mark masked cells."""

from __future__ import annotations

from attnviz.captures import AttentionCapture
from attnviz.errors import InputError
from attnviz.render.heatmap import HeatmapPanel, causal_visibility, render_heatmaps
from attnviz.selection import MEAN, parse_heads, parse_layers
from attnviz.words import display_token, merge_visibility, merge_words, word_groups, word_label

#: More heatmaps than this in one figure would be unreadable.
MAX_PANELS = 144

STACK_TITLES = {"self": "", "encoder": "encoder ", "decoder": "decoder ", "cross": "cross-attention "}


def capture_heatmap(
    capture: AttentionCapture,
    *,
    layer: str = "-1",
    head: str = "all",
    stack: str | None = None,
    words: bool = False,
    annotate: bool | None = None,
):
    """A figure of ``capture``'s attention for the chosen layers and heads.

    ``layer``/``head`` are as on the command line (``all``, ``mean``, indices, negative
    indices, comma lists); ``stack`` defaults to ``self`` (or ``encoder`` for
    encoder-decoder captures).
    """
    stack = stack or capture.stacks[0]
    if stack not in capture.patterns:
        raise InputError(f"this capture has no {stack} attention (it has {', '.join(capture.stacks)})")
    layers = parse_layers(layer, capture.num_layers(stack))
    heads_per_layer = [
        1 if head.strip().lower() == "mean" else len(parse_heads(head, capture.num_heads(stack, i))) for i in layers
    ]
    if sum(heads_per_layer) > MAX_PANELS:
        raise InputError(
            f"{sum(heads_per_layer)} heatmaps in one figure would be unreadable (at most {MAX_PANELS}): "
            "pick fewer layers or heads, or use --head mean"
        )
    query_tokens, key_tokens = capture.axis_tokens(stack)
    query_words, key_words = capture.axis_word_ids(stack)
    if words and (not query_words or not key_words):
        raise InputError("this capture has no word boundaries, so --words cannot merge pieces")

    query_boundary, key_boundary = generated_boundaries(capture, stack, words)
    panels: list[HeatmapPanel] = []
    long_titles: list[str] = []
    for layer_index in layers:
        patterns = capture.layer(layer_index, stack)  # [head, query, key]
        selection = parse_heads(head, patterns.shape[0])
        if selection == MEAN:
            heads = patterns.shape[0]
            chosen = [(f"L{layer_index} mean", f"layer {layer_index}, mean of {heads} heads", patterns.mean(dim=0))]
        else:
            chosen = [(f"L{layer_index} H{h}", f"layer {layer_index}, head {h}", patterns[h]) for h in selection]
        for title, long_title, pattern in chosen:
            visible = None
            if capture.is_causal(stack):
                visible = causal_visibility(*pattern.shape)
            if words:
                pattern = merge_words(pattern, query_words, key_words)
                if visible is not None:
                    visible = merge_visibility(visible, query_words, key_words)
            panels.append(
                HeatmapPanel(
                    pattern=pattern,
                    title=title,
                    visible=visible,
                    query_boundary=query_boundary,
                    key_boundary=key_boundary,
                )
            )
            long_titles.append(long_title)

    if words:
        query_labels = [word_label(query_tokens, g) for g in word_groups(query_words)]
        key_labels = [word_label(key_tokens, g) for g in word_groups(key_words)]
    else:
        query_labels = [display_token(t) for t in query_tokens]
        key_labels = [display_token(t) for t in key_tokens]
    if capture.generated_from is not None:
        suffix = " · generated after the dashed line"
    else:
        suffix = ""
    if len(panels) == 1:
        title = f"{capture.model} · {STACK_TITLES[stack]}{long_titles[0]}"
    elif len(layers) == 1:
        title = f"{capture.model} · {STACK_TITLES[stack]}layer {layers[0]}"
    else:
        title = f"{capture.model} · {STACK_TITLES[stack]}layers {', '.join(map(str, layers))}"
    return render_heatmaps(panels, query_labels, key_labels, title=title + suffix, annotate=annotate)


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
