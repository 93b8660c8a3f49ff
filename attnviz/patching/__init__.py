"""Which heads make this answer: activation patching, ablation and direct logit attribution, head by head."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz.common.lazy import lazy_exports

if TYPE_CHECKING:
    from attnviz.patching.result import HeadEffect, PatchResult
    from attnviz.patching.run import patch_heads

_EXPORTS = {
    "HeadEffect": "attnviz.patching.result",
    "PatchResult": "attnviz.patching.result",
    "patch_heads": "attnviz.patching.run",
}

__all__ = ["HeadEffect", "PatchResult", "patch_heads"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
