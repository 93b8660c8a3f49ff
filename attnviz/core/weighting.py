"""Norm-based attention (Kobayashi et al. 2020, "Attention is not only a weight"), streamed through the core.

A weight ``α_ij`` says where head ``h`` looks; how much key ``j`` changes the head's output is
``‖α_ij f_h(x_j)‖ = α_ij ‖f_h(x_j)‖`` with the transformed value vector

    f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h                         [hidden]

``x_j W_V^h + b_V^h`` is the value vector the attention function receives (``value[:, g, j]``,
``g`` the head's key/value head), and ``W_O^h`` the head's ``[d, hidden]`` slice of the output
projection (its rows ``h·d … h·d+d−1`` when the projection is written ``[h·d, hidden]``). The
output projection's bias and the residual are left out, as in the paper.

Grouped-query attention: query heads that share a key/value head read the same value vectors, but
each has its own slice ``W_O^h``, so ``‖f_h(x_j)‖`` differs between them; every query head gets its
own norms. GPT-2's fused ``c_attn`` needs nothing special: its value third (bias included) is what
reaches the attention function.

:class:`NormWeighting` wraps observers: it reads the values of each call (``accepts_inputs``),
computes ``‖f_h(x_j)‖`` once per call (``[b, h, k]``, no ``n²`` memory) and hands its observers
``α_ij ‖f_h(x_j)‖`` block by block, optionally renormalised so every row sums to 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from attnviz.common.errors import ParameterError
from attnviz.core.attention import AttentionObserver, AttentionSite, repeat_kv
from attnviz.core.choices import WEIGHTINGS, Weighting

#: rows whose norm-weighted mass is below this stay zero when renormalised (every value vector zero)
_TINY = 1e-30


def projection_gram(projections: Tensor) -> Tensor:
    """``W Wᵀ`` of each head's output-projection slice: ``[h, d, d]`` float32 from ``projections`` ``[h, d, hidden]``.

    ‖v W‖² = v (W Wᵀ) vᵀ: a [d, d] Gram matrix per head instead of a [k, hidden] product (hidden/d times fewer
    operations, no [b, k, hidden] temporary). It is formed in float64 so that the float32 quadratic form keeps the
    direct product's precision.
    """
    weights = projections.to(dtype=torch.float64)  # [h, d, hidden]
    return torch.matmul(weights, weights.transpose(1, 2)).float()


def value_norms(value: Tensor, projections: Tensor, out: Tensor | None = None, *, gram: Tensor | None = None) -> Tensor:
    """``‖f_h(x_j)‖`` of every query head and key: ``[b, h, k]`` float32.

    ``value``: ``[b, kvh, k, d]`` (the values the attention function receives); ``projections``:
    ``[h, d, hidden]``, each query head's slice of the output projection. Query head ``h`` reads
    key/value head ``h // (h_total / kvh)`` (as :func:`attnviz.core.attention.repeat_kv`). ``out``: a float32
    ``[b, h, k]`` tensor to write the norms into (a buffer the caller reuses across layers), else a new one.
    ``gram``: :func:`projection_gram` of ``projections``, when the caller keeps it across calls.
    """
    heads = projections.shape[0]
    kv_heads = value.shape[1]
    gram = (projection_gram(projections) if gram is None else gram).to(value.device)  # [h, d, d]
    values = repeat_kv(value.float(), heads // kv_heads)  # [b, h, k, d]
    squared = (torch.matmul(values, gram) * values).sum(dim=-1)  # [b, h, k]
    return torch.sqrt(squared.clamp_(min=0.0), out=out)


class NormWeighting:
    """Observer wrapper that hands ``observers`` the norm-based pattern ``α_ij ‖f_h(x_j)‖`` instead of ``α_ij``.

    ``projections``: site -> ``[h, d, hidden]`` output-projection slices (see :func:`value_norms`);
    a site without one is not passed on. ``renormalise``: divide each row by its sum (rows then sum
    to 1, what distribution statistics need); otherwise the values are the norms themselves.
    """

    accepts_inputs = True
    #: it also accepts ``observe_inputs(site, None, None, value, None)``: the values alone, from models whose
    #: attention the core does not compute (``value`` then ``[b, h, k, d]``, one value head per query head)
    accepts_values_only = True

    def __init__(
        self,
        observers: Sequence[AttentionObserver],
        projections: Mapping[AttentionSite, Tensor],
        *,
        renormalise: bool = False,
    ) -> None:
        self.observers = list(observers)
        self.projections = dict(projections)
        self._grams = {site: projection_gram(heads) for site, heads in self.projections.items()}  # once, [h, d, d]
        self.renormalise = renormalise
        #: with every wrapped observer reading blocks only during observe, the weighted block can live in a
        #: reused buffer and keep the core's leading-keys cut (see AttentionObserver)
        self.accepts_key_prefix = all(getattr(o, "accepts_key_prefix", False) for o in self.observers)
        self._site: AttentionSite | None = None
        self._norms: Tensor | None = None  # [b, h, k] of the call in progress
        self._buffer: Tensor | None = None

    def observe_inputs(
        self, site: AttentionSite, query: Tensor | None, key: Tensor | None, value: Tensor, scaling: float | None
    ) -> None:
        projections = self.projections.get(site)
        self._site = site
        self._norms = None if projections is None else value_norms(value, projections, gram=self._grams[site])
        for observer in self.observers if query is not None else ():
            if getattr(observer, "accepts_inputs", False):
                getattr(observer, "observe_inputs")(site, query, key, value, scaling)  # noqa: B009 (optional)

    def observe(self, site: AttentionSite, pattern: Tensor, query_start: int, **_: object) -> None:
        """``pattern``: ``[b, h, blk, c]``; the observers receive ``[b, h, blk, c]`` weighted the same way."""
        if site != self._site or self._norms is None:
            return
        width = pattern.shape[-1]
        norms = self._norms[:, :, None, :width]  # [b, h, 1, c]
        if self.accepts_key_prefix:
            if self._buffer is None or self._buffer.numel() < pattern.numel() or self._buffer.device != pattern.device:
                self._buffer = torch.empty(pattern.numel(), dtype=torch.float32, device=pattern.device)
            weighted = torch.mul(pattern, norms, out=self._buffer[: pattern.numel()].view(pattern.shape))
        else:
            weighted = pattern * norms  # a tensor of the observers' own, which they may keep
        if self.renormalise:
            weighted.div_(weighted.sum(dim=-1, keepdim=True).clamp_(min=_TINY))
        for observer in self.observers:
            observer.observe(site, weighted, query_start)


def weighted_observers(
    observers: Sequence[AttentionObserver],
    weighting: Weighting,
    projections: Mapping[AttentionSite, Tensor] | None,
    *,
    renormalise: bool = False,
) -> list[AttentionObserver]:
    """``observers`` as they are for ``"weights"``, wrapped in one :class:`NormWeighting` for ``"norm"``."""
    check_weighting(weighting)
    if weighting == "weights":
        return list(observers)
    assert projections is not None  # the caller asked the model for them
    return [NormWeighting(observers, projections, renormalise=renormalise)]


def check_weighting(weighting: str) -> Weighting:
    """``weighting`` if it is one of :data:`~attnviz.core.choices.WEIGHTINGS`, else a ParameterError."""
    if weighting not in WEIGHTINGS:
        raise ParameterError(
            "weighting", f"{{weighting}} must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}", weighting
        )
    return weighting  # type: ignore[return-value]
