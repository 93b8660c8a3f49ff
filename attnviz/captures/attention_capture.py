"""Capturing full attention patterns: run a model on texts or an encoded batch (images too) and cut the batched
patterns into one :class:`~attnviz.captures.result.AttentionCapture` per example, padding trimmed.

``capture`` (one text), ``capture_batch`` (several) and ``capture_encoded`` (a batch already encoded) record only
the layers, heads and stacks asked for, refuse a capture over ``max_bytes`` before the model runs, and record the
softmax weights or norm-based attention. :class:`AttentionCapture` and its file format live in
:mod:`attnviz.captures.result` (importable from here too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import Tensor

from attnviz.captures.recording import check_capture_size, plan_recording
from attnviz.captures.result import AttentionCapture
from attnviz.common.errors import ParameterError
from attnviz.common.images import ImageSource
from attnviz.common.selection import HeadSelection, LayerSelection
from attnviz.core import AttentionSite
from attnviz.core.choices import Weighting
from attnviz.core.recorder import PatternRecorder
from attnviz.core.weighting import check_weighting, weighted_observers
from attnviz.models.base import EncodedBatch, LoadedModel


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


def capture_batch(
    loaded: LoadedModel,
    texts: Sequence[str],
    *,
    targets: Sequence[str] | None = None,
    max_length: int | None = None,
    truncate: bool = True,
    layers: LayerSelection = None,
    heads: HeadSelection = None,
    stacks: Sequence[str] | None = None,
    max_bytes: int | None = None,
    weighting: Weighting = "weights",
) -> list[AttentionCapture]:
    """Run ``texts`` through ``loaded`` and return one capture per text (padding trimmed).

    ``layers``, ``heads``, ``stacks``, ``max_bytes`` and ``weighting``: as in :func:`capture_encoded`.
    """
    batch = loaded.encode(texts, targets=targets, max_length=max_length, truncate=truncate)
    return capture_encoded(
        loaded, batch, layers=layers, heads=heads, stacks=stacks, max_bytes=max_bytes, weighting=weighting
    )


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
        loaded.forward(batch, loaded.context(weighted_observers([recorder], weighting, projections)))
    captures = captures_from_patterns(recorder, batch, loaded.name, loaded.causal, recording.layer_counts)
    for result in captures:
        result.identity = recording.identity
        result.weighting = weighting
    return captures


def capture(
    loaded: LoadedModel,
    text: str,
    *,
    target: str | None = None,
    max_length: int | None = None,
    truncate: bool = True,
    layers: LayerSelection = None,
    heads: HeadSelection = None,
    stacks: Sequence[str] | None = None,
    max_bytes: int | None = None,
    weighting: Weighting = "weights",
    image: ImageSource | None = None,
) -> AttentionCapture:
    """Capture the attention patterns of ``loaded`` on one text (and decoder ``target``): every one by default.

    ``layers``, ``heads``, ``stacks`` and ``max_bytes``: as in :func:`capture_encoded` (record only those;
    refuse a capture larger than ``max_bytes`` before the model runs); ``weighting="norm"``: norm-based
    attention ``α_ij·‖f_h(x_j)‖`` instead of the weights. ``image``: a picture in the text, for a
    vision-language model (a path, bytes, a PIL image or an array; :mod:`attnviz.captures.vision_language`):
    the prompt names it with the processor's image token, or it goes before the prompt.
    """
    if image is not None:
        from attnviz.captures.vision_language import vision_language_batch

        if target is not None:
            raise ParameterError("target", "{target} is a decoder text: a vision-language model takes one text")
        batch = vision_language_batch(loaded, [text], [image])
        return capture_encoded(
            loaded, batch, layers=layers, heads=heads, stacks=stacks, max_bytes=max_bytes, weighting=weighting
        )[0]
    return capture_batch(
        loaded,
        [text],
        targets=None if target is None else [target],
        max_length=max_length,
        truncate=truncate,
        layers=layers,
        heads=heads,
        stacks=stacks,
        max_bytes=max_bytes,
        weighting=weighting,
    )[0]
