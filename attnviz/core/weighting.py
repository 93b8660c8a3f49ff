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
from typing import TypeVar

import torch
from torch import Tensor

from attnviz.common.errors import ParameterError
from attnviz.core.attention import AttentionObserver, AttentionSite
from attnviz.core.choices import WEIGHTINGS, Weighting

Key = TypeVar("Key")

#: rows whose norm-weighted mass is below this stay zero when renormalised (every value vector zero)
_TINY = 1e-30


def projection_factors(projections: Mapping[Key, Tensor], *, cache: FactorCache | None = None) -> dict[Key, Tensor]:
    """Per site, ``[h, d, d]`` float32 ``F`` with ``‖v W_h‖ = ‖F_h vᵀ‖`` for every ``v``: each head's
    output-projection slice (``projections[site]`` ``[h, d, hidden]``) reduced to ``d`` outputs with the same norms.

    ``W Wᵀ = L Lᵀ`` (Cholesky of the Gram matrix, formed in float64): ``‖v W‖² = v W Wᵀ vᵀ = ‖Lᵀ vᵀ‖²``, so
    ``F = Lᵀ`` — a ``[d, d]`` product per head instead of ``[d, hidden]`` (hidden/d times fewer operations, no
    ``[b, k, hidden]`` temporary), and a norm with no cancellation (``v G vᵀ`` in float32 would subtract). A head
    whose slice has rank below ``d`` (a pruned head, all zeros) has no Cholesky factor: its eigenvectors scaled by
    the roots of its eigenvalues give one (``G = U Λ Uᵀ = (U √Λ)(U √Λ)ᵀ``). Every site at once: which factors
    failed is read back from the device once, not once per site.

    ``cache``: factors kept from an earlier call on the same model, reused where the projections have not changed
    (:class:`FactorCache`); computed without gradient then.
    """
    if not projections:  # a model whose output projections are all unknown
        return {}
    # the sites of one shape and device side by side along the heads: each step below is then one operation for
    # all of them (a call per site costs more than its work)
    groups: dict[tuple, list[Key]] = {}
    for site, heads in projections.items():
        groups.setdefault((tuple(heads.shape[1:]), heads.device), []).append(site)
    if cache is None:
        factors = _factors_of(projections, list(groups.values()))
    else:
        with torch.no_grad():
            factors = cache.factors(projections, list(groups.values()))
    return {site: factors[site] for site in projections}


def _factors_of(projections: Mapping[Key, Tensor], groups: Sequence[Sequence[Key]]) -> dict[Key, Tensor]:
    """:func:`projection_factors` of every site of ``groups`` (sites of one shape and device each)."""
    if not groups:
        return {}
    grams, lowers, failed_heads = [], [], []
    for sites in groups:
        parts = [projections[site] for site in sites]
        gram = grams_of(parts, together=parts[0].device.type != "cpu")  # [Σh, d, d]
        lower, failed = torch.linalg.cholesky_ex(gram)  # failed [Σh]: nonzero where not positive definite
        grams.append(gram)
        lowers.append(lower)
        failed_heads.append(failed)
    # which heads have no Cholesky factor, read back from the device once
    failed_lists = torch.cat([failed.ne(0).to(failed_heads[0].device) for failed in failed_heads]).tolist()
    factors: dict[Key, Tensor] = {}
    at = 0
    for sites, gram, lower in zip(groups, grams, lowers):
        head_counts = [projections[site].shape[0] for site in sites]
        failed_here = failed_lists[at : at + gram.shape[0]]
        at += gram.shape[0]
        if any(failed_here):
            values, vectors = torch.linalg.eigh(gram)  # [Σh, d], [Σh, d, d]
            scaled = vectors * values.clamp(min=0).sqrt()[:, None, :]  # [Σh, d, d]: U √Λ
            failed = torch.tensor(failed_here, device=gram.device)[:, None, None]
            lower = torch.where(failed, scaled, lower)
        # Lᵀ in float32, made contiguous by the conversion itself; each site's heads are a contiguous part of it
        factor = lower.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)  # [Σh, d, d]
        factors.update(zip(sites, factor.split(head_counts)))
    return factors


