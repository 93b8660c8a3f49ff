"""What an attention page keeps of a long input: a pooled overview and each query row's strongest keys.

A page that stored every cell would grow as ``layers · heads · n²`` (gigabytes at a few
thousand tokens), so past a size limit each layer is reduced, row block by row block, to

* **pooled**: per head a ``G × G`` grid (``G ≤`` :data:`POOLED_GRID`), each cell the *maximum*
  weight of the block of queries × keys it covers (8-bit codes with one scale per grid row,
  as :func:`~attnviz.render.html_page.quantize_rows`);
* **rows**: per head and query, the ``top`` largest weights with their key positions, the
  first token's weight (the attention sink), and ``dropped``: an upper bound on every weight
  the row does not keep. Codes are 8-bit relative to the row's maximum (``scale = max / 255``, stored rounded
  up to bfloat16), so a kept weight reads back within ``max / 510 · (1 + 2⁻⁷) < max / 506``; ``dropped`` is
  rounded *up*, so every
  dropped weight is at most ``dropped · scale``.

The reduction takes ``[head, block, key]`` row blocks in any order (:meth:`LayerReducer.add`),
so a page can be built while the model runs, one block at a time, without ever holding a
layer's full pattern. Each layer's bytes are zlib-compressed and base64-encoded; the page
inflates them with the browser's own ``DecompressionStream``.
"""

from __future__ import annotations

import base64
import zlib

import numpy as np
import torch
from torch import Tensor

#: the pooled overview's largest side (cells per axis)
POOLED_GRID = 128
#: the most keys kept per query row
MAX_TOP = 32
#: the fewest keys kept per query row whatever the budget
MIN_TOP = 4
#: rows up to this many keys are searched for their top keys whole (as fast as searching the best chunks)
DIRECT_TOP_KEYS = 1024
#: zlib level of a page's layers: level 3 takes half the time of level 6 for 5 % more bytes
ZLIB_LEVEL = 3


