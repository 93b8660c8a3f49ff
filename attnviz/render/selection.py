"""Which layers and heads to draw: the typed selections of :mod:`attnviz.common.selection`, re-exported.

They live in ``common`` so that captures, which sit below the renderers, can take the same selections.
"""

from __future__ import annotations

from attnviz.common.selection import (
    MEAN_OF_HEADS,
    HeadSelection,
    LayerSelection,
    MeanOfHeads,
    resolve_heads,
    resolve_layers,
)

__all__ = ["MEAN_OF_HEADS", "HeadSelection", "LayerSelection", "MeanOfHeads", "resolve_heads", "resolve_layers"]
