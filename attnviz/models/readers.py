"""Which modules read and write the residual stream, layer by layer: what circuits over edges need.

A pre-norm transformer layer reads its residual stream ``x`` twice and writes it twice::

    x = x + attention(norm1(x))     # each query, key and value head reads x through norm1 and its projection
    x = x + mlp(norm2(x))           # the MLP reads x (attention's output included) through norm2

and the logits read the last ``x`` through the final norm. :class:`ResidualReaders` names those modules
for every layer: the layer itself (its first positional input is the residual stream entering it), the
attention's input norm, the projections that turn the normed stream into queries, keys and values (with
the output columns of each head), the MLP's norm and the MLP. Attribution over edges gives every reader
its own copy of the stream; path patching and circuits change one reader's copy and no other.

:func:`check_residual_sum` proves on a probe input that the layers really are this sum (a post-norm
layer, a parallel attention + MLP layer or a norm after the attention output is not), so a model
is refused rather than analysed wrongly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from attnviz.common.errors import UnsupportedModelError
from attnviz.core import AttentionContext, AttentionSite

if TYPE_CHECKING:
    from attnviz.models.base import LoadedModel

#: which input of an attention head a reader is
HeadInput = Literal["q", "k", "v"]


@dataclass(frozen=True)
class Projection:
    """One module that turns the normed residual stream into query, key or value heads.

    ``weight`` ``[out, width]`` and ``bias`` ``[out]`` as applied (``out = normed @ weight.T + bias``; GPT-2's
    ``Conv1D`` is transposed here); ``readers``: ``(input, head)`` of each block of ``head_dim`` output
    columns, in column order (a fused ``[q | k | v]`` projection lists the query heads, then keys, then values).
    Key and value heads are the model's key/value heads (grouped-query attention shares one among several
    query heads).
    """

    module: nn.Module
    weight: Tensor  # [out, width]
    bias: Tensor | None  # [out]
    head_dim: int
    readers: tuple[tuple[HeadInput, int], ...]


@dataclass(frozen=True)
class LayerReaders:
    """The residual stream's readers and writers of one layer (see the module docstring)."""

    site: AttentionSite
    block: nn.Module  # the layer: its first positional input is the residual stream entering it
    attention_norm: nn.Module  # the norm the queries, keys and values read the stream through
    projections: tuple[Projection, ...]  # every query, key and value head, each in one projection
    mlp_norm: nn.Module | None  # the norm the MLP reads the stream through (None: attention-only layer)
    mlp: nn.Module | None  # its output is added to the stream


@dataclass(frozen=True)
class ResidualReaders:
    """Every layer's readers, in order, and the final norm the logits read the last residual stream through."""

    layers: tuple[LayerReaders, ...]
    final_norm: nn.Module


def check_residual_sum(loaded: LoadedModel, readers: ResidualReaders) -> ResidualReaders:
    """``readers`` when, on a probe input, every layer adds its attention output (the output projection of its
    heads) and its MLP output straight into the residual stream and the norms read it where named; raises
    :class:`~attnviz.common.errors.UnsupportedModelError` otherwise."""
    seen: dict[tuple[str, int], Tensor] = {}
    handles = []

    def keep_input(key: tuple[str, int]) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            value = args[0] if args else next(iter(kwargs.values()))
            seen[key] = value.detach()

        return hook

    def keep_output(key: tuple[str, int]) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            value = output[0] if isinstance(output, tuple) else output
            seen[key] = value.detach()

        return hook

    weights = loaded.head_output_weights()
    outputs: dict[int, Tensor] = {}

    class Keep:
        def edits_patterns(self, site: AttentionSite) -> bool:
            return False

        def edit_pattern(self, site: AttentionSite, pattern: Tensor, query_start: int) -> Tensor:
            return pattern

        def edit_output(self, site: AttentionSite, output: Tensor) -> Tensor:
            outputs[site.layer] = output.detach()
            return output

    for index, layer in enumerate(readers.layers):
        handles.append(layer.block.register_forward_pre_hook(keep_input(("in", index)), with_kwargs=True))
        handles.append(layer.block.register_forward_hook(keep_output(("out", index))))
        if layer.mlp_norm is not None and layer.mlp is not None:
            handles.append(layer.mlp_norm.register_forward_pre_hook(keep_input(("mid", index)), with_kwargs=True))
            handles.append(layer.mlp.register_forward_hook(keep_output(("mlp", index))))
    handles.append(readers.final_norm.register_forward_pre_hook(keep_input(("final", 0)), with_kwargs=True))
    try:
        with torch.no_grad():
            loaded.forward(_probe(loaded), AttentionContext(site_of=loaded.site_of, head_editor=Keep()))
    finally:
        for handle in handles:
            handle.remove()
    for index, layer in enumerate(readers.layers):
        stream = seen.get(("in", index))
        if stream is None or layer.site.layer not in outputs or ("out", index) not in seen:
            raise UnsupportedModelError(f"{loaded.name}: layer {layer.site.layer} did not run on a probe input")
        weight, bias = weights[layer.site]
        merged = outputs[layer.site.layer].flatten(-2)  # [b, q, h·d]
        written = merged.to(weight.dtype) @ weight.t() + (0 if bias is None else bias)  # [b, q, width]
        middle = stream + written
        if ("mid", index) in seen:
            _expect_equal(loaded, seen[("mid", index)], middle, layer.site.layer, "its MLP reads")
            middle = middle + seen[("mlp", index)]
        _expect_equal(loaded, seen[("out", index)], middle, layer.site.layer, "it passes on")
        following = seen.get(("in", index + 1), seen.get(("final", 0)))
        if following is None or not torch.equal(following, seen[("out", index)]):
            raise UnsupportedModelError(
                f"{loaded.name}: something changes the residual stream between layer {layer.site.layer} and the "
                "next reader, so attnviz cannot split it into the outputs of heads and MLPs"
            )
    return readers


def _probe(loaded: LoadedModel):
    """A short input in the model's own vocabulary (random symbols for a toy model)."""
    return loaded.timing_batch(8, texts=["The residual stream is read by every head of every layer."])


def _expect_equal(loaded: LoadedModel, found: Tensor, expected: Tensor, layer: int, what: str) -> None:
    scale = float(expected.abs().max()) or 1.0
    tolerance = 1e-4 if expected.dtype == torch.float32 else 2e-2
    if found.shape != expected.shape or float((found - expected).abs().max()) > tolerance * scale:
        raise UnsupportedModelError(
            f"{loaded.name}: layer {layer}'s residual stream is not the sum of what its attention and MLP add "
            f"(checked on a probe input: the stream {what} differs), as in post-norm or parallel-attention layers, so "
            "attnviz cannot attribute the answer to edges between heads; use a pre-norm decoder such as LLaMA, "
            "SmolLM2, Qwen2 or GPT-2"
        )
