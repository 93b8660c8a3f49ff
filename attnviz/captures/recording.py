"""What a capture records: the chosen stacks, layers and heads of a model, and what that will cost.

A capture records ``[head, query, key]`` float32 per layer: ``layers × heads × n²`` values, which
at long inputs is more memory than a machine has (SmolLM2, 30 layers × 9 heads at 4,096 tokens:
18 GB). Recording only the layers and heads that will be shown makes it ``n²`` per head; and a
capture that would still exceed a limit is refused before the model runs, with the size it needs.

Layer and head numbers are always the model's own: the capture of layer 3 head 2 says so in its
:class:`~attnviz.models.identity.HeadIdentity`, and its other layers hold no heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import Tensor

from attnviz.captures.result import AttentionCapture
from attnviz.common.errors import ParameterError
from attnviz.common.resources import format_bytes
from attnviz.common.selection import HeadSelection, LayerSelection, MeanOfHeads, resolve_heads, resolve_layers
from attnviz.common.wording import plural
from attnviz.core.attention import AttentionSite
from attnviz.core.choices import Weighting
from attnviz.core.recorder import PatternRecorder
from attnviz.core.weighting import check_weighting, weighted_observers
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.identity import HeadIdentity, model_identity

#: bytes per recorded weight (float32)
_FLOAT_BYTES = 4


@dataclass
class Recording:
    """The sites to record with the head positions to keep at each (None: every head), and their labels."""

    sites: dict[AttentionSite, list[int] | None]
    identity: HeadIdentity | None
    #: stack -> number of layers of the model
    layer_counts: dict[str, int] = field(default_factory=dict)

    def bytes_for(self, batch: EncodedBatch, layout: dict[AttentionSite, int]) -> int:
        """Float32 bytes the padded ``[b, h_kept, q, k]`` patterns of ``batch`` take."""
        total = 0
        for site, heads in self.sites.items():
            queries, keys = (max(lengths) for lengths in batch.query_key_lengths(site.stack))
            kept = layout[site] if heads is None else len(heads)
            total += len(batch) * kept * queries * keys * _FLOAT_BYTES
        return total

    def lengths(self, batch: EncodedBatch) -> dict[str, tuple[int, int, int]]:
        """stack -> (batch, padded query length, padded key length), for the recorder's tensors."""
        shapes = {}
        for stack in {site.stack for site in self.sites}:
            queries, keys = (max(lengths) for lengths in batch.query_key_lengths(stack))
            shapes[stack] = (len(batch), queries, keys)
        return shapes


