"""Attention rollout (Abnar & Zuidema 2020): how much each input token feeds each position at the top.

Per layer ``l``, with ``A_l`` the mean over heads of its ``[query, key]`` patterns::

    Â_l = 0.5 · A_l + 0.5 · I           (the residual connection as attention to oneself)
    Â_l = Â_l / rowsum(Â_l)             (rows sum to 1 again)
    R   = Â_L · … · Â_2 · Â_1           ([query, key]: row i is how much each input token reaches i)

Rows of ``R`` sum to 1, and in a causal model ``R`` is lower triangular like every ``Â_l``.

:func:`attention_flow` is the max-flow variant of the same paper, for short inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.common.errors import InputError


def rollout_stack(capture: AttentionCapture) -> str:
    """The stack rollout runs over: ``self``, or ``encoder`` for encoder-decoder captures."""
    return "encoder" if "encoder" in capture.patterns else capture.stacks[0]


def rollout(capture: AttentionCapture, stack: str | None = None) -> Tensor:
    """The attention rollout of ``capture`` as float32 ``[query, key]`` (see the module docstring).

    ``stack`` defaults to ``self`` (``encoder`` for encoder-decoder models); cross-attention has no
    rollout because its queries and keys are different sequences.
    """
    stack = stack or rollout_stack(capture)
    if stack == "cross":
        raise InputError("rollout needs self-attention (queries and keys the same tokens): use encoder or decoder")
    layers = [capture.layer(index, stack) for index in capture.attention_layers(stack)]
    size = layers[0].shape[-1]
    identity = torch.eye(size, dtype=torch.float64)  # [n, n]
    result = identity
    for pattern in layers:  # [head, n, n], first layer first
        mixed = 0.5 * pattern.double().mean(dim=0) + 0.5 * identity  # [n, n]
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        result = mixed @ result  # Â_l · (Â_{l−1} · … · Â_1)
    return result.float()


#: Attention flow solves one max-flow problem per (query, input token) pair: longer inputs are refused.
MAX_FLOW_TOKENS = 32
#: Capacities are integers for the max-flow solver: weights are scaled by this and rounded.
FLOW_SCALE = 1_000_000


def attention_flow(capture: AttentionCapture, stack: str | None = None) -> Tensor:
    """Attention flow (Abnar & Zuidema 2020) of ``capture`` as float32 ``[query, key]``.

    The layers form a graph: node ``(l, i)`` is token ``i`` after layer ``l`` (``l = 0``: the input),
    and an edge from ``(l, i)`` to ``(l−1, j)`` has capacity ``Â_l[i, j]`` (the residual-augmented,
    row-renormalised head mean of rollout). Entry ``[i, j]`` is the maximum flow from the top node
    ``(L, i)`` to the input node ``(0, j)``; it is at most 1 (all of ``(L, i)``'s capacity). Solved
    with SciPy's max-flow on integer capacities (weights × 10⁶), one problem per pair of tokens, so
    inputs are limited to :data:`MAX_FLOW_TOKENS` tokens.
    """
    import numpy as np
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    stack = stack or rollout_stack(capture)
    if stack == "cross":
        raise InputError(
            "attention flow needs self-attention (queries and keys the same tokens): use encoder or decoder"
        )
    layers = [capture.layer(index, stack) for index in capture.attention_layers(stack)]
    size = layers[0].shape[-1]
    if size > MAX_FLOW_TOKENS:
        raise InputError(
            f"attention flow solves one max-flow problem per pair of tokens, so it takes at most {MAX_FLOW_TOKENS} "
            f"tokens; this text has {size}: shorten it, or draw the attention rollout instead"
        )
    identity = torch.eye(size, dtype=torch.float64)  # [n, n]
    count = (len(layers) + 1) * size  # nodes: (layer 0…L) × token
    rows, columns, capacities = [], [], []
    for layer, pattern in enumerate(layers, start=1):
        mixed = 0.5 * pattern.double().mean(dim=0) + 0.5 * identity  # [n, n] Â_l
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        scaled = (mixed * FLOW_SCALE).round().to(torch.int64)  # [n, n]
        query, key = scaled.nonzero(as_tuple=True)  # edges that carry weight
        rows.append(layer * size + query)
        columns.append((layer - 1) * size + key)
        capacities.append(scaled[query, key])
    graph = csr_matrix(
        (torch.cat(capacities).numpy().astype(np.int32), (torch.cat(rows).numpy(), torch.cat(columns).numpy())),
        shape=(count, count),
    )
    top = len(layers) * size
    flow = torch.zeros(size, size, dtype=torch.float64)  # [query, key]
    for target in range(size):
        for source in range(size):
            flow[target, source] = maximum_flow(graph, top + target, source).flow_value / FLOW_SCALE
    return flow.float()
