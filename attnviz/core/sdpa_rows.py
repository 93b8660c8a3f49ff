"""The core's path for a few query rows: the output from torch's fused attention, the pattern of those rows only.

One query's attention over every key (``heatmap --query last``) needs one row per head of each layer's
pattern, not the ``n × n`` square. When a forward pass's :class:`~attnviz.core.attention.AttentionContext`
names the rows it observes (``observed_queries``), :func:`attend_observing_rows` lets the layer run the
model's own fast path, :func:`torch.nn.functional.scaled_dot_product_attention` as transformers' ``sdpa``
calls it, and computes the chosen rows' pattern apart, from those queries and every key, with the same
operations as the core's differentiable path (so the rows equal transformers' eager attention to the
rounding of one matrix product). Cost: one sdpa forward plus ``rows × keys`` per head and layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch.utils.weak import WeakTensorKeyDictionary

from attnviz.core.key_range import KeyLayout

if TYPE_CHECKING:
    from attnviz.core.attention import AttentionObserver, AttentionSite, SoftmaxPattern

#: rows of the mask compared at once when checking that it is the causal one (bounds the temporaries)
_CHECK_ROWS = 256


def is_causal_mask(mask: Tensor | None, query_len: int, key_len: int) -> bool:
    """Whether additive ``mask`` ``[b|1, 1|h, q, k]`` is exactly the causal mask (0 on and below the diagonal,
    the dtype's lowest value or ``-inf`` above it) with as many queries as keys: sdpa's ``is_causal=True``
    then computes the same attention without reading it.

    transformers hands one mask to every layer of a forward pass, so the answer is cached per mask tensor.
    """
    if mask is None or query_len != key_len or mask.dim() != 4 or not mask.is_floating_point():
        return False
    if mask.shape[-2] != query_len or mask.shape[-1] != key_len:
        return False
    try:
        version = mask._version
    except RuntimeError:  # an inference-mode tensor tracks no version: do not cache
        version = None
    cached = _causal_cache.get(mask) if version is not None else None
    if cached is not None and cached[0] == version:
        return cached[1]
    lowest = torch.finfo(mask.dtype).min
    keys = torch.arange(key_len, device=mask.device)  # [k]
    causal = True
    for start in range(0, query_len, _CHECK_ROWS):
        stop = min(start + _CHECK_ROWS, query_len)
        rows = mask[..., start:stop, :].clamp(min=lowest)  # [b|1, 1|h, r, k]; -inf counts as lowest
        queries = torch.arange(start, stop, device=mask.device)[:, None]  # [r, 1]
        expected = torch.where(keys <= queries, 0.0, lowest).to(mask.dtype)  # [r, k]
        if not bool((rows == expected).all()):
            causal = False
            break
    if version is not None:
        _causal_cache[mask] = (version, causal)
    return causal


#: mask tensor -> (version, whether it is causal); see :func:`is_causal_mask`
_causal_cache = WeakTensorKeyDictionary()


def attend_observing_rows(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | KeyLayout | None,
    pattern_fn: SoftmaxPattern,
    rows: range,
    observers: Sequence[AttentionObserver],
    site: AttentionSite | None,
    head_mask: Tensor | None,
) -> Tensor:
    """Attention whose output comes from torch's sdpa; observers receive only the pattern of ``rows``.

    ``query`` ``[b, h, q, d]``, ``key``/``value`` ``[b, kvh, k, d]``, ``mask`` additive ``[b|1, 1|h, q, k]``, a
    :class:`~attnviz.core.key_range.KeyLayout` (the plain causal triangle goes to sdpa as ``is_causal``, without a
    tensor) or None, ``head_mask`` ``[1, h, 1, 1]`` or None. Observers see one block,
    ``[b, h, len(rows ∩ 0…q−1), k]`` (fresh, full width) at ``query_start = rows.start``, or nothing when no chosen
    row exists here.
    Returns ``[b, q, h, d]`` (contiguous).
    """
    query_len, key_len = query.shape[2], key.shape[2]
    n_rep = query.shape[1] // key.shape[1]
    start, stop = max(rows.start, 0), min(rows.stop, query_len)
    if observers and start < stop:
        mask_rows: Tensor | None
        if isinstance(mask, KeyLayout):
            mask_rows = mask.additive_rows(start, stop - start, key_len, query.dtype, query.device)
        else:
            mask_rows = None if mask is None else mask[:, :, start:stop] if mask.shape[2] > 1 else mask
        # the differentiable path's operations on the chosen queries and every key: eager's numbers
        pattern = pattern_fn(query[:, :, start:stop], _repeated(key, n_rep), mask_rows, start)  # [b, h, r, k]
        for observer in observers:
            assert site is not None  # attend() passes observers only for a known site
            observer.observe(site, pattern, start)
    # as transformers' sdpa attention calls it on this device: is_causal and shared key/value heads when the
    # mask is the plain causal one (no padding), else the mask with the key/value heads repeated
    if isinstance(mask, KeyLayout):  # the triangle needs no tensor; sdpa reads padding and windows from one
        full = None if mask.triangle_only else mask.additive_rows(0, query_len, key_len, query.dtype, query.device)
        causal = mask.triangle_only
    else:
        full, causal = mask, is_causal_mask(mask, query_len, key_len)
    if causal:
        output = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, scale=pattern_fn.scaling, is_causal=True, enable_gqa=n_rep > 1
        )  # [b, h, q, d]
    else:
        output = torch.nn.functional.scaled_dot_product_attention(
            query, _repeated(key, n_rep), _repeated(value, n_rep), attn_mask=full, scale=pattern_fn.scaling
        )  # [b, h, q, d]
    if head_mask is not None:
        output = output * head_mask  # a head's output is linear in its weights
    return output.transpose(1, 2).contiguous()  # [b, q, h, d]


def _repeated(states: Tensor, n_rep: int) -> Tensor:
    """``[b, kvh, k, d] -> [b, kvh·n_rep, k, d]``: query head ``i`` reads key/value head ``i // n_rep`` (as
    :func:`attnviz.core.attention.repeat_kv`, which imports this module)."""
    return states if n_rep == 1 else states.repeat_interleave(n_rep, dim=1)
