"""The interactive page of an image capture (``attnviz heatmap --image PATH --out view.html``).

The picture the model saw, with its patch grid; pointing at a patch (or at an extra token beside
the picture) shows where that query attends, as a heat overlay, in the chosen layer and head (or
the mean of the heads); below, the model view: one thumbnail overlay per layer × head for the same
query, clicking one selects it. Self-contained like the text views: the picture is an inline PNG,
the patterns 8-bit codes with a scale per row (:func:`~attnviz.render.html_page.quantize_rows`).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.render.capture_view import model_title
from attnviz.render.html_page import build_page, quantize_rows, write_page
from attnviz.render.image_overlay import image_grid_of
from attnviz.render.selection import LayerSelection, resolve_layers


def picture_data_url(capture: AttentionCapture) -> str:
    """The capture's resized picture as a ``data:image/png;base64,…`` URL."""
    from PIL import Image

    pixels = (capture.extras["image"].clamp(0, 1) * 255).round().byte().numpy()  # [H, W, 3]
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def picture_payload(capture: AttentionCapture) -> dict:
    """The part every image page shares: title, inline picture, its size, and the patch grid with token labels."""
    grid = image_grid_of(capture)
    height, width = capture.extras["image"].shape[:2]
    return {
        "title": model_title(capture),
        "picture": picture_data_url(capture),
        "width": width,
        "height": height,
        "grid": {**grid.to_dict(), "labels": grid.token_labels()},
    }


def encoded_layer(capture: AttentionCapture, layer: int, stack: str, pattern: Tensor) -> dict:
    """One layer's ``[head, query, key]`` pattern for a page: its original head ids and 8-bit row codes."""
    heads = pattern.shape[0]
    ids = capture.identity.ids(stack, layer, heads) if capture.identity is not None else list(range(heads))
    return {"layer": layer, "heads": ids, **quantize_rows(pattern)}


def image_view_payload(capture: AttentionCapture, *, layers: LayerSelection = None) -> dict:
    """JSON-ready data of the page: picture, grid, token labels, and every chosen layer's encoded patterns."""
    chosen = resolve_layers(layers, capture.num_layers())
    return {
        **picture_payload(capture),
        "default_query": 0 if image_grid_of(capture).has_class_token else "mean",
        "layers": [encoded_layer(capture, layer, "self", capture.layer(layer)) for layer in chosen],
    }


def image_view_html(capture: AttentionCapture, *, layers: LayerSelection = None) -> str:
    """The self-contained page of an image capture as a string (every layer unless ``layers`` picks some)."""
    return picture_page(image_view_payload(capture, layers=layers), "image")


def picture_page(payload: dict, kind: str) -> str:
    """The self-contained page of a picture's attention: ``kind`` (``image`` or ``caption``) names its script."""
    return build_page(
        f"attnviz · {payload['title']} · {kind}",
        payload,
        scripts=["common.js", f"{kind}_view.js"],
        styles=["image_view.css"],
    )


def write_image_view(path: str | Path, capture: AttentionCapture, *, layers: LayerSelection = None) -> Path:
    """Write the self-contained page of an image capture (every layer unless ``layers`` picks some)."""
    return write_page(path, image_view_html(capture, layers=layers))


__all__: Sequence[str] = [
    "encoded_layer",
    "image_view_html",
    "image_view_payload",
    "picture_data_url",
    "picture_page",
    "picture_payload",
    "write_image_view",
]
