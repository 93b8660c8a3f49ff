"""What :func:`attnviz.circuit.find_circuit` finds: node and edge scores, the faithfulness curve, the circuit."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from attnviz.circuit.choices import Method, Metric
from attnviz.common.display import NotebookDisplay
from attnviz.common.wording import plural
from attnviz.outputs import files


@dataclass(frozen=True)
class NodeScore:
    """A sender's attribution (``kind``: ``embed``/``head``/``mlp``; heads numbered as the model numbers them)."""

    kind: str
    layer: int | None
    head: int | None
    attribution: float
    per_position: list[float] | None = None

    @property
    def label(self) -> str:
        return _label(self.kind, self.layer, self.head, None)

    def record(self) -> dict:
        record: dict = {"kind": self.kind, "layer": self.layer, "head": self.head, "attribution": self.attribution}
        if self.per_position is not None:
            record["per_position"] = self.per_position
        return record


@dataclass(frozen=True)
class EdgeScore:
    """One edge: the sender, the receiver (``input`` ``q``/``k``/``v`` for a head, else None), its score, and its
    exact path-patching effect when it was verified."""

    sender: tuple[str, int | None, int | None]  # (kind, layer, head)
    receiver: tuple[str, int | None, int | None, str | None]  # (kind, layer, head, input)
    score: float
    per_position: list[float] | None = None

    @property
    def label(self) -> str:
        return f"{_label(*self.sender, None)} → {_label(*self.receiver)}"

    def record(self) -> dict:
        kind, layer, head = self.sender
        to_kind, to_layer, to_head, to_input = self.receiver
        record: dict = {
            "sender": {"kind": kind, "layer": layer, "head": head},
            "receiver": {"kind": to_kind, "layer": to_layer, "head": to_head, "input": to_input},
            "score": self.score,
        }
        if self.per_position is not None:
            record["per_position"] = self.per_position
        return record


def _label(kind: str, layer: int | None, head: int | None, which: str | None) -> str:
    if kind in ("embed", "logits"):
        return kind
    if kind == "mlp":
        return f"MLP{layer}"
    return f"L{layer}H{head}" + (f".{which}" if which else "")


@dataclass
class CircuitResult(NotebookDisplay):
    """Attribution of every node (and edge), the faithfulness of the top-edge circuits, and the smallest circuit
    reaching the target faithfulness, averaged over the prompt pairs."""

    model: str
    method: Method
    metric: Metric
    clean: str  # the first pair's clean prompt (the page shows its attention)
    corrupt: str
    answer: str
    wrong: str
    pairs: int
    tokens: list[str]  # the first pair's clean tokens
    clean_logit_diff: float  # mean over the pairs
    corrupt_logit_diff: float
    clean_metric: float  # the metric's mean on the clean and the corrupt runs (the logit differences for logit-diff)
    corrupt_metric: float
    nodes: list[NodeScore] = field(default_factory=list)  # in model order
    edges: list[EdgeScore] = field(default_factory=list)  # every edge, largest |score| first (atp: none)
    faithfulness_curve: list[tuple[int, float]] = field(default_factory=list)  # (edges kept, faithfulness)
    circuit_edges: int = 0  # the smallest circuit reaching the target (atp: nodes)
    circuit_faithfulness: float = math.nan
    target: float = 0.8
    kept: str = "edges"  # what the curve counts: "edges" or "nodes" (atp)
    #: verified edges (nodes for atp): (index into edges or nodes, estimated score, exact effect)
    verified: list[tuple[int, float, float]] = field(default_factory=list)
    steps: int = 1
    seconds: float = 0.0
    passes: dict[str, int] = field(default_factory=dict)  # forward / backward passes of each stage

    @property
    def layers(self) -> int:
        return 1 + max((n.layer for n in self.nodes if n.layer is not None), default=-1)

    def top_nodes(self, count: int = 5, kind: str | None = None) -> list[NodeScore]:
        """The ``count`` nodes (of ``kind`` only, when given) with the largest |attribution|, largest first."""
        chosen = [n for n in self.nodes if kind is None or n.kind == kind]
        return sorted(chosen, key=lambda n: abs(n.attribution), reverse=True)[:count]

    def circuit(self) -> list[EdgeScore]:
        """The edges of the smallest circuit reaching the target (empty for ``atp``)."""
        return self.edges[: self.circuit_edges] if self.kept == "edges" else []

    def verification(self) -> dict | None:
        """The verified scores against their exact effects: correlation and sign agreement, or None."""
        if not self.verified:
            return None
        estimated = [score for _, score, _ in self.verified]
        exact = [value for _, _, value in self.verified]
        same_sign = sum(1 for a, b in zip(estimated, exact, strict=True) if (a >= 0) == (b >= 0)) / len(exact)
        items = self.edges if self.kept == "edges" else self.nodes
        return {
            "items": [{**items[index].record(), "exact": value} for index, _, value in self.verified],
            "pearson": _pearson(estimated, exact),
            "sign_agreement": same_sign,
        }

    def record(self, edges: int | None = 200) -> dict:
        """The JSON document; ``edges``: how many of the top edges to list (None: every edge)."""
        listed = self.edges if edges is None else self.edges[:edges]
        record: dict = {
            "method": self.method,
            "clean_logit_diff": self.clean_logit_diff,
            "corrupt_logit_diff": self.corrupt_logit_diff,
            "nodes": [node.record() for node in self.nodes],
            "edges": [edge.record() for edge in listed],
            "faithfulness_curve": [[count, value] for count, value in self.faithfulness_curve],
            "circuit": {"edges": self.circuit_edges, "faithfulness": self.circuit_faithfulness},
        }
        verification = self.verification()
        if verification is not None:
            record["verify"] = verification
        return record

    def save_json(self, path: str | os.PathLike, *, edges: int | None = 200) -> Path:
        """Write :meth:`record` to ``path`` atomically; returns the path."""
        text = json.dumps(self.record(edges), indent=1, allow_nan=False) + "\n"
        return files.write_text_atomic(path, text)

    def summary_line(self) -> str:
        """What was measured, in one line."""
        what = {"atp": "attribution patching (nodes)", "eap": "edge attribution patching"}.get(
            self.method, f"edge attribution patching with integrated gradients ({plural(self.steps, 'step')})"
        )
        metric = "logit difference" if self.metric == "logit-diff" else "KL divergence from the clean run"
        pairs = f"{self.pairs} prompt pairs" if self.pairs > 1 else "one prompt pair"
        return (
            f"{what} · metric: {metric} · {pairs} · smallest circuit reaching faithfulness {self.target:g}: "
            f"{plural(self.circuit_edges, self.kept[:-1])} (faithfulness {self.circuit_faithfulness:.3f})"
        )


def _pearson(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    cov = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    spread = math.sqrt(sum((x - mean_x) ** 2 for x in xs) * sum((y - mean_y) ** 2 for y in ys))
    return cov / spread if spread > 0 else None
