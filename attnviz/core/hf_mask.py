"""The masks transformers builds for attnviz's attention, said in words where it can: no ``[q, k]`` tensor.

transformers asks the mask function registered beside the attention function (:func:`core_mask`) for each forward
pass's masks. Where the mask is the plain causal triangle it gets none (the core applies causality itself); where it
is causal with a sliding window or with padding, or bidirectional with padding or a two-sided window (an encoder's,
or a decoder's over the encoder's keys), it gets a :class:`LayoutMask` (of a
:class:`~attnviz.core.key_range.KeyLayout`), a tensor that holds that description and builds its values only if
something other than the core reads them. Anything else gets transformers' own ``eager_mask``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, cast

import torch
from torch import Tensor
from torch.utils._pytree import tree_map

from attnviz.core.key_range import KeyLayout

#: rows of a mask function evaluated at once when checking that it is a sliding window (bounds the temporaries)
_CHECK_ROWS = 256


class LayoutMask(Tensor):
    """transformers' additive eager mask ``[b, 1, q, k]`` of a :class:`KeyLayout`, held as the layout.

    attnviz's attention reads :attr:`key_layout` and never the values. Any other use (a model slicing its mask, a hook
    comparing it) is handed the values, built then with :meth:`dense` as ``eager_mask`` builds them (and kept), so
    it sees what it would have seen; from then on attnviz's attention reads the values too (they may have been
    written into). Moving it to another device keeps it a layout (accelerate moves arguments to each layer's
    device).
    """

    key_layout: KeyLayout
    _dense: Tensor | None

    @staticmethod
    def __new__(cls, layout: KeyLayout, shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device):
        batch, queries, keys = shape
        mask = Tensor._make_wrapper_subclass(cls, (batch, 1, queries, keys), dtype=dtype, device=device)
        mask.key_layout = layout
        mask._dense = None
        return mask

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @property
    def described(self) -> bool:
        """Whether :attr:`key_layout` still says what the mask is: its values were never handed out (once they are,
        code holding them, or a view of them, may write into them, and they become the mask)."""
        return self._dense is None

    @property
    def dims(self) -> tuple[int, int, int]:
        """``(b, q, k)``."""
        return self.shape[0], self.shape[2], self.shape[3]

    def dense(self) -> Tensor:
        """The mask's values ``[b, 1, q, k]`` (built on first use, then kept)."""
        if self._dense is None:
            batch, _, queries, keys = self.shape
            rows = self.key_layout.additive_rows(0, queries, keys, self.dtype, self.device)  # [b|1, 1, q, k]
            self._dense = rows.expand(batch, 1, queries, keys).contiguous()
        return self._dense

    def __repr__(self) -> str:  # type: ignore[override]
        return f"LayoutMask({tuple(self.shape)}, {self.key_layout})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        source = args[0] if args else None
        described = isinstance(source, LayoutMask) and source.described
        moved = described and func is torch.ops.aten._to_copy.default
        if moved and kwargs.get("dtype", source.dtype) == source.dtype:  # a move: still a layout
            device = torch.device(kwargs.get("device") or source.device)
            return LayoutMask(source.key_layout.to(device), source.dims, source.dtype, device)
        if described and func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            return LayoutMask(source.key_layout, source.dims, source.dtype, source.device)
        return func(*tree_map(_values, args), **tree_map(_values, kwargs))


def _values(item: Any) -> Any:
    """``item``, or its values where it is a :class:`LayoutMask`."""
    return item.dense() if isinstance(item, LayoutMask) else item


def core_mask(*args: Any, allow_is_causal_skip: bool = False, **kwargs: Any) -> Tensor | None:
    """The mask transformers builds for attnviz's attention: ``None`` where it would be the plain causal triangle
    (as many keys as queries, no padding, no window: the core then applies causality itself without a ``[q, k]``
    tensor, 268 MB at 8,192 tokens), a :class:`LayoutMask` where it is causal with a sliding window or padding, or
    bidirectional with padding or a two-sided window (an encoder's), else transformers' additive ``eager_mask``,
    called as transformers called this function (its arguments changed across transformers 5 releases).

    ``allow_is_causal_skip`` is transformers' word that the mask is its standard causal or sliding-window one with
    padding at most (no packed sequences, no bidirectional blocks, no custom overlays); only then is it described.
    """
    from transformers import masking_utils

    if allow_is_causal_skip and not args:
        if _supports_sdpa(kwargs.get("config")) and _plain_triangle(kwargs):
            return None
        described = _layout_mask(kwargs)
        if described is not None:
            return described
    described = None if args else _padding_mask(kwargs)  # transformers' bidirectional mask (padding at most)
    if described is not None:
        return described
    return masking_utils.eager_mask(*args, **kwargs)