class FactorCache:
    """The :func:`projection_factors` of one model kept across calls, each reused while its projections are unchanged.

    Unchanged is decided by content, not by identity: weights edited in place through ``.data`` keep their
    tensor, storage and version counter. Each group of sites (one shape and device) keeps a fingerprint, its
    projections times a fixed random vector (``[Σh, d]``: one matrix–vector product, ``d`` times fewer operations
    than the Gram matrix, in float32 rather than float64); a later call reuses the group's factors only where its
    fingerprint is equal bit for bit. An edit that left it so would have to be orthogonal to that vector in every row
    of every head, or below float32's rounding of the product (and so of the norms). Only the latest call's groups
    are kept: one model's factors (``4·h·d²`` bytes a site).
    """

    def __init__(self) -> None:
        self._kept: dict[tuple, tuple[Tensor, dict]] = {}  # group key -> (fingerprint [Σh, d], site -> factor)
        self._probes: dict[tuple[int, torch.device], Tensor] = {}  # (hidden, device) -> [hidden] float32

    def factors(self, projections: Mapping[Key, Tensor], groups: Sequence[Sequence[Key]]) -> dict[Key, Tensor]:
        """The factors of every site of ``groups``, reused where kept and unchanged, computed (and kept) otherwise."""
        kept: dict[tuple, tuple[Tensor, dict]] = {}
        factors: dict[Key, Tensor] = {}
        missing = []
        for sites in groups:
            parts = [projections[site] for site in sites]
            key = (tuple(sites), tuple(part.shape for part in parts), parts[0].device, parts[0].dtype)
            fingerprint = self._fingerprint(parts)  # [Σh, d]
            before = self._kept.get(key)
            if before is not None and torch.equal(before[0], fingerprint):  # one read back per group
                kept[key] = before
                factors.update(before[1])
            else:
                missing.append((key, sites, fingerprint))
        computed = _factors_of(projections, [sites for _, sites, _ in missing])
        for key, sites, fingerprint in missing:
            kept[key] = (fingerprint, {site: computed[site] for site in sites})
        factors.update(computed)
        self._kept = kept
        return factors

    def clear(self) -> None:
        """Forget every kept factor (the next call computes them again)."""
        self._kept = {}

    def _fingerprint(self, parts: Sequence[Tensor]) -> Tensor:
        """``[Σh, d]``: every part (``[h, d, hidden]``) times the probe of its width and device."""
        width, device = parts[0].shape[-1], parts[0].device
        probe = self._probes.get((width, device))
        if probe is None:
            generator = torch.Generator().manual_seed(width)  # a generator of its own: the global one is the user's
            probe = torch.randn(width, generator=generator).to(device)
            self._probes[(width, device)] = probe
        if device.type == "cpu":  # one product per part: a copy of every part first costs more than the products
            return torch.cat([torch.matmul(part.float(), probe) for part in parts])
        return torch.matmul(torch.cat([part.float() for part in parts]), probe)


def grams_of(parts: Sequence[Tensor], *, together: bool) -> Tensor:
    """``W Wᵀ`` in float64 of every head of ``parts`` (``[h, d, hidden]`` each, one device): ``[Σh, d, d]``.

    ``together``: one product for all (on a GPU, where each operation is a launch); else one per part, whose
    float64 copy stays in the CPU's cache (all of SmolLM2's at once, 80 MB, ran 3× slower).
    """
    if not together:
        products = [torch.matmul(weights, weights.transpose(1, 2)) for weights in (p.double() for p in parts)]
        return products[0] if len(products) == 1 else torch.cat(products)
    weights = (parts[0] if len(parts) == 1 else torch.cat(list(parts))).to(torch.float64)  # [Σh, d, hidden]
    return torch.matmul(weights, weights.transpose(1, 2))


