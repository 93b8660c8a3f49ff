"""The standard attention pattern: ``softmax(Q Kᵀ·scaling (+ bias) (+ mask))`` in float32, with attention sinks.

:func:`attnviz.core.attention.attend` computes it block by block; shapes as in :mod:`attnviz.core.attention`.
"""

from __future__ import annotations

import torch
from torch import Tensor


class SoftmaxPattern:
    """The standard pattern, ``softmax(Q Kᵀ·scaling (+ bias) (+ mask))`` in float32, as a :data:`PatternFunction`.

    Calling it computes one block into fresh tensors (the differentiable path). :func:`attend`
    recognises it and, when no gradient is needed, computes the same operations in place in
    reused buffers, skipping keys the mask hides from the whole block (see :func:`attend`).
    """

    def __init__(
        self, scaling: float, bias: Tensor | None = None, softcap: float | None = None, sinks: Tensor | None = None
    ):
        self.scaling = scaling
        #: additive ``[1|b, h, q, k]`` scores bias (T5's relative position bias), or None
        self.bias = bias
        #: ``tanh`` soft-capping of the scores (Gemma 2), or None
        self.softcap = softcap
        #: ``[h]`` per-head sink logits (transformers' ``s_aux``: gpt-oss), or None
        self.sinks = sinks

    def __call__(self, query: Tensor, key: Tensor, mask: Tensor | None, query_start: int) -> Tensor:
        return self.pattern_and_sink_share(query, key, mask, query_start)[0]

    def pattern_and_sink_share(
        self, query: Tensor, key: Tensor, mask: Tensor | None, query_start: int
    ) -> tuple[Tensor, Tensor | None]:
        """The pattern ``[b, h, blk, k]`` and, with sinks, each row's sink weight ``[b, h, blk]`` (else None)."""
        scores = self.scores(query, key, mask, query_start)
        if self.sinks is None:
            return torch.softmax(scores, dim=-1, dtype=torch.float32), None
        return softmax_with_sinks(scores, self.sinks)

    def scores(self, query: Tensor, key: Tensor, mask: Tensor | None, query_start: int) -> Tensor:
        """The softmax's input ``[b, h, blk, k]``: ``Q Kᵀ·scaling`` (soft-capped) (+ bias) (+ mask)."""
        block = query.shape[2]
        scores = torch.matmul(query, key.transpose(2, 3)) * self.scaling  # [b, h, blk, k]
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        if self.bias is not None:
            scores = scores + self.bias[:, :, query_start : query_start + block]
        if mask is not None:
            scores = scores + mask
        return scores

    def adjust_scores_(self, scores: Tensor, mask: Tensor | None, query_start: int) -> Tensor:
        """The steps of :meth:`__call__` between ``Q Kᵀ`` and the softmax, in place on ``[b, h, blk, c]``.

        ``c`` may be less than the full key length (keys the mask hides from the whole block
        are left out); bias and mask are cut to match. Same operations in the same order, so
        in float32 the numbers equal :meth:`__call__`'s.
        """
        block, width = scores.shape[2], scores.shape[3]
        scores.mul_(self.scaling)
        if self.softcap is not None:
            scores.div_(self.softcap).tanh_().mul_(self.softcap)
        if self.bias is not None:
            scores.add_(self.bias[:, :, query_start : query_start + block, :width])
        if mask is not None:
            scores.add_(mask[..., :width])
        return scores


def softmax_with_sinks(scores: Tensor, sinks: Tensor) -> tuple[Tensor, Tensor]:
    """``softmax([scores, sink])`` in float32 as transformers' eager attention computes it (gpt-oss), split into the
    pattern ``[b, h, blk, k]`` (contiguous; rows sum to 1 − the sink's weight) and the sink's weight ``[b, h, blk]``.

    ``scores``: ``[b, h, blk, k]``; ``sinks``: ``[h]`` per-head logits.
    """
    sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)  # [b, h, blk, 1]
    weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1, dtype=torch.float32)  # [b, h, blk, k + 1]
    return weights[..., :-1].contiguous(), weights[..., -1]


def softmax_pattern(
    scaling: float, bias: Tensor | None = None, softcap: float | None = None, sinks: Tensor | None = None
) -> SoftmaxPattern:
    """The standard pattern: ``softmax(Q Kᵀ·scaling (+ bias) (+ mask))`` in float32.

    ``bias``: additive ``[1|b, h, q, k]`` scores bias (T5's relative position bias).
    ``softcap``: ``tanh`` soft-capping of the scores (Gemma 2).
    ``sinks``: ``[h]`` per-head sink logits (gpt-oss), one more softmax column with no value (None: no sinks).
    """
    return SoftmaxPattern(scaling, bias, softcap, sinks)
