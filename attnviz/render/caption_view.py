"""The interactive page of a captioned image (``attnviz heatmap --image IMG --target TEXT --out view.html``).

The picture and the caption as a row of words; clicking a word shows, for every layer and head of the
decoder's cross-attention (and the mean of each layer's heads), where the step that wrote that word
looked on the picture. Self-contained like the other pages: the picture is an inline PNG, the weights
8-bit codes with a scale per row (:func:`~attnviz.render.html_page.quantize_rows`).
"""

from __future__ import annotations

from pathlib import Path

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.captures.vision_language import caption_view, is_vision_language_capture
from attnviz.render.caption_overlay import cross_layers, written_words
from attnviz.render.html_page import write_page
from attnviz.render.image_view import encoded_layer, picture_page, picture_payload
from attnviz.render.selection import LayerSelection


def caption_view_payload(capture: AttentionCapture, *, layers: LayerSelection = None) -> dict:
    """JSON-ready data of the page: picture, grid, the written words, and per chosen layer the cross-attention rows
    of the steps that wrote them (``[head, word, key]``, encoded); a vision-language capture through its captioning
    view."""
    # a picture inside the text: the language model's own weights, of which the picture holds a part
    in_text = is_vision_language_capture(capture) and capture.image_grid.placeholder is None  # type: ignore[union-attr]
    capture = caption_view(capture)
    words = written_words(capture)
    rows = [row for row, _ in words]
    encoded = [
        encoded_layer(capture, layer, "cross", capture.layer(layer, "cross")[:, rows])  # [head, word, key]
        for layer in cross_layers(capture, layers)
    ]
    attended = (
        "the language model's attention over the picture's tokens"
        if in_text
        else "the cross-attention over the picture"
    )
    hint = (
        f"Click a word of the caption: each overlay is {attended} of the step that wrote it (the query one token "
        "earlier), in one layer and head, or the mean of the layer's heads."
        + (" The rest of each row's weight goes to the text." if in_text else "")
    )
    return {**picture_payload(capture), "words": [label for _, label in words], "layers": encoded, "hint": hint}


def caption_view_html(capture: AttentionCapture, *, layers: LayerSelection = None) -> str:
    """The page as a string (for notebooks)."""
    return picture_page(caption_view_payload(capture, layers=layers), "caption")


def write_caption_view(path: str | Path, capture: AttentionCapture, *, layers: LayerSelection = None) -> Path:
    """Write the self-contained page of a captioned image (every layer unless ``layers`` picks some)."""
    return write_page(path, caption_view_html(capture, layers=layers))
