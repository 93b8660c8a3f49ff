"""One heatmap panel: the unit that figures draw and that pooling shrinks."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class HeatmapPanel:
    """One heatmap: a ``[query, key]`` pattern, its title, and which cells are visible."""

    pattern: Tensor  # [query, key], float
    title: str
    visible: Tensor | None = None  # [query, key] bool; False cells are drawn as masked
    #: a line is drawn before this row / column: where generated tokens start (None: no line)
    query_boundary: float | None = None
    key_boundary: float | None = None


__all__ = ["HeatmapPanel"]
