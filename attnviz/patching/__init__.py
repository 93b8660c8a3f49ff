"""Which heads make this answer: activation patching, ablation and direct logit attribution, head by head."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz.common.lazy import exports_by_module, lazy_exports

if TYPE_CHECKING:
    from attnviz.patching.result import HeadEffect as HeadEffect
    from attnviz.patching.result import PatchResult as PatchResult
    from attnviz.patching.run import patch_heads as patch_heads

_EXPORTS = exports_by_module(
    {
        "attnviz.patching.result": ("HeadEffect", "PatchResult"),
        "attnviz.patching.run": ("patch_heads",),
    }
)

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
