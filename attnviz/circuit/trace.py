"""One forward pass with every sender recorded and every receiver reading its own copy of the residual stream.

Hooks (removed when the pass ends) on the modules :class:`~attnviz.models.readers.ResidualReaders` names:

* the first layer's input is the embeddings' output (sender ``embed``); it may be replaced (EAP-IG's
  interpolated inputs) and becomes a gradient leaf when gradients are asked for;
* each head's output ``z`` ``[b, q, h, d]`` comes from the attention core (a head editor, as in ``patch``) and
  enters the stream as ``W_O^h z_h`` (:meth:`LoadedModel.head_output_weights`); each MLP's output is its module's;
* with ``split``, every query, key and value head reads its own copy of the stream entering its layer: the
  projection's output is recomputed from ``attention_norm(copy)`` with that head's rows of the weight. The MLP
  and the logits read their own copies at their norms' inputs. A receiver's copy is what its gradient is taken
  at (edge attribution) and what an :class:`EdgePatch` changes (path patching, circuits).

Sender activations are kept as ``acts`` ``[S, b, q, width]`` (what each sender adds to the stream).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnviz.circuit.graph import Graph
from attnviz.core import AttentionContext, AttentionSite
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.readers import Projection, ResidualReaders


@dataclass
class EdgePatch:
    """Receiver ``r`` of row ``b`` reads ``stream − Σ_s drop[b, s, r] · (acts[s] − target[s])``: the dropped
    edges carry the target run's sender activations instead of this run's."""

    drop: Tensor  # [b, S, R], 1.0 where the edge is dropped
    target: Tensor  # [S, b, q, width] sender activations of the reference run


class Trace:
    """One hooked forward pass (see the module docstring); :meth:`gradients` then back-propagates a metric."""

    def __init__(
        self,
        loaded: LoadedModel,
        readers: ResidualReaders,
        graph: Graph,
        output_weights: dict[AttentionSite, Tensor],
        *,
        gradients: bool = False,
        split: bool = False,
        embed: Tensor | None = None,
        patch: EdgePatch | None = None,
    ):
        self.loaded, self.readers, self.graph = loaded, readers, graph
        self.output_weights = output_weights  # site -> [width, h, d]
        self.gradient_mode, self.split, self.embed, self.patch = gradients, split or patch is not None, embed, patch
        self.acts: Tensor | None = None  # [S, b, q, width]
        self.delta: Tensor | None = None  # with a patch: [b, S, q·width], acts − target, batch first for bmm
        self.head_outputs: dict[int, Tensor] = {}  # layer index -> z [b, q, h, d] (in the graph)
        self.mlp_outputs: dict[int, Tensor] = {}  # layer index -> [b, q, width] (in the graph)
        self.embedding: Tensor | None = None  # [b, q, width] leaf
        self.copies: list[tuple[range | int, Tensor]] = []  # (receiver indices, copy [n, b, q, w] or [b, q, w])
        self._streams: dict[int, Tensor] = {}
        self._normed: dict[int, Tensor] = {}
        self._layer_of = {layer.site: index for index, layer in enumerate(readers.layers)}

    # -- the pass --------------------------------------------------------------------------------------

    def run(self, batch: EncodedBatch) -> Tensor:
        """The logits ``[b, q, vocab]`` of ``batch`` with the hooks in place."""
        context = AttentionContext(site_of=self.loaded.site_of, head_editor=self)
        with self._hooks(), torch.set_grad_enabled(self.gradient_mode):
            return self.loaded.forward(batch, context, logits=True).logits

    def gradients(self, metric: Tensor) -> dict[str, Any]:
        """Back-propagate ``metric`` (a scalar) to the senders and the receivers' copies (no weight gets a gradient).

        Returns ``embed`` ``[b, q, w]``, ``heads`` {layer index: ``[b, q, h, d]``}, ``mlps`` {layer index:
        ``[b, q, w]``} and, with ``split``, ``receivers`` ``[R, b, q, w]``."""
        assert self.embedding is not None
        inputs = [self.embedding, *self.head_outputs.values(), *self.mlp_outputs.values()]
        inputs += [copy for _, copy in self.copies]
        raw = torch.autograd.grad(metric, inputs, allow_unused=True)
        found = [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, raw, strict=True)]
        heads = len(self.head_outputs)
        result: dict[str, Any] = {
            "embed": found[0],
            "heads": dict(zip(self.head_outputs, found[1 : 1 + heads], strict=True)),
            "mlps": dict(zip(self.mlp_outputs, found[1 + heads : 1 + heads + len(self.mlp_outputs)], strict=True)),
        }
        if self.split:
            embedding = found[0]
            receivers = embedding.new_zeros(len(self.graph.receivers), *embedding.shape)
            for (where, _), grad in zip(self.copies, found[1 + heads + len(self.mlp_outputs) :], strict=True):
                if isinstance(where, range):
                    receivers[where.start : where.stop] = grad
                else:
                    receivers[where] = grad
            result["receivers"] = receivers
        return result

    # -- the head editor of the attention core -------------------------------------------------------

    def edits_patterns(self, site: AttentionSite) -> bool:
        return False

    def edit_pattern(self, site: AttentionSite, pattern: Tensor, query_start: int) -> Tensor:
        return pattern

    def edit_output(self, site: AttentionSite, output: Tensor) -> Tensor:
        index = self._layer_of.get(site)
        if index is None:
            return output
        self.head_outputs[index] = output
        weight = self.output_weights[site]  # [w, h, d]
        written = torch.einsum("bqhd,whd->hbqw", output.detach().to(weight.dtype), weight)
        span = self.graph.head_senders[index]
        self._record(span.start, span.stop, written)
        return output

    def _record(self, start: int, stop: int, values: Tensor) -> None:
        """Senders ``start … stop−1`` wrote ``values`` ``[n, b, q, w]``."""
        assert self.acts is not None
        self.acts[start:stop] = values.to(self.acts.dtype)
        if self.patch is not None and self.delta is not None:
            change = self.acts[start:stop] - self.patch.target[start:stop]  # [n, b, q, w]
            self.delta[:, start:stop] = change.flatten(2).transpose(0, 1)

    # -- the hooks --------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _hooks(self) -> Iterator[None]:
        handles = []
        for index, layer in enumerate(self.readers.layers):
            handles.append(layer.block.register_forward_pre_hook(self._enter(index), with_kwargs=True))
            if self.split:
                for projection in layer.projections:
                    handles.append(projection.module.register_forward_hook(self._project(index, projection)))
            if layer.mlp is not None and layer.mlp_norm is not None:
                if self.split:
                    receiver = self.graph.mlp_receivers[index]
                    handles.append(layer.mlp_norm.register_forward_pre_hook(self._read(receiver), with_kwargs=True))
                handles.append(layer.mlp.register_forward_hook(self._write_mlp(index)))
        if self.split:
            final = self.graph.logits_receiver
            handles.append(self.readers.final_norm.register_forward_pre_hook(self._read(final), with_kwargs=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _enter(self, index: int):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            stream = args[0] if args else kwargs["hidden_states"]
            if index == 0:
                if self.embed is not None:
                    stream = self.embed.to(stream.dtype)
                if self.gradient_mode:
                    stream = stream.detach().requires_grad_()
                self.embedding = stream
                self.acts = stream.new_zeros(len(self.graph.senders), *stream.shape)
                if self.patch is not None:
                    batch, length, width = stream.shape
                    self.delta = stream.new_zeros(batch, len(self.graph.senders), length * width)
                self._record(0, 1, stream.detach()[None])
            self._streams[index] = stream
            self._normed.pop(index, None)
            if index == 0:
                return ((stream, *args[1:]), kwargs) if args else ((), {**kwargs, "hidden_states": stream})
            return None

        return hook

    def _extra(self, receivers: range | int, stage: int) -> Tensor | None:
        """``[n, b, q, w]`` (or ``[b, q, w]`` for one receiver): what an edge patch adds to these receivers' copies."""
        if self.patch is None or self.delta is None:
            return None
        upstream = self.graph.upstream(stage)
        columns = receivers if isinstance(receivers, range) else [receivers]
        drop = (
            self.patch.drop[:, :upstream, columns.start : columns.stop]
            if isinstance(columns, range)
            else (self.patch.drop[:, :upstream, columns])
        )  # [b, s, n]
        _, batch, length, width = self.patch.target.shape  # [S, b, q, w]
        moved = torch.bmm(drop.transpose(1, 2).to(self.delta.dtype), self.delta[:, :upstream])  # [b, n, q·w]
        extra = -moved.view(batch, -1, length, width).transpose(0, 1)  # [n, b, q, w]
        return extra if isinstance(receivers, range) else extra[0]

    def _project(self, index: int, projection: Projection):
        layer = self.readers.layers[index]
        receivers = self.graph.attention_receivers[index]
        first = 0
        for other in layer.projections:
            if other is projection:
                break
            first += len(other.readers)
        count = len(projection.readers)

        def hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
            if index not in self._normed:
                stream = self._streams[index]  # [b, q, w]
                copies = stream.unsqueeze(0).repeat(len(receivers), 1, 1, 1)  # [n, b, q, w]
                extra = self._extra(receivers, 2 * index)
                if extra is not None:
                    copies = copies + extra.to(copies.dtype)
                if self.gradient_mode:
                    self.copies.append((receivers, copies))
                self._normed[index] = layer.attention_norm(copies)
            normed = self._normed[index][first : first + count]  # [n', b, q, w]
            weight = projection.weight.view(count, projection.head_dim, -1)  # [n', d, w]
            heads = torch.einsum("nbqw,ndw->bqnd", normed.to(weight.dtype), weight)
            merged = heads.reshape(*heads.shape[:2], count * projection.head_dim)
            if projection.bias is not None:
                merged = merged + projection.bias
            return merged.to(output.dtype)

        return hook

    def _read(self, receiver: int | None):
        assert receiver is not None
        stage = int(self.graph.receiver_reads[receiver])

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            stream = args[0] if args else next(iter(kwargs.values()))
            extra = self._extra(receiver, stage)
            copy = stream if extra is None else stream + extra.to(stream.dtype)
            if self.gradient_mode:
                copy = copy.clone()
                self.copies.append((receiver, copy))
            if args:
                return (copy, *args[1:]), kwargs
            name = next(iter(kwargs))
            return (), {**kwargs, name: copy}

        return hook

    def _write_mlp(self, index: int):
        sender = self.graph.mlp_senders[index]

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            value = output[0] if isinstance(output, tuple) else output
            self.mlp_outputs[index] = value
            assert sender is not None
            self._record(sender, sender + 1, value.detach()[None])

        return hook
