"""Self-contained HTML pages: compact pattern encoding and page assembly.

Every script, style and datum is inlined into one file, so a page works offline,
by double-click or from an e-mail attachment, and asks the network for nothing.
The scripts and styles live as package files in ``attnviz/render/html/``.

Patterns travel as 8-bit codes with one scale per row: for a row ``r`` of a
``[..., query, key]`` pattern, ``code = round(r / max(r) * 255)`` and
``scale = max(r) / 255``; the page reads ``weight = code * scale``, which is off by
at most ``max(r) / 510 <= 1/510``. Codes and scales are base64 (scales as
little-endian float32).
"""

from __future__ import annotations

import base64
import json
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnviz.captures.compact import quantize_rows_8bit
from attnviz.outputs.files import check_output_path, write_text_atomic

HTML_SUFFIXES = (".html", ".htm")


def quantize_rows(pattern: Tensor) -> dict[str, str]:
    """``[..., query, key]`` weights -> base64 ``codes`` (uint8, row-major) and ``scales`` (float32 per row)."""
    keys = pattern.shape[-1]
    rows = pattern.detach().float().cpu().reshape(-1, keys)  # [rows, key]
    codes, scale = quantize_rows_8bit(rows)  # [rows, key] uint8, [rows] float32
    scales = scale.numpy().astype("<f4")  # [rows]
    return {
        "codes": base64.b64encode(codes.numpy().tobytes()).decode("ascii"),
        "scales": base64.b64encode(scales.tobytes()).decode("ascii"),
    }


def dequantize_rows(encoded: dict[str, str], shape: tuple[int, ...]) -> Tensor:
    """The inverse of :func:`quantize_rows` (what the page computes), as a float32 tensor of ``shape``."""
    codes = np.frombuffer(base64.b64decode(encoded["codes"]), dtype=np.uint8).astype(np.float32)
    scales = np.frombuffer(base64.b64decode(encoded["scales"]), dtype="<f4")
    rows = codes.reshape(len(scales), -1) * scales[:, None]  # [rows, key]
    return torch.from_numpy(rows.reshape(shape).copy())


def _asset(name: str) -> str:
    return resources.files("attnviz.render").joinpath("html").joinpath(name).read_text(encoding="utf-8")


def _script_json(payload: object) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>`` or HTML comment can close it early)."""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def build_page(title: str, payload: object, scripts: list[str], styles: list[str]) -> str:
    """One HTML document: ``payload`` as inline JSON (``#attnviz-data``), then the named package scripts."""
    css = "\n".join(_asset(name) for name in styles)
    js = "\n".join(_asset(name) for name in scripts)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        # No resource may come from anywhere but this file (a second guard after writing no URLs at all).
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
        f"<title>{_escape(title)}</title>\n<style>\n{css}\n</style>\n</head>\n<body>\n"
        f'<div id="app"></div>\n'
        f'<script type="application/json" id="attnviz-data">{_script_json(payload)}</script>\n'
        f"<script>\n{js}\n</script>\n</body>\n</html>\n"
    )


def write_page(path: str | Path, page: str) -> Path:
    """Write a page atomically to an ``.html`` path."""
    path = check_output_path(path, HTML_SUFFIXES)
    return write_text_atomic(path, page)
