"""The closed sets a pruning run is configured with; imports nothing heavy (the command line lists them)."""

from __future__ import annotations

#: how heads are scored (see :mod:`attnviz.prune.importance`)
METHODS = ("gradient", "ablation", "entropy", "confidence", "random")
#: where heads compete for removal: across the whole model, or within each layer
SCOPES = ("global", "per-layer")
