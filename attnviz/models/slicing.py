"""Cutting heads out of projection weights: the one implementation used by toy and Hugging Face pruning.

A head owns a contiguous block of ``head_dim`` output rows of the query/key/value projections and the
same block of input columns of the output projection, so removing heads is an ``index_select`` on
the weight along the right dimension.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attnviz.models.placement import held_weight


def _index(index: Tensor | Sequence[int], device: torch.device) -> Tensor:
    return torch.as_tensor(index, dtype=torch.long).to(device)


def slice_linear(layer: nn.Linear, index: Tensor | Sequence[int], dim: int) -> nn.Linear:
    """A new ``nn.Linear`` keeping output rows (``dim=0``) or input columns (``dim=1``) at ``index``.

    Weight ``[out, in]``; the bias follows the outputs. Dtype, device and ``requires_grad`` are kept.
    A zero-sized result (every head of a layer removed) is allowed.
    """
    full_weight, bias = held_weight(layer, "weight"), held_weight(layer, "bias")  # loaded where offloaded
    assert full_weight is not None
    keep = _index(index, full_weight.device)
    weight = full_weight.index_select(dim, keep)  # [out', in] or [out, in']
    if bias is not None and dim == 0:
        bias = bias.index_select(0, keep)
    out_features, in_features = weight.shape
    with warnings.catch_warnings():  # nn.Linear warns about zero-sized weights
        warnings.simplefilter("ignore", UserWarning)
        new = nn.Linear(in_features, out_features, bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        if bias is not None:
            new.bias.copy_(bias)
    new.weight.requires_grad_(layer.weight.requires_grad)
    return new


def slice_conv1d(layer: Any, index: Tensor | Sequence[int], dim: int) -> nn.Module:
    """A new GPT-2 ``Conv1D`` (weight ``[in, out]``) keeping ``index`` along ``dim`` (1: outputs, 0: inputs)."""
    from transformers.pytorch_utils import Conv1D

    full_weight, bias = held_weight(layer, "weight"), held_weight(layer, "bias")  # loaded where offloaded
    assert full_weight is not None and bias is not None
    keep = _index(index, full_weight.device)
    weight = full_weight.index_select(dim, keep)  # [in', out] or [in, out']
    if dim == 1:
        bias = bias.index_select(0, keep)
    new = Conv1D(weight.shape[1], weight.shape[0]).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        new.bias.copy_(bias)
    return new


def head_output_slices(layer: Any, head_dim: int) -> Tensor:
    """Each head's slice of an attention output projection: ``[h, d, hidden]`` float32, detached.

    ``head_dim``: the size of each head's output, the value head size (it may differ from the query/key size).

    ``layer``: the ``nn.Linear`` (weight ``[hidden, h·d]``) or GPT-2 ``Conv1D`` (weight ``[h·d, hidden]``) that
    maps the concatenated head outputs to the hidden size; head ``h`` owns input features ``h·d … h·d+d−1``,
    so ``concat(heads) @ W = Σ_h head_h @ slice[h]``. The bias is not part of any head.
    """
    weight = layer.weight.detach().float()
    by_input = weight.t() if isinstance(layer, nn.Linear) else weight  # [h·d, hidden]
    return by_input.reshape(-1, head_dim, by_input.shape[1]).contiguous()  # [h, d, hidden]
