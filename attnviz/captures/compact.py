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
    scale = pattern.amax(dim=-1) / _LEVELS  # [head, query]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays all zero
    codes = torch.round(pattern / safe[..., None]).clamp_(0, _LEVELS).to(torch.uint8)  # [head, query, key]
    return {name: codes.contiguous(), name + SCALE_SUFFIX: scale.contiguous()}


def decode_patterns(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Float32 patterns by name from a file's tensors (any of the three encodings, mixed or not)."""
    decoded = {}
    for name, tensor in tensors.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        if tensor.dtype == torch.uint8:
            scale = tensors.get(name + SCALE_SUFFIX)
            if scale is None:
                raise ValueError(f"8-bit pattern {name} has no {name + SCALE_SUFFIX} tensor")
            decoded[name] = tensor.to(torch.float32) * scale.to(torch.float32)[..., None]  # [head, query, key]
        else:
            decoded[name] = tensor.to(torch.float32)
    return decoded
