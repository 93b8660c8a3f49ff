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


def image_view_payload(capture: AttentionCapture, *, layers: LayerSelection = None) -> dict:
    """JSON-ready data of the page: picture, grid, token labels, and every chosen layer's encoded patterns."""
    grid = image_grid_of(capture)
    chosen = resolve_layers(layers, capture.num_layers())
    height, width = capture.extras["image"].shape[:2]
    encoded = []
    for layer in chosen:
        pattern = capture.layer(layer)  # [head, query, key]
        heads = pattern.shape[0]
        ids = capture.identity.ids("self", layer, heads) if capture.identity is not None else list(range(heads))
        encoded.append({"layer": layer, "heads": ids, **quantize_rows(pattern)})
    return {
        "title": model_title(capture),
        "picture": picture_data_url(capture),
        "width": width,
        "height": height,
        "grid": {**grid.to_dict(), "labels": grid.token_labels()},
        "default_query": 0 if grid.has_class_token else "mean",
        "layers": encoded,
    }


def write_image_view(path: str | Path, capture: AttentionCapture, *, layers: LayerSelection = None) -> Path:
    """Write the self-contained page of an image capture (every layer unless ``layers`` picks some)."""
    payload = image_view_payload(capture, layers=layers)
    page = build_page(
        f"attnviz · {payload['title']} · image", payload, scripts=["common.js", "image_view.js"], styles=["image_view.css"]
    )
    return write_page(path, page)


__all__: Sequence[str] = ["image_view_payload", "picture_data_url", "write_image_view"]
