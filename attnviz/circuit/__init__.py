"""From which heads to how they connect: attribution patching of nodes and edges, path patching and faithful
circuits over prompt pairs (:func:`find_circuit`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz.common.lazy import lazy_exports

if TYPE_CHECKING:
    from attnviz.circuit.pairs import PromptPair, read_pairs
    from attnviz.circuit.result import CircuitResult, EdgeScore, NodeScore
    from attnviz.circuit.run import find_circuit

_EXPORTS = {
    "CircuitResult": "attnviz.circuit.result",
    "EdgeScore": "attnviz.circuit.result",
    "NodeScore": "attnviz.circuit.result",
    "PromptPair": "attnviz.circuit.pairs",
    "read_pairs": "attnviz.circuit.pairs",
    "find_circuit": "attnviz.circuit.run",
}

__all__ = ["CircuitResult", "EdgeScore", "NodeScore", "PromptPair", "find_circuit", "read_pairs"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
