"""How a model turns its residual stream into logits, and where each head writes into that stream.

Direct logit attribution needs both: a head's output ``z`` (``[d]``) enters the residual stream as
``W_O^h z`` (its columns of the output projection, ``[width, d]``), and the final residual ``x``
becomes logits as ``W_U · norm(x) (+ b_U)``. With the normaliser's scale taken from the clean run
and held fixed, ``norm`` is linear in ``x`` (LayerNorm also centres, which is linear), so the
logit difference splits exactly into one term per component of ``x``.

A :class:`Readout` exists only where the logits are exactly ``W_U · norm(x)`` with one final
LayerNorm or RMSNorm (pre-norm decoders: LLaMA, GPT-2, attnviz's toy models); this is checked
numerically on a probe input, never assumed from a family name. Post-norm encoders (BERT) read
their logits through further non-linear layers, so they have none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnviz.models.placement import held_weight

#: attribute names of the final normalisation on Hugging Face base models (LLaMA-style, GPT-2, OPT, …)
FINAL_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f")


@dataclass
class ResidualRecord:
    """The input of the final normalisation in the last forward pass: ``[b, q, width]``."""

    residual: Tensor | None = None


@dataclass
class Readout:
    """The final normalisation and the unembedding (see the module docstring)."""

    norm: nn.Module  # the final normalisation module (its input is the final residual stream)
    kind: Literal["layer", "rms"]  # LayerNorm (centre, scale) or RMSNorm (scale only)
    weight: Tensor | None  # [width] gain, or None
    bias: Tensor | None  # [width] bias (LayerNorm), or None
    eps: float
    unembedding: Tensor  # [vocab, width]
    unembedding_bias: Tensor | None  # [vocab] or None

    def scale(self, residual: Tensor) -> Tensor:
        """The normaliser of ``residual`` ``[..., width]``: ``[..., 1]`` (standard deviation or root mean square)."""
        residual = residual.double()
        if self.kind == "layer":
            centred = residual - residual.mean(-1, keepdim=True)
            return torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps)
        return torch.sqrt(residual.pow(2).mean(-1, keepdim=True) + self.eps)

    def frozen(self, parts: Tensor, scale: Tensor) -> Tensor:
        """The normalisation with its scale held at ``scale``, without its bias: linear in ``parts`` ``[..., width]``."""
        parts = parts.double()
        if self.kind == "layer":
            parts = parts - parts.mean(-1, keepdim=True)
        normed = parts / scale
        return normed if self.weight is None else normed * self.weight.double()

    def direction(self, answer: int, wrong: int) -> Tensor:
        """``W_U[answer] − W_U[wrong]``: ``[width]`` float64."""
        return (self.unembedding[answer] - self.unembedding[wrong]).double()

    def constant(self, answer: int, wrong: int) -> float:
        """The part of the logit difference that no residual component makes: the norm's and unembedding's biases."""
        total = 0.0
        if self.bias is not None:
            total += float(self.direction(answer, wrong) @ self.bias.double())
        if self.unembedding_bias is not None:
            total += float(self.unembedding_bias[answer].double() - self.unembedding_bias[wrong].double())
        return total

    @contextlib.contextmanager
    def recording(self) -> Iterator[ResidualRecord]:
        """Keep the final residual stream (the norm's input) of the forward passes run inside."""
        record = ResidualRecord()

        def keep(module: nn.Module, args: tuple[Any, ...]) -> None:
            record.residual = args[0].detach()

        handle = self.norm.register_forward_pre_hook(keep)
        try:
            yield record
        finally:
            handle.remove()


def readout_of(norm: Any, unembedding: Any) -> Readout | None:
    """A :class:`Readout` for a LayerNorm / RMSNorm ``norm`` and a linear ``unembedding``, or None when they are
    something else (the norm's formula is checked on a random input; a Gemma-style ``1 + weight`` gain fails it)."""
    if not isinstance(norm, nn.Module) or not isinstance(unembedding, nn.Linear):
        return None
    weight = getattr(norm, "weight", None)
    if weight is not None and not isinstance(weight, Tensor):
        return None
    width = unembedding.in_features
    eps_value = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    if isinstance(eps_value, (tuple, list)):
        eps_value = eps_value[0] if eps_value else None
    if not isinstance(eps_value, (int, float)):
        return None
    kind: Literal["layer", "rms"] = "layer" if isinstance(norm, nn.LayerNorm) else "rms"
    unembedding_weight = held_weight(unembedding, "weight")
    assert unembedding_weight is not None  # an nn.Linear has one
    readout = Readout(
        norm=norm,
        kind=kind,
        weight=held_weight(norm, "weight"),
        bias=held_weight(norm, "bias"),
        eps=float(eps_value),
        unembedding=unembedding_weight,
        unembedding_bias=held_weight(unembedding, "bias"),
    )
    parameter = readout.weight if readout.weight is not None else readout.unembedding
    dtype = parameter.dtype
    device = parameter.device
    probe = torch.randn(2, width, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
    with torch.no_grad():
        expected = norm(probe).double()
    computed = readout.frozen(probe, readout.scale(probe))
    if readout.bias is not None:
        computed = computed + readout.bias.double()
    tolerance = 1e-4 if dtype == torch.float32 else 1e-2
    if expected.shape != computed.shape or not torch.allclose(expected, computed, atol=tolerance, rtol=tolerance):
        return None
    return readout