def _square(arguments: dict[str, Any]) -> int | None:
    """The length of a mask of as many keys as queries, all from position 0 (no cache before them), else None."""
    queries, offset = arguments.get("q_length"), arguments.get("q_offset", 0)
    positions = arguments.get("cache_position")  # earlier transformers 5 releases say it by positions
    if queries is None and isinstance(positions, Tensor) and positions.numel():
        queries, offset = positions.numel(), int(positions[0])
    keys = arguments.get("kv_length")
    if not isinstance(queries, int) or queries != keys or queries <= 1 or offset != 0 or arguments.get("kv_offset", 0):
        return None
    return queries


def _plain_triangle(arguments: dict[str, Any]) -> bool:
    """Whether the mask transformers asks for is exactly the causal triangle over all of its keys: as many keys as
    queries from position 0, every key a real token (no padding), no window shorter than the input."""
    keys = _square(arguments)
    if keys is None:
        return False
    padding = arguments.get("attention_mask")  # [b, k] booleans (True: a token), or None
    if padding is not None and (padding.shape[-1] != keys or not bool(padding.all())):
        return False
    window = arguments.get("local_size")
    return window is None or keys < window


def _layout_mask(arguments: dict[str, Any]) -> LayoutMask | None:
    """The :class:`LayoutMask` of a causal mask with a sliding window or padding, or None where the mask is not one
    (a chunked or custom mask function, padding in more than one run, a cache before the queries)."""
    from transformers import masking_utils

    length = _square(arguments)
    if length is None or arguments.get("use_vmap"):
        return None
    device = torch.device(arguments.get("device") or "cpu")
    batch = int(arguments.get("batch_size") or 1)
    mask_function = arguments.get("mask_function", masking_utils.causal_mask_function)
    window = arguments.get("local_size")
    if mask_function is masking_utils.causal_mask_function:
        window = None
    elif (
        not isinstance(window, int)
        or window < 1
        or not _evaluates_as(mask_function, _causal_window(window), batch, length, device)
    ):
        return None
    key_start = key_stop = None
    padding = arguments.get("attention_mask")  # [b, k] booleans (True: a token), or None
    if padding is not None:
        spans = _token_spans(padding, length)
        if spans is None:
            return None
        key_start, key_stop = spans
        batch = padding.shape[0]
    layout = KeyLayout(window if window is not None and window < length else None, key_start, key_stop)
    return LayoutMask(layout, (batch, length, length), arguments.get("dtype", torch.float32), device)


def _padding_mask(arguments: dict[str, Any]) -> LayoutMask | None:
    """The :class:`LayoutMask` of transformers' bidirectional mask (an encoder's, or a decoder's over the encoder's
    keys): each sequence's tokens, one run each, for every query; None where the mask is something else."""
    from transformers import masking_utils

    queries, keys = arguments.get("q_length"), arguments.get("kv_length")
    mask_function, reach = arguments.get("mask_function"), arguments.get("local_size")
    if (
        arguments.get("use_vmap")
        or not isinstance(queries, int)
        or not isinstance(keys, int)
        or arguments.get("q_offset", 0)
        or arguments.get("kv_offset", 0)
    ):
        return None
    device = torch.device(arguments.get("device") or "cpu")
    batch = int(arguments.get("batch_size") or 1)
    window = None  # keys less than `window` positions from the query, on either side
    if mask_function is not masking_utils.bidirectional_mask_function:  # an overlay wraps it, or a window
        if not isinstance(reach, int) or reach < 0 or queries != keys:
            return None
        if not _evaluates_as(mask_function, _two_sided_window(reach), batch, keys, device):
            return None
        window = reach + 1 if reach + 1 < keys else None
    padding = arguments.get("attention_mask")  # [b, k] booleans (True: a token), or None
    spans = None
    if padding is not None and not bool(padding.all()):
        spans = _token_spans(padding, keys)
        if spans is None:
            return None
        batch = padding.shape[0]
    if spans is None and window is None:  # eager's own answer: None, or a mask of zeros if it may not skip
        return None
    key_start, key_stop = spans if spans is not None else (None, None)
    layout = KeyLayout(window, key_start, key_stop, causal=False)
    return LayoutMask(layout, (batch, queries, keys), arguments.get("dtype", torch.float32), device)


