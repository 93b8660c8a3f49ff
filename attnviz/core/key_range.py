"""Which keys each block of queries can weigh: causal masks said in words, and the stops of a mask tensor.

A key receives exactly zero weight where the additive mask holds its dtype's lowest value (or ``-inf``), so a block
of queries under a causal mask needs only the keys up to its last query (about half the work of the full square);
:func:`key_stops` reads that from a mask, :meth:`KeyLayout.key_spans` knows it without one, and
:meth:`KeyLayout.additive_rows` builds a block of its rows where a path needs them as a tensor. :class:`KeyLayout`
says a causal mask with a sliding window and padding, or an encoder's padding and two-sided window, without a
``[q, k]`` tensor (268 MB at 8,192 tokens in float32, per sequence of the batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.utils.weak import WeakTensorKeyDictionary


@dataclass(frozen=True, eq=False)
class KeyLayout:
    """A mask said without a ``[q, k]`` tensor. Causal (as many queries as keys, from position 0): query ``i`` may
    weigh keys ``j ≤ i``; with ``window``, only the last ``window`` of them (``j > i − window``, transformers'
    sliding window). With ``key_start``/``key_stop`` (int64 ``[b]``), only its sequence's real tokens
    ``[start, stop)`` (padding on the left or the right). ``causal=False`` (an encoder's padding, any number of
    queries): every query may weigh its sequence's tokens; with ``window`` (as many queries as keys), those less than
    ``window`` positions away on either side (``|i − j| < window``: transformers' bidirectional window ``W`` is
    ``window = W + 1``). A query that may weigh no key (a left-padding position) weighs every key alike, as softmax
    does under transformers' eager mask, which holds the dtype's lowest value on every key of its row.
    ``KeyLayout()`` is the plain causal triangle.
    """

    window: int | None = None
    key_start: Tensor | None = None  # int64 [b]: each sequence's first real key
    key_stop: Tensor | None = None  # int64 [b]: one past its last real key
    causal: bool = True
    #: (block, q, k) -> key_spans: computed once per layout (one per forward pass), read by every layer
    _spans: dict[tuple[int, int, int], tuple[list[int], list[int]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if (self.key_start is None) != (self.key_stop is None):
            raise ValueError("give key_start and key_stop together")
        if self.window is not None and self.window < 1:
            raise ValueError(f"a sliding window holds at least one key, not {self.window}")

    @property
    def triangle_only(self) -> bool:
        """Whether this is the plain causal triangle (no window, no padding): sdpa's ``is_causal``."""
        return self.causal and self.window is None and self.key_start is None

    @property
    def masks_nothing(self) -> bool:
        """Whether every query may weigh every key (not causal, no window, no padding)."""
        return not self.causal and self.window is None and self.key_start is None

    def to(self, device: torch.device | str) -> KeyLayout:
        """The same layout with its per-sequence ranges on ``device``."""
        if self.key_start is None or self.key_stop is None or self.key_start.device == torch.device(device):
            return self
        return KeyLayout(self.window, self.key_start.to(device), self.key_stop.to(device), self.causal)

    def visible_range(self, query_start: int, rows: int, key_len: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """The keys ``[lo, hi)`` each query ``query_start … query_start + rows − 1`` may weigh, as int64
        ``[b|1, rows]`` each (``lo ≥ hi``: none)."""
        positions = torch.arange(query_start, query_start + rows, device=device)[None, :]  # [1, rows]
        lo = positions - self.window + 1 if self.window is not None else torch.zeros_like(positions)
        if self.causal:
            hi = positions + 1
        elif self.window is not None:
            hi = (positions + self.window).clamp(max=key_len)
        else:
            hi = torch.full_like(positions, key_len)
        if self.key_start is not None and self.key_stop is not None:
            lo = torch.maximum(lo, self.key_start.to(device)[:, None])  # [b, rows]
            hi = torch.minimum(hi, self.key_stop.to(device)[:, None])
        return lo, hi

    def additive_rows(
        self, query_start: int, rows: int, key_len: int, dtype: torch.dtype, device: torch.device
    ) -> Tensor:
        """The rows ``query_start …`` of the additive mask ``[b|1, 1, rows, key_len]``, as transformers'
        ``eager_mask`` builds them: 0 on the keys a query may weigh, the dtype's lowest value on the others (on every
        key of a row that may weigh none)."""
        lo, hi = self.visible_range(query_start, rows, key_len, device)
        keys = torch.arange(key_len, device=device)  # [k]
        visible = (keys >= lo[..., None]) & (keys < hi[..., None])  # [b|1, rows, k]
        hidden = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device)
        return torch.where(visible, torch.zeros((), dtype=dtype, device=device), hidden)[:, None]

    def key_spans(self, block: int, query_len: int, key_len: int) -> tuple[list[int], list[int]]:
        """For each block of ``block`` queries: the first key any of its queries may weigh and one past the last
        (every key where one of its queries weighs none: that row weighs them all)."""
        if self.key_start is None:  # no padding: every row sees a key, the window's first and the diagonal's last
            firsts = range(0, query_len, block)
            starts = [max(0, first - self.window + 1) if self.window else 0 for first in firsts]
            if self.causal:
                return starts, [min(key_len, first + block) for first in firsts]
            after = self.window if self.window else key_len  # keys before (last query of the block) + after
            return starts, [min(key_len, min(first + block, query_len) - 1 + after) for first in firsts]
        cached = self._spans.get((block, query_len, key_len))
        if cached is not None:  # transformers hands one mask to every layer
            return cached
        lo, hi = self.visible_range(0, query_len, key_len, torch.device("cpu"))  # [b, q]
        blocks = -(-query_len // block)
        padding = blocks * block - query_len
        blind = torch.nn.functional.pad((lo >= hi).any(0), (0, padding))  # [blocks·block]: a row weighing no key
        first = torch.nn.functional.pad(lo.amin(0), (0, padding), value=key_len).view(blocks, block).amin(-1)
        last = torch.nn.functional.pad(hi.amax(0), (0, padding)).view(blocks, block).amax(-1)  # [blocks]
        blind_block = blind.view(blocks, block).any(-1)  # [blocks]
        starts = torch.where(blind_block, 0, first.clamp(0, key_len)).tolist()
        stops = torch.where(blind_block, key_len, last.clamp(0, key_len)).tolist()
        self._spans[(block, query_len, key_len)] = (starts, stops)
        return starts, stops


def causal_mask(query_len: int, key_len: int, dtype: torch.dtype, device: torch.device, query_start: int = 0) -> Tensor:
    """The additive causal mask ``[1, 1, q, k]`` of queries ``query_start …`` as transformers' ``eager_mask``
    builds it: 0 on keys ``j ≤ i``, the dtype's lowest value after them."""
    return KeyLayout().additive_rows(query_start, query_len, key_len, dtype, torch.device(device))


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
