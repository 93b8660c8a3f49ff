"""The computational graph of a pre-norm transformer: who writes into the residual stream, who reads it.

Senders write: the embeddings, every attention head (its output times its columns of the output
projection), every MLP. Receivers read: every query, key and value head of every layer (separately), every
MLP, and the logits. An edge ``sender → receiver`` exists when the sender writes before the receiver reads:
a head of layer ``l`` feeds the queries, keys and values of layers after ``l``, the MLP of layer ``l`` and
later ones, and the logits; the MLP of layer ``l`` feeds layers after ``l``.

Sender ``s`` is written at stage ``stage(s)`` (embeddings −1, heads of layer ``l`` ``2l``, its MLP ``2l+1``);
receiver ``r`` reads every stage before ``reads(r)`` (attention of layer ``l``: ``2l``, its MLP ``2l+1``,
logits: everything).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnviz.models.readers import ResidualReaders


@dataclass(frozen=True)
class Node:
    """A sender or a receiver. ``kind``: ``embed``/``head``/``mlp``/``logits``; ``input``: ``q``/``k``/``v`` for a
    head's input as a receiver, else None. ``layer``/``head`` are positions in the weights (the result renumbers
    heads as the model numbers them)."""

    kind: str
    layer: int | None = None
    head: int | None = None
    input: str | None = None

    @property
    def label(self) -> str:
        if self.kind == "embed":
            return "embed"
        if self.kind == "logits":
            return "logits"
        if self.kind == "mlp":
            return f"MLP{self.layer}"
        suffix = f".{self.input}" if self.input else ""
        return f"L{self.layer}H{self.head}{suffix}"


@dataclass
class Graph:
    """Every sender and receiver in order, and which pairs are edges (see the module docstring)."""

    senders: list[Node]
    receivers: list[Node]
    sender_stage: Tensor  # [S] long
    receiver_reads: Tensor  # [R] long
    #: per layer (in the order of ``readers.layers``): the sender indices of its heads, of its MLP (or None)
    head_senders: list[range] = field(default_factory=list)
    mlp_senders: list[int | None] = field(default_factory=list)
    #: per layer: the receiver indices of its query/key/value heads (one per projection reader, in projection
    #: order), of its MLP (or None)
    attention_receivers: list[range] = field(default_factory=list)
    mlp_receivers: list[int | None] = field(default_factory=list)

    @property
    def logits_receiver(self) -> int:
        return len(self.receivers) - 1

    def edges(self) -> Tensor:
        """``[S, R]`` bool: True where the sender writes before the receiver reads."""
        return self.sender_stage[:, None] < self.receiver_reads[None, :]

    def upstream(self, stage: int) -> int:
        """How many senders (a prefix of :attr:`senders`) are written before ``stage``."""
        return int((self.sender_stage < stage).sum())


def build_graph(readers: ResidualReaders) -> Graph:
    """The graph of the layers ``readers`` names (layer ``i`` of ``readers.layers`` is stage ``2i``)."""
    senders = [Node("embed")]
    stages = [-1]
    receivers: list[Node] = []
    reads: list[int] = []
    graph = Graph(senders, receivers, torch.empty(0), torch.empty(0))
    for index, layer in enumerate(readers.layers):
        number = layer.site.layer
        start = len(receivers)
        for projection in layer.projections:
            for kind, head in projection.readers:
                receivers.append(Node("head", number, head, kind))
                reads.append(2 * index)
        graph.attention_receivers.append(range(start, len(receivers)))
        heads = sum(1 for p in layer.projections for kind, _ in p.readers if kind == "q")
        first = len(senders)
        for head in range(heads):
            senders.append(Node("head", number, head))
            stages.append(2 * index)
        graph.head_senders.append(range(first, len(senders)))
        if layer.mlp is not None:
            receivers.append(Node("mlp", number))
            reads.append(2 * index + 1)
            graph.mlp_receivers.append(len(receivers) - 1)
            senders.append(Node("mlp", number))
            stages.append(2 * index + 1)
            graph.mlp_senders.append(len(senders) - 1)
        else:
            graph.mlp_receivers.append(None)
            graph.mlp_senders.append(None)
    receivers.append(Node("logits"))
    reads.append(2 * len(readers.layers) + 2)
    graph.sender_stage = torch.as_tensor(stages, dtype=torch.long)
    graph.receiver_reads = torch.as_tensor(reads, dtype=torch.long)
    return graph
