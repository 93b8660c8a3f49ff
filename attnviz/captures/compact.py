"""Compact storage of attention patterns in capture files: 32, 16 or 8 bits per weight.

* 32 bits: float32, exact.
* 16 bits: float16 (relative error ≤ 2⁻¹¹ per weight; weights below 6e-8 flush towards 0).
* 8 bits: every row ``[head, query, :]`` is stored as ``uint8`` codes with one float32 scale
  per row, ``scale = row max / 255``; a weight is read back as ``code · scale``. Rounding to
  the nearest code puts every weight within ``row max / 510`` of its original value, and a
  row's sum within ``row length · row max / 510`` of 1. A per-row scale (rather than one
  scale for the whole tensor) keeps rows with a low peak (diffuse heads) accurate.

In a file the 8-bit codes of ``{stack}.{layer}`` are stored under that name (``uint8``,
``[head, query, key]``) and the scales under ``{stack}.{layer}.scale`` (float32,
``[head, query]``). Readers get float32 back from :func:`decode_patterns`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnviz.captures.choices import CAPTURE_BITS
from attnviz.common.errors import ParameterError

#: Bits per weight a capture file may use.
#: Suffix of the tensor holding the per-row scales of an 8-bit pattern.
SCALE_SUFFIX = ".scale"
_LEVELS = 255
#: rows quantised at once: a 8,192-key chunk of 1,024 rows is a 32 MB temporary
_CHUNK_ROWS = 1024


def check_bits(bits: int) -> int:
    if bits not in CAPTURE_BITS:
        raise ParameterError("bits", f"{{bits}} (bits per weight) must be 8, 16 or 32, got {bits}", bits)
    return bits


def error_bound(pattern: Tensor, bits: int) -> Tensor:
    """Largest error per weight that ``bits`` storage allows, broadcastable to ``[..., query, key]``."""
    if bits == 32:
        return torch.zeros(())
    if bits == 16:
        return pattern.abs() * 2.0**-11 + 6e-8
    return pattern.amax(dim=-1, keepdim=True) / (2 * _LEVELS)  # [..., query, 1]


def encode_pattern(name: str, pattern: Tensor, bits: int) -> dict[str, Tensor]:
    """The tensors that store ``pattern`` (``[head, query, key]``, float) at ``bits`` bits."""
    pattern = pattern.detach().to("cpu", torch.float32).contiguous()
    if bits == 32:
        return {name: pattern}
    if bits == 16:
        return {name: pattern.to(torch.float16)}
    codes, scale = quantize_rows_8bit(pattern)
    return {name: codes.contiguous(), name + SCALE_SUFFIX: scale.contiguous()}


def quantize_rows_8bit(pattern: Tensor) -> tuple[Tensor, Tensor]:
    """8 bits per weight, scaled per row: ``(codes uint8 [..., query, key], scale float32 [..., query])``.

    ``scale = row max / 255`` and a weight reads back as ``code · scale``, off by at most half a step
    (:func:`error_bound`). Capture files and the HTML pages store patterns this way.
    """
    scale = pattern.amax(dim=-1) / _LEVELS  # [..., query]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays all zero
    codes = torch.empty(pattern.shape, dtype=torch.uint8)  # [..., query, key]
    rows, flat_codes, flat_safe = (
        pattern.reshape(-1, pattern.shape[-1]),
        codes.view(-1, pattern.shape[-1]),
        safe.reshape(-1),
    )
    # in chunks of rows: the float32 temporaries stay small however long the input (no whole-tensor copy)
    for start in range(0, rows.shape[0], _CHUNK_ROWS):
        stop = start + _CHUNK_ROWS
        chunk = rows[start:stop] / flat_safe[start:stop, None]
        flat_codes[start:stop] = chunk.round_().clamp_(0, _LEVELS)
    return codes, scale


def decode_patterns(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Float32 patterns by name from a file's tensors (any of the three encodings, mixed or not).

    Each tensor is taken out of ``tensors`` as it is decoded, so only one encoded copy and the decoded
    ones are held at a time (8 bits: the codes are widened and scaled in place, one float32 copy).
    """
    decoded = {}
    for name in [name for name in tensors if not name.endswith(SCALE_SUFFIX)]:
        tensor = tensors.pop(name)
        if tensor.dtype == torch.uint8:
            scale = tensors.get(name + SCALE_SUFFIX)
            if scale is None:
                raise ValueError(f"8-bit pattern {name} has no {name + SCALE_SUFFIX} tensor")
            widened = tensor.to(torch.float32)  # [head, query, key]
            del tensor
            decoded[name] = widened.mul_(scale.to(torch.float32)[..., None])
        else:
            decoded[name] = tensor.to(torch.float32)
    return decoded
