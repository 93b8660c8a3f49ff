"""Which keys each block of queries can weigh: the causal triangle without a tensor, and the stops of a mask.

A key receives exactly zero weight where the additive mask holds its dtype's lowest value (or ``-inf``), so a block
of queries under a causal mask needs only the keys up to its last query (about half the work of the full square);
:func:`key_stops` reads that from a mask, :func:`causal_stops` knows it without one, and :func:`causal_mask` builds
the triangle's rows where a path needs them as a tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.weak import WeakTensorKeyDictionary


def causal_mask(query_len: int, key_len: int, dtype: torch.dtype, device: torch.device, query_start: int = 0) -> Tensor:
    """The additive causal mask ``[1, 1, q, k]`` of queries ``query_start …`` as transformers' ``eager_mask``
    builds it: 0 on keys ``j ≤ i``, the dtype's lowest value after them."""
    queries = torch.arange(query_start, query_start + query_len, device=device)[:, None]  # [q, 1]
    keys = torch.arange(key_len, device=device)[None, :]  # [1, k]
    hidden = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device)
    return torch.where(keys <= queries, torch.zeros((), dtype=dtype, device=device), hidden)[None, None]


def causal_stops(block: int, query_len: int, key_len: int) -> list[int]:
    """:func:`key_stops` of the causal triangle (``q == k``): a block of queries ``[s, e)`` sees keys ``< e``."""
    return [min(key_len, start + block) for start in range(0, query_len, block)]


def key_stops(mask: Tensor | None, block: int, query_len: int, key_len: int) -> list[int]:
    """For each block of ``block`` queries: how many leading keys can receive any weight.

    A key receives exactly zero weight where the additive mask holds its dtype's lowest
    value (or ``-inf``): ``exp`` of it underflows to 0. So a block of queries ``[s, e)``
    under a causal mask needs only keys ``< e``, about half the work of the full square.
    A block holding a query that may see no key at all keeps every key, because softmax
    makes such a row uniform over all of them.

    Transformers builds one mask per forward pass and hands it to every layer, so the
    result is cached per mask tensor (and dropped with it).
    """
    num_blocks = -(-query_len // block)
    if mask is None or not mask.is_floating_point() or mask.shape[-1] != key_len:
        return [key_len] * num_blocks
    try:
        version = mask._version
    except RuntimeError:  # an inference-mode tensor tracks no version: do not cache
        version = None
    signature = (block, query_len, key_len, version)
    cached = _key_stop_cache.get(mask) if version is not None else None
    if cached is not None and cached[0] == signature:
        return cached[1]
    positions = torch.arange(1, key_len + 1, dtype=torch.int32, device=mask.device)  # [k]
    lowest = torch.finfo(mask.dtype).min
    # in runs of rows: a [rows, k] temporary at a time, not one of the mask's size (268 MB at 8,192 tokens)
    runs = []
    for first in range(0, mask.shape[2], _STOP_ROWS):
        visible = mask[:, :, first : first + _STOP_ROWS] > lowest  # [b|1, 1|h, run|1, k]
        last = torch.where(visible, positions, 0).amax(-1)  # [b|1, 1|h, run|1]: 1 + last visible key; 0: none
        runs.append(torch.where(last == 0, key_len, last).amax(dim=(0, 1)))  # [run|1]
    last = torch.cat(runs)  # [q|1]
    last = last.expand(query_len)  # [q]
    padded = torch.nn.functional.pad(last, (0, num_blocks * block - query_len))  # [blocks·block]
    stops = padded.view(num_blocks, block).amax(-1).tolist()  # [blocks]
    if version is not None:
        _key_stop_cache[mask] = (signature, stops)
    return stops


#: rows of the mask :func:`key_stops` reads at a time
_STOP_ROWS = 256

#: mask tensor -> (signature, key stops); see :func:`key_stops`
_key_stop_cache = WeakTensorKeyDictionary()
