"""Attention rollout (Abnar & Zuidema 2020): how much each input token feeds each position at the top.

Per layer ``l``, with ``A_l`` the mean over heads of its ``[query, key]`` patterns::

    Â_l = 0.5 · A_l + 0.5 · I           (the residual connection as attention to oneself)
    Â_l = Â_l / rowsum(Â_l)             (rows sum to 1 again)
    R   = Â_L · … · Â_2 · Â_1           ([query, key]: row i is how much each input token reaches i)

Rows of ``R`` sum to 1, and in a causal model ``R`` is lower triangular like every ``Â_l``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnviz.captures import AttentionCapture
from attnviz.errors import InputError


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
    layers = [capture.layer(index, stack) for index in range(capture.num_layers(stack))]
    size = layers[0].shape[-1]
    identity = torch.eye(size, dtype=torch.float64)  # [n, n]
    result = identity
    for pattern in layers:  # [head, n, n], first layer first
        mixed = 0.5 * pattern.double().mean(dim=0) + 0.5 * identity  # [n, n]
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        result = mixed @ result  # Â_l · (Â_{l−1} · … · Â_1)
    return result.float()
