"""The interactive attention page of ``attnviz heatmap --out view.html``: a head view and a model view.

The page is built from a capture alone (no model): every layer of every stack, all
heads, encoded compactly (:mod:`attnviz.render.html_page`). Causal stacks carry, per
query row, how many keys it may see, so the page draws the rest as masked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.common.errors import InputError
from attnviz.common.tokens import display_token, merge_visibility, merge_words, word_groups, word_label
from attnviz.models.identity import HeadIdentity
from attnviz.render.capture_view import model_title
from attnviz.render.heatmap import causal_visibility
from attnviz.render.html_page import build_page, quantize_rows, write_page
from attnviz.render.selection import LayerSelection, resolve_layers

STACK_NAMES = {
    "self": "self-attention",
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "cross-attention (decoder → encoder)",
}


def axis_labels(capture: AttentionCapture, stack: str, words: bool) -> tuple[list[str], list[str]]:
    """Display labels of the query and key axes of ``stack`` (words or tokens)."""
    query_tokens, key_tokens = capture.axis_tokens(stack)
    if not words:
        return [display_token(t) for t in query_tokens], [display_token(t) for t in key_tokens]
    query_words, key_words = capture.axis_word_ids(stack)
    return (
        [word_label(query_tokens, g) for g in word_groups(query_words)],
        [word_label(key_tokens, g) for g in word_groups(key_words)],
    )


def stack_payload(
    capture: AttentionCapture,
    stack: str,
    *,
    words: bool = False,
    layers: Sequence[int] | None = None,
    identity: HeadIdentity | None = None,
) -> dict:
    """JSON-ready description of one stack: labels, per-row visible key counts, and encoded patterns per layer."""
    query_words, key_words = capture.axis_word_ids(stack)
    if words and (not query_words or not key_words):
        raise InputError("this capture has no word boundaries, so words cannot be merged")
    queries, keys = axis_labels(capture, stack, words)
    layer_indices = list(range(capture.num_layers(stack))) if layers is None else list(layers)
    identity = identity or capture.identity or HeadIdentity()
    encoded_layers = []
    visible_counts = None
    for layer in layer_indices:
        pattern = capture.layer(layer, stack)  # [head, query, key]
        if capture.is_causal(stack):
            visible = causal_visibility(pattern.shape[-2], pattern.shape[-1])  # [query, key]
            if words:
                visible = merge_visibility(visible, query_words, key_words)  # [Wq, Wk]
            visible_counts = [int(n) for n in visible.sum(dim=1)]  # a prefix of keys per row
        if words:
            pattern = merge_words(pattern, query_words, key_words)  # [head, Wq, Wk]
        count = pattern.shape[0]
        ids = identity.ids(stack, layer, count)
        encoded_layers.append(
            {
                "layer": layer,
                "heads": ids,
                "maskedHeads": identity.masked_ids(stack, layer),
                **quantize_rows(pattern),
            }
        )
    return {
        "name": stack,
        "label": STACK_NAMES.get(stack, stack),
        "queries": queries,
        "keys": keys,
        "visible": visible_counts,  # null: every query sees every key
        "layers": encoded_layers,
    }


def attention_view_payload(
    capture: AttentionCapture,
    *,
    title: str | None = None,
    words: bool = False,
    layers: LayerSelection = None,
    stacks: Sequence[str] | None = None,
    identity: HeadIdentity | None = None,
) -> dict:
    """Everything the page shows: the model's title and one :func:`stack_payload` per stack.

    ``layers``: indices (negative from the end) of the layers on the page, None (default) for all.
    """
    chosen = list(stacks) if stacks else capture.stacks
    for stack in chosen:
        if stack not in capture.patterns:
            raise InputError(f"this capture has no {stack} attention (it has {', '.join(capture.stacks)})")
    return {
        "format": "attnviz-view",
        "version": 1,
        "title": title or model_title(capture),
        "words": words,
        "causal": capture.causal,
        "stacks": [
            stack_payload(
                capture,
                stack,
                words=words,
                layers=resolve_layers(layers, capture.num_layers(stack)),
                identity=identity,
            )
            for stack in chosen
        ],
    }


def attention_view_html(capture: AttentionCapture, **options) -> str:
    """The self-contained page (head view + model view) for ``capture``; options as :func:`attention_view_payload`."""
    payload = attention_view_payload(capture, **options)
    return build_page(f"attnviz · {payload['title']}", payload, ["common.js", "view.js"], ["style.css"])


def write_attention_view(path: str | Path, capture: AttentionCapture, **options) -> Path:
    """Write :func:`attention_view_html` to ``path`` (``.html``), atomically."""
    return write_page(path, attention_view_html(capture, **options))