def projection_factor(projections: Tensor) -> Tensor:
    """:func:`projection_factors` of one site's ``projections`` ``[h, d, hidden]``: ``[h, d, d]``."""
    return projection_factors({0: projections})[0]


def value_norms(
    value: Tensor, projections: Tensor, out: Tensor | None = None, *, factor: Tensor | None = None
) -> Tensor:
    """``‖f_h(x_j)‖`` of every query head and key: ``[b, h, k]`` float32.

    ``value``: ``[b, kvh, k, d]`` (the values the attention function receives); ``projections``:
    ``[h, d, hidden]``, each query head's slice of the output projection. Query head ``h`` reads
    key/value head ``h // (h_total / kvh)`` (as :func:`attnviz.core.attention.repeat_kv`). ``out``: a float32
    ``[b, h, k]`` tensor to write the norms into (a buffer the caller reuses across layers), else a new one.
    ``factor``: :func:`projection_factor` of ``projections``, when the caller keeps it across calls. Two
    operations on the values (a product, and a norm written in place), none per head.
    """
    batch, kv_heads, keys, _ = value.shape
    heads = projections.shape[0]
    factor = (projection_factor(projections) if factor is None else factor).to(value.device)  # [h, r, d]
    grouped = factor.view(kv_heads, -1, factor.shape[-1])  # [kvh, n_rep·r, d]: the heads that share values
    # [b, kvh, k, d] @ [kvh, d, n_rep·r] -> [b, kvh, k, n_rep·r]: every head of a group against its shared values,
    # its r outputs innermost (a norm over an inner dimension runs 5× faster on the CPU than over an outer one)
    transformed = torch.matmul(value.float(), grouped.transpose(1, 2))
    transformed = transformed.view(batch, kv_heads, keys, heads // kv_heads, -1)  # [b, kvh, k, n_rep, r]
    if out is None:
        out = value.new_empty(batch, heads, keys, dtype=torch.float32)
    # [b, h, k] (head g·n_rep + i) seen as [b, kvh, k, n_rep]: the norms are written in place through its strides
    in_place = out.view(batch, kv_heads, heads // kv_heads, keys).transpose(2, 3)
    if transformed.requires_grad:  # a norm's out= has no gradient: a copy into place has
        in_place.copy_(torch.linalg.vector_norm(transformed, dim=-1))
    else:
        torch.linalg.vector_norm(transformed, dim=-1, out=in_place)
    return out


class NormWeighting:
    """Observer wrapper that hands ``observers`` the norm-based pattern ``α_ij ‖f_h(x_j)‖`` instead of ``α_ij``.

    ``projections``: site -> ``[h, d, hidden]`` output-projection slices (see :func:`value_norms`);
    a site without one is not passed on. ``renormalise``: divide each row by its sum (rows then sum
    to 1, what distribution statistics need); otherwise the values are the norms themselves. ``cache``: the
    model's :class:`FactorCache`, to reuse the factors of an earlier call.
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
        cache: FactorCache | None = None,
    ) -> None:
        self.observers = list(observers)
        self.projections = dict(projections)
        self._factors = projection_factors(self.projections, cache=cache)  # site -> [h, d, d], once
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
        self._norms = None
        if projections is not None:
            self._norms = value_norms(value, projections, factor=self._factors[site])
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
    cache: FactorCache | None = None,
) -> list[AttentionObserver]:
    """``observers`` as they are for ``"weights"``, wrapped in one :class:`NormWeighting` for ``"norm"`` (its
    factors from ``cache`` where kept)."""
    check_weighting(weighting)
    if weighting == "weights":
        return list(observers)
    assert projections is not None  # the caller asked the model for them
    return [NormWeighting(observers, projections, renormalise=renormalise, cache=cache)]


def check_weighting(weighting: str) -> Weighting:
    """``weighting`` if it is one of :data:`~attnviz.core.choices.WEIGHTINGS`, else a ParameterError."""
    if weighting not in WEIGHTINGS:
        raise ParameterError(
            "weighting", f"{{weighting}} must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}", weighting
        )
    return weighting  # type: ignore[return-value]