def bin_width(length: int, bins: int) -> int:
    """Width of the equal bins (the last may be shorter) that cover ``range(length)`` in at most ``bins`` bins."""
    return -(-length // bins)


def bin_starts(length: int, width: int) -> list[int]:
    """First index of each bin of ``width`` over ``range(length)``."""
    return list(range(0, length, width))


def bfloat16_up(values: Tensor) -> tuple[Tensor, Tensor]:
    """Positive float32 ``values`` rounded *up* to bfloat16: (the 16 bits as int32, the value as float32).

    Rounding up keeps ``round(weight / scale) <= 255`` for a row scale ``max / 255``; 7 stored bits of
    mantissa put the scale at most 2⁻⁷ (0.78 %) above its exact value, so a code still reads back within
    ``max / 510 · (1 + 2⁻⁷) < max / 506``.
    """
    bits = values.float().contiguous().view(torch.int32)
    high = (bits >> 16) + ((bits & 0xFFFF) != 0).to(torch.int32)  # next bfloat16 up unless exact
    return high, (high << 16).view(torch.float32)


def _planes(array: np.ndarray) -> bytes:
    """Little-endian ``array`` with its bytes split into planes (all first bytes, then all second bytes, …):
    the high bytes of positions and scales repeat, which zlib then finds."""
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.dtype.itemsize == 1:
        return flat.tobytes()
    return flat.view(np.uint8).reshape(-1, flat.dtype.itemsize).T.tobytes()  # [byte, element]


def _unplane(raw: bytes, offset: int, dtype: str, count: int) -> tuple[np.ndarray, int]:
    """The inverse of :func:`_planes` for ``count`` elements at ``offset``; returns (array, next offset)."""
    kind = np.dtype(dtype)
    size = count * kind.itemsize
    planes = np.frombuffer(raw, dtype=np.uint8, count=size, offset=offset).reshape(kind.itemsize, count)
    return np.ascontiguousarray(planes.T).view(kind).reshape(count), offset + size


def _b64_zlib(*arrays: np.ndarray) -> str:
    raw = b"".join(_planes(a) for a in arrays)
    return base64.b64encode(zlib.compress(raw, ZLIB_LEVEL)).decode("ascii")


class LayerReducer:
    """Reduces one layer's ``[head, query, key]`` pattern, fed in row blocks, to what a long page keeps."""

    def __init__(self, heads: int, queries: int, keys: int, top: int, grid: int = POOLED_GRID):
        self.heads, self.queries, self.keys = heads, queries, keys
        self.top = min(top, keys)
        self.query_width, self.key_width = bin_width(queries, grid), bin_width(keys, grid)
        self.grid_rows, self.grid_cols = -(-queries // self.query_width), -(-keys // self.key_width)
        self.pooled = torch.zeros(heads, self.grid_rows, self.grid_cols)  # [head, Gq, Gk] running max
        self.indices = torch.zeros(heads, queries, self.top, dtype=torch.int64)  # [head, query, top]
        self.values = torch.zeros(heads, queries, self.top)  # [head, query, top]
        self.first = torch.zeros(heads, queries)  # [head, query] weight on key 0
        self.dropped = torch.zeros(heads, queries)  # [head, query] largest weight not kept
        self.seen = 0

    def add(self, block: Tensor, query_start: int) -> None:
        """``block``: ``[head, rows, c]`` weights of queries ``query_start …``; ``c ≤ keys`` leading keys
        (the keys after them have weight 0, as the core's key-prefix blocks)."""
        block = block.detach().float().cpu()
        heads, rows, width = block.shape
        stop = query_start + rows
        # keys in chunks of one pooled column; the last chunk padded with -1, below every weight
        chunks = -(-width // self.key_width)
        if width == chunks * self.key_width:
            padded = block
        else:
            padded = torch.full((heads, rows, chunks * self.key_width), -1.0)
            padded[..., :width] = block
        chunked = padded.view(heads, rows, chunks, self.key_width)  # [head, rows, chunk, key in chunk]
        chunk_max = chunked.amax(dim=-1)  # [head, rows, chunk]
        # pooled: the max over the rows of each query bin in this block, in one scatter (not a pass per bin)
        row_bins = torch.arange(query_start, stop) // self.query_width  # [rows]
        target = self.pooled[:, :, :chunks]  # [head, Gq, chunk]
        target.scatter_reduce_(1, row_bins[None, :, None].expand(heads, rows, chunks), chunk_max, "amax")
        # rows: the top keys, then the largest weight beyond them that is not key 0 (kept apart). Long rows
        # search only the chunks with the largest maxima (which hold them all); short ones are searched whole.
        extra = min(self.top + 2, width)
        if width > DIRECT_TOP_KEYS and chunks > extra:
            best_chunks = torch.topk(chunk_max, extra, dim=-1).indices  # [head, rows, extra]
            candidates = chunked.gather(2, best_chunks[..., None].expand(-1, -1, -1, self.key_width))
            positions = best_chunks[..., None] * self.key_width + torch.arange(self.key_width)  # [h, rows, extra, w]
            values, picked = torch.topk(candidates.flatten(2), extra, dim=-1)  # [head, rows, extra]
            indices = positions.flatten(2).gather(-1, picked)
        else:
            values, indices = torch.topk(block, extra, dim=-1)  # [head, rows, extra], descending
        kept = min(self.top, extra)
        self.values[:, query_start:stop, :kept] = values[..., :kept]
        self.indices[:, query_start:stop, :kept] = indices[..., :kept]
        if kept < self.top:  # fewer keys in the block than kept per row: the rest are keys after it (weight 0)
            self.indices[:, query_start:stop, kept:] = torch.arange(width, width + self.top - kept)
            self.values[:, query_start:stop, kept:] = 0.0
        self.first[:, query_start:stop] = block[..., 0]
        if extra > kept:
            beyond_values, beyond_indices = values[..., kept:], indices[..., kept:]  # [head, rows, ≤2]
            beyond_values = beyond_values.masked_fill(beyond_indices == 0, 0.0)
            self.dropped[:, query_start:stop] = beyond_values.amax(dim=-1)
        self.seen += rows

    def payload(self) -> dict:
        """The JSON-ready reduction (call after every row was added)."""
        if self.seen != self.queries:
            raise ValueError(f"the reducer saw {self.seen} of {self.queries} query rows")
        scale_bits, scale = bfloat16_up(self.values[..., 0] / 255)  # [head, query]: row maximum / 255
        scale = scale.clamp_min(1e-30)
        # kept keys in position order, written as gaps from the previous kept key (small numbers compress)
        positions, order = torch.sort(self.indices, dim=-1)  # [head, query, top] ascending, and where from
        gaps = torch.diff(positions, dim=-1, prepend=torch.zeros_like(positions[..., :1]))  # [head, query, top]
        codes = torch.round(self.values.gather(-1, order) / scale[..., None]).clamp(0, 255).to(torch.uint8)
        first = torch.round(self.first / scale).clamp(0, 255).to(torch.uint8)
        # rounded up, and checked against the scale the page reads: every dropped weight is at most dropped · scale
        dropped = torch.ceil(self.dropped / scale)
        dropped = torch.where(dropped * scale < self.dropped, dropped + 1, dropped).clamp(0, 255).to(torch.uint8)
        index_type = "<u2" if self.keys <= 65536 else "<u4"
        pooled_peak = self.pooled.amax(dim=-1).clamp_min(1e-12)  # [head, Gq]
        pooled_codes = torch.round(self.pooled / pooled_peak[..., None] * 255).clamp(0, 255).to(torch.uint8)
        return {
            "top": self.top,
            "indexBytes": np.dtype(index_type).itemsize,
            "grid": [self.grid_rows, self.grid_cols],
            "queryStarts": bin_starts(self.queries, self.query_width),
            "keyStarts": bin_starts(self.keys, self.key_width),
            # zlib(planes of scales float32 [head, Gq] ++ codes uint8 [head, Gq, Gk])
            "pooled": _b64_zlib((pooled_peak / 255).numpy().astype("<f4"), pooled_codes.numpy()),
            # zlib(planes of scales bfloat16 bits uint16 [head, q] ++ key gaps [head, q, top] ++ codes uint8 [head, q, top]
            #      ++ first uint8 [head, q] ++ dropped uint8 [head, q])
            "rows": _b64_zlib(
                scale_bits.numpy().astype("<u2"),
                gaps.numpy().astype(index_type),
                codes.numpy(),
                first.numpy(),
                dropped.numpy(),
            ),
        }


def decode_rows(encoded: dict, heads: int, queries: int) -> dict[str, Tensor]:
    """The inverse of :meth:`LayerReducer.payload`'s ``rows`` (what the page computes).

    Returns ``indices`` ``[head, query, top]`` (ascending), their ``weights``, ``first`` and
    ``dropped`` ``[head, query]`` (``dropped``: the bound on every weight the row does not keep).
    """
    raw = zlib.decompress(base64.b64decode(encoded["rows"]))
    top, rows = encoded["top"], heads * queries
    index_type = "<u2" if encoded["indexBytes"] == 2 else "<u4"
    scale_bits, offset = _unplane(raw, 0, "<u2", rows)
    scales = (scale_bits.astype(np.uint32) << 16).view(np.float32)  # bfloat16 -> float32
    gaps, offset = _unplane(raw, offset, index_type, rows * top)
    codes, offset = _unplane(raw, offset, "u1", rows * top)
    first, offset = _unplane(raw, offset, "u1", rows)
    dropped, offset = _unplane(raw, offset, "u1", rows)
    scales = scales.reshape(heads, queries)
    positions = np.cumsum(gaps.reshape(heads, queries, top).astype(np.int64), axis=-1)
    return {
        "indices": torch.from_numpy(positions),
        "weights": torch.from_numpy(codes.reshape(heads, queries, top) * scales[..., None]),
        "first": torch.from_numpy(first.reshape(heads, queries) * scales),
        "dropped": torch.from_numpy(dropped.reshape(heads, queries) * scales),
    }


def decode_pooled(encoded: dict, heads: int) -> Tensor:
    """The pooled overview ``[head, Gq, Gk]`` (block maxima) as the page reads it."""
    raw = zlib.decompress(base64.b64decode(encoded["pooled"]))
    grid_rows, grid_cols = encoded["grid"]
    scales, offset = _unplane(raw, 0, "<f4", heads * grid_rows)
    codes, _ = _unplane(raw, offset, "u1", heads * grid_rows * grid_cols)
    return torch.from_numpy(codes.reshape(heads, grid_rows, grid_cols) * scales.reshape(heads, grid_rows, 1))


class TopBudget:
    """Shares a page's byte budget among the layers of a long page: how many keys each row keeps.

    Layers arrive one by one; each takes ``top`` from what is left, and what a layer really
    cost (after compression) corrects the estimate for the next ones.
    """

    #: bytes of page per row (scale, first token, bound, its share of the pooled grid) and per kept key, after
    #: compression and base64, as measured on SmolLM2 at 4,096 tokens; corrected by what each layer really costs
    ROW_BYTES, KEY_BYTES = 4.5, 2.0

    def __init__(self, byte_budget: int, rows: int):
        self.left, self.rows_left = float(byte_budget), rows
        self.spent = self.estimated = 0.0
        self.correction = 1.0  # real bytes / estimated bytes so far

    def least_bytes(self, rows: int) -> float:
        """About the fewest bytes ``rows`` rows take (:data:`MIN_TOP` keys each)."""
        return rows * (self.ROW_BYTES + self.KEY_BYTES * MIN_TOP)

    def next_top(self, rows: int) -> int:
        """Keys per row for the next layer of ``rows`` rows."""
        share = self.left / max(self.rows_left, 1) / self.correction  # bytes per row this layer may use
        return int(max(MIN_TOP, min(MAX_TOP, (share - self.ROW_BYTES) // self.KEY_BYTES)))

    def spend(self, rows: int, top: int, cost: int) -> None:
        """A layer of ``rows`` rows kept ``top`` keys each and took ``cost`` bytes."""
        self.spent += cost
        self.estimated += rows * (self.ROW_BYTES + self.KEY_BYTES * top)
        self.correction = self.spent / max(self.estimated, 1.0)
        self.left -= cost
        self.rows_left -= rows