def plan_recording(
    loaded: LoadedModel,
    *,
    layers: LayerSelection = None,
    heads: HeadSelection = None,
    stacks: Sequence[str] | None = None,
) -> Recording:
    """The sites, heads and identity of a capture of ``layers`` and ``heads`` (model numbers) of ``stacks``.

    ``layers``: layer indices (negative from the end) of every chosen stack, None for all; ``heads``: head
    numbers as the model numbers them (a pruned model's original numbers), None or the mean for all;
    ``stacks``: for an encoder-decoder model, any of ``encoder``, ``decoder``, ``cross`` (None: all).
    """
    layout = loaded.layout()  # site -> heads, found by a tiny probe pass
    base = model_identity(loaded)
    available = loaded.stacks()
    if stacks is not None:
        if len(stacks) == 0:
            raise ParameterError("stacks", "no stack given in {stacks}: name one of " + ", ".join(available))
        for stack in stacks:
            if stack not in available:
                raise ParameterError(
                    "stacks", f"{loaded.name} has no {stack} attention: it has {', '.join(available)}", stack
                )
    chosen_stacks = [stack for stack in available if stacks is None or stack in stacks]
    every_head = heads is None or isinstance(heads, MeanOfHeads)
    sites: dict[AttentionSite, list[int] | None] = {}
    identity = HeadIdentity(
        heads=dict(base.heads) if base else {}, masked=dict(base.masked) if base else {}
    )  # copies of the tables it changes
    # layers as the model numbers them: a hybrid stack's layers without attention hold no heads
    layer_counts = {stack: loaded.num_layers(stack) for stack in available}
    for stack in chosen_stacks:
        count = layer_counts[stack]
        present = loaded.present_layers(stack)
        chosen_layers = resolve_layers(layers, count, present)
        if layers is not None or present is not None:
            identity.recorded_layers[stack] = sorted(set(chosen_layers))
        ids_per_layer: list[list[int]] = []
        counts_per_layer: list[int] = []
        for layer in range(count):
            site = AttentionSite(stack, layer)
            heads_here = layout.get(site, 0)
            ids = base.ids(stack, layer, heads_here) if base else list(range(heads_here))
            numbered = max(ids, default=-1) + 1 if base else heads_here
            counts_per_layer.append(numbered)
            if layer not in chosen_layers:
                ids_per_layer.append([])
                continue
            positions = None if every_head else resolve_heads(heads, ids, count=numbered)
            assert not isinstance(positions, MeanOfHeads)
            sites[site] = None if positions is None else sorted(set(positions))
            kept = list(range(len(ids))) if positions is None else sorted(set(positions))
            ids_per_layer.append([ids[p] for p in kept])
        if not every_head or layers is not None or present is not None:
            identity.heads[stack] = ids_per_layer
            identity.model_heads[stack] = counts_per_layer
            identity.model_layout[stack] = [layout.get(AttentionSite(stack, layer), 0) for layer in range(count)]
    if stacks is not None:
        for stack in available:
            if stack not in chosen_stacks:
                identity.recorded_layers[stack] = []
    subset = identity.is_subset()
    return Recording(sites=sites, identity=identity if subset else base, layer_counts=layer_counts)


def check_capture_size(
    recording: Recording, batch: EncodedBatch, layout: dict[AttentionSite, int], max_bytes: int | None
) -> None:
    """Refuse a capture whose patterns would take more than ``max_bytes`` (None: no limit), naming the size it needs."""
    if max_bytes is None:
        return
    check_max_bytes(max_bytes)
    needed = recording.bytes_for(batch, layout)
    if needed <= max_bytes:
        return
    heads = sum(layout[site] if kept is None else len(kept) for site, kept in recording.sites.items())
    tokens = max(len(tokens) for tokens in batch.tokens)
    raise ParameterError(
        "max_bytes",
        f"this capture would hold {format_bytes(needed)} of attention weights ({plural(heads, 'head')} at "
        f"{plural(tokens, 'token')}, float32), more than {{max_bytes}} {format_bytes(max_bytes)}: record fewer "
        "layers or heads ({layers}, {heads}), give a shorter input ({max_length}), or raise {max_bytes}",
        max_bytes,
    )


