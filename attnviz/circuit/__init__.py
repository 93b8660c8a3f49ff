"""From which heads to how they connect: attribution patching of nodes and edges, path patching and faithful
circuits over prompt pairs (:func:`find_circuit`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz.common.lazy import exports_by_module, lazy_exports

if TYPE_CHECKING:
    from attnviz.circuit.pairs import PromptPair as PromptPair
    from attnviz.circuit.pairs import read_pairs as read_pairs
    from attnviz.circuit.result import CircuitResult as CircuitResult
    from attnviz.circuit.result import EdgeScore as EdgeScore
    from attnviz.circuit.result import NodeScore as NodeScore
    from attnviz.circuit.run import find_circuit as find_circuit

_EXPORTS = exports_by_module(
    {
        "attnviz.circuit.pairs": ("PromptPair", "read_pairs"),
        "attnviz.circuit.result": ("CircuitResult", "EdgeScore", "NodeScore"),
        "attnviz.circuit.run": ("find_circuit",),
    }
)

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
