"""Which layers and heads to draw: the typed selections of :mod:`attnviz.common.selection`.

They live in ``common`` because capturing (which records only what is drawn) takes them too;
this module keeps the names where figures and pages have always imported them from.
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