def _token_spans(padding: Tensor, length: int) -> tuple[Tensor, Tensor] | None:
    """Each sequence's real tokens as one run ``[start, stop)`` (int64 ``[b]`` each) of the boolean padding mask
    ``[b, k]``, or None where a sequence's tokens are not one run (or the mask is not boolean over the keys)."""
    if padding.dtype != torch.bool or padding.dim() != 2 or padding.shape[-1] != length:
        return None
    count = padding.sum(-1)  # [b]
    start = torch.where(count > 0, padding.to(torch.uint8).argmax(-1), 0)  # [b] first token (0: none)
    stop = start + count
    keys = torch.arange(length, device=padding.device)
    if not torch.equal((keys >= start[:, None]) & (keys < stop[:, None]), padding):
        return None
    return start.to(torch.int64), stop.to(torch.int64)


def _causal_window(window: int) -> Callable[[Tensor, Tensor], Tensor]:
    """transformers' causal sliding window of ``window`` keys, over query and key positions."""
    return lambda queries, keys: (keys <= queries) & (keys > queries - window)


def _two_sided_window(reach: int) -> Callable[[Tensor, Tensor], Tensor]:
    """transformers' bidirectional window: keys at most ``reach`` positions from the query."""
    return lambda queries, keys: (keys - queries).abs() <= reach


def _evaluates_as(
    mask_function: Any, expected: Callable[[Tensor, Tensor], Tensor], batch: int, length: int, device: torch.device
) -> bool:
    """Whether transformers' index-based ``mask_function`` is exactly ``expected`` for each of ``batch`` sequences on
    a ``length``-token square: evaluated row block by row block, as ``sdpa_mask`` evaluates it."""
    batch_index = torch.arange(batch, device=device)[:, None, None, None]  # [b, 1, 1, 1]
    head_index = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    keys = torch.arange(length, device=device)[None, None, None, :]  # [1, 1, 1, k]
    for first in range(0, length, _CHECK_ROWS):
        queries = torch.arange(first, min(first + _CHECK_ROWS, length), device=device)[None, None, :, None]
        try:
            given = mask_function(batch_index, head_index, queries, keys)  # [b|1, 1, r, k]
        except (IndexError, RuntimeError, TypeError, ValueError):  # it reads more than indices: no plain window
            return False
        wanted = expected(queries, keys)  # [1, 1, r, k]
        if not isinstance(given, Tensor):
            return False
        try:  # every sequence's rows (a function may read the batch index)
            shape = torch.broadcast_shapes(given.shape, (batch, *wanted.shape[1:]))
        except RuntimeError:
            return False
        if not torch.equal(given.expand(shape), wanted.expand(shape)):
            return False
    return True


@functools.cache
def _family_supports_sdpa(config_class: Hashable) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    try:
        found: Any = MODEL_MAPPING[cast(Any, config_class)]
    except (KeyError, ValueError, ImportError, AttributeError):  # a config transformers' auto classes do not map
        return False
    model_class = found[0] if isinstance(found, (tuple, list)) else found
    return bool(getattr(model_class, "_supports_sdpa", False))


def _supports_sdpa(config: object) -> bool:
    """Whether the family of ``config`` runs on sdpa in transformers, and so keeps its attention modules' ``is_causal``
    true to their masks (a family without sdpa, such as NLLB-MoE, may mark a causal decoder ``is_causal=False`` and
    rely on the mask alone: its mask is never left out)."""
    return config is not None and _family_supports_sdpa(cast(Hashable, type(config)))