def check_max_bytes(max_bytes: int) -> int:
    """``max_bytes`` when it is a positive whole number of bytes; refused otherwise."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ParameterError("max_bytes", f"{{max_bytes}} must be a positive number of bytes, got {max_bytes!r}")
    return max_bytes


def captures_from_patterns(
    patterns: dict[AttentionSite, Tensor] | PatternRecorder,
    batch: EncodedBatch,
    model_name: str,
    causal: bool,
    layer_counts: dict[str, int] | None = None,
) -> list[AttentionCapture]:
    """Split batched ``[b, h, q, k]`` patterns into one trimmed :class:`AttentionCapture` per example.

    Given the recorder itself, each site's tensor is let go of as soon as it is split, so the peak is
    one copy of the patterns (one example: its tensors are kept as they are, without a copy).
    ``layer_counts``: stack -> the model's layer count, for a capture of some layers (the others hold
    ``[0, query, key]``, no heads).
    """
    recorder = patterns if isinstance(patterns, PatternRecorder) else None
    sites = recorder.sites() if recorder is not None else sorted(cast("dict", patterns))
    stacks = sorted({site.stack for site in sites}, key=_STACK_ORDER.index)
    per_example: list[dict[str, list[Tensor]]] = [{} for _ in range(len(batch))]
    for stack in stacks:
        query_lengths, key_lengths = batch.query_key_lengths(stack)
        count = (layer_counts or {}).get(stack, 1 + max(site.layer for site in sites if site.stack == stack))
        for i in range(len(batch)):
            per_example[i][stack] = [torch.empty(0, query_lengths[i], key_lengths[i]) for _ in range(count)]
        for site in (site for site in sites if site.stack == stack):
            tensor = recorder.pop(site) if recorder is not None else cast("dict", patterns)[site]  # [b, h, q, k]
            batch.check_keys_are_tokens(model_name, site, tensor.shape[3])
            for i in range(len(batch)):
                q, k = query_lengths[i], key_lengths[i]
                whole = len(batch) == 1 and tensor.shape[2] == q and tensor.shape[3] == k
                per_example[i][stack][site.layer] = tensor[i] if whole else tensor[i, :, :q, :k].clone()
            del tensor  # the batch's tensor goes as soon as its examples are cut out
    captures = []
    for i in range(len(batch)):
        captures.append(
            AttentionCapture(
                model=model_name,
                tokens=batch.tokens[i],
                causal=causal,
                patterns=per_example[i],
                special=batch.special[i],
                word_ids=batch.word_ids[i],
                target_tokens=batch.target_tokens[i] if batch.target_tokens else None,
                target_special=batch.target_special[i] if batch.target_special else None,
                target_word_ids=batch.target_word_ids[i] if batch.target_word_ids else None,
                image_grid=batch.image_grid,
                extras={} if batch.images is None else {"image": batch.images[i].detach().to("cpu", torch.float32)},
            )
        )
    return captures


_STACK_ORDER = ["self", "encoder", "decoder", "cross"]


def capture_encoded(
    loaded: LoadedModel,
    batch: EncodedBatch,
    *,
    layers: LayerSelection = None,
    heads: HeadSelection = None,
    stacks: Sequence[str] | None = None,
    max_bytes: int | None = None,
    weighting: Weighting = "weights",
) -> list[AttentionCapture]:
    """Run an encoded ``batch`` (texts or images) through ``loaded``: one capture per example (padding trimmed).

    Only what is chosen is recorded: ``layers`` (indices, negative from the end; None: all), ``heads``
    (the model's head numbers; None: all) and, for encoder-decoder models, ``stacks`` (``encoder``,
    ``decoder``, ``cross``; None: all). The capture keeps the model's numbers (its identity says which
    layers and heads it holds; the other layers hold no heads). ``max_bytes``: refuse, before the model
    runs, a capture whose float32 patterns would take more (:class:`~attnviz.common.errors.ParameterError`
    naming the size it needs); None: no limit. ``weighting``: ``"weights"`` records the softmax weights,
    ``"norm"`` each weight times the norm of the transformed value vector it moves, ``α_ij·‖f_h(x_j)‖``
    (:mod:`attnviz.core.weighting`), computed in the same pass.
    """
    check_weighting(weighting)
    recording = plan_recording(loaded, layers=layers, heads=heads, stacks=stacks)
    check_capture_size(recording, batch, loaded.layout(), max_bytes)
    projections = loaded.head_output_projections() if weighting == "norm" else None
    recorder = PatternRecorder(recording.sites, recording.lengths(batch))
    with torch.no_grad():
        loaded.forward(
            batch, loaded.context(weighted_observers([recorder], weighting, projections, cache=loaded.factor_cache))
        )
    captures = captures_from_patterns(recorder, batch, loaded.name, loaded.causal, recording.layer_counts)
    for result in captures:
        result.identity = recording.identity
        result.weighting = weighting
    return captures
