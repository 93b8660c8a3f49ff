"""Capturing full attention patterns, and the capture object that holds them.

:class:`AttentionCapture` is one example's patterns. Axes of each pattern
tensor: ``[head, query, key]``; ``capture.stacked(stack)`` gives
``[layer, head, query, key]``. Padding is trimmed away, so row ``i`` / column
``j`` are token ``i`` / ``j`` of the example.

File format (``save``/``load``): a safetensors file with one tensor per
layer (float32, or compact: see :mod:`attnviz.captures.compact`) named ``{stack}.{layer}`` of shape ``[head, query, key]`` (``self.*``
for encoder-only and decoder-only models; ``encoder.*``, ``decoder.*`` and
``cross.*`` for encoder-decoder models) and string metadata: ``format``
(``attnviz-capture``), ``version``, ``model``, ``tokens`` and
``target_tokens`` (JSON lists of token strings), ``special`` /
``target_special`` (JSON lists of booleans), ``word_ids`` /
``target_word_ids`` (JSON lists of int or null), and ``causal`` (``true`` /
``false``); version 2 adds ``bits`` (32, 16 or 8) and, for captures of
generated text, ``generated_from`` (index of the first generated token); a vision model's capture adds
``image_grid`` (JSON: ``rows``, ``cols``, ``extra_kinds``, ``patch_size``) and the tensor
``image`` (float32 ``[H, W, 3]`` in 0–1, the resized picture).
Version-1 files (always float32) still load. No pickle is involved.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnviz.captures.compact import check_bits, decode_patterns, encode_pattern
from attnviz.common.display import NotebookDisplay
from attnviz.common.errors import CaptureFileError, InputError
from attnviz.common.images import ImageGrid
from attnviz.common.tokens import display_token, word_groups, word_label
from attnviz.core import AttentionSite
from attnviz.core.recorder import PatternRecorder
from attnviz.core.stacks import is_causal_stack, stack_of
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.identity import HeadIdentity, model_identity
from attnviz.outputs.files import atomic_path, check_output_path

FORMAT_NAME = "attnviz-capture"
FORMAT_VERSION = "2"
#: versions :meth:`AttentionCapture.load` reads
READABLE_VERSIONS = ("1", "2")


@dataclass(repr=False)
class AttentionCapture(NotebookDisplay):
    """Attention patterns of one example, per stack and layer: ``patterns[stack][layer]`` is ``[head, query, key]``."""

    model: str
    tokens: list[str]  # source / self-attention tokens (rows and columns of self, encoder)
    causal: bool  # decoder-only causal model: cells above the diagonal are masked
    patterns: dict[str, list[Tensor]]  # stack -> per-layer float32 [head, query, key]
    special: list[bool] = field(default_factory=list)  # per token: is a special token
    word_ids: list[int | None] = field(default_factory=list)  # per token: word index, None for specials
    target_tokens: list[str] | None = None  # decoder tokens (rows of decoder and cross)
    target_special: list[bool] | None = None
    target_word_ids: list[int | None] | None = None
    #: index of the first generated token (decoder tokens for encoder-decoder models); None: no generation
    generated_from: int | None = None
    identity: HeadIdentity | None = None  # original head numbers of a pruned model
    #: named tensors stored next to the patterns (e.g. ``rollout``, float32 ``[query, key]``; ``image``,
    #: float32 ``[H, W, 3]`` in 0–1, the picture a vision model saw)
    extras: dict[str, Tensor] = field(default_factory=dict)
    #: a vision model's capture: how the tokens (extra tokens, then patches row-major) cover the image
    image_grid: ImageGrid | None = None

    def __repr__(self) -> str:
        shape = ", ".join(
            f"{stack}: {len(layers)} layers × {layers[0].shape[0] if layers else 0} heads"
            for stack, layers in self.patterns.items()
        )
        target = "" if self.target_tokens is None else f", {len(self.target_tokens)} target tokens"
        return f"AttentionCapture(model={self.model!r}, {len(self.tokens)} tokens{target}, {shape})"

    @property
    def stacks(self) -> list[str]:
        return list(self.patterns)

    @property
    def encoder_decoder(self) -> bool:
        return self.target_tokens is not None

    def num_layers(self, stack: str = "self") -> int:
        return len(self._layers(stack))

    def num_heads(self, stack: str = "self", layer: int = 0) -> int:
        return self._layers(stack)[layer].shape[0]

    def head_counts(self, stack: str = "self") -> list[int]:
        """Heads of every layer of ``stack`` (they differ in a pruned model)."""
        return [pattern.shape[0] for pattern in self._layers(stack)]

    def _layers(self, stack: str) -> list[Tensor]:
        if stack not in self.patterns:
            raise InputError(f"this capture has no {stack!r} attention; it has {', '.join(self.patterns)}")
        return self.patterns[stack]

    def layer(self, layer: int, stack: str = "self") -> Tensor:
        """``[head, query, key]`` of one layer (negative indices count from the end)."""
        layers = self._layers(stack)
        if not -len(layers) <= layer < len(layers):
            raise InputError(f"layer {layer} is out of range: the model has {len(layers)} layers (0–{len(layers) - 1})")
        return layers[layer]

    def stacked(self, stack: str = "self") -> Tensor:
        """``[layer, head, query, key]``; needs the same head count in every layer."""
        layers = self._layers(stack)
        if len({t.shape for t in layers}) != 1:
            raise InputError("layers have different head counts (a pruned model): index them one by one")
        return torch.stack(layers)

    def axis_tokens(self, stack: str = "self") -> tuple[list[str], list[str]]:
        """(query tokens, key tokens) of ``stack``."""
        return stack_of(stack).pick(self.tokens, self.target_tokens)

    def axis_word_ids(self, stack: str = "self") -> tuple[list[int | None], list[int | None]]:
        """(query word ids, key word ids) of ``stack``."""
        return stack_of(stack).pick(self.word_ids, self.target_word_ids)

    def axis_labels(self, stack: str = "self", words: bool = False) -> tuple[list[str], list[str]]:
        """Display labels of the query and key axes of ``stack``: tokens, or words (pieces joined)."""
        query_tokens, key_tokens = self.axis_tokens(stack)
        if not words:
            return [display_token(t) for t in query_tokens], [display_token(t) for t in key_tokens]
        query_words, key_words = self.axis_word_ids(stack)
        if not query_words or not key_words:
            raise InputError("this capture has no word boundaries, so words cannot be merged")
        return (
            [word_label(query_tokens, g) for g in word_groups(query_words)],
            [word_label(key_tokens, g) for g in word_groups(key_words)],
        )

    def is_causal(self, stack: str = "self") -> bool:
        """Whether queries of ``stack`` only see earlier keys."""
        return is_causal_stack(stack, self.causal)

    # -- attention from other tools ---------------------------------------------------------

    @classmethod
    def from_attentions(
        cls,
        attentions: Any,
        tokens: Sequence[str],
        *,
        cross_attentions: Any = None,
        target_tokens: Sequence[str] | None = None,
        decoder_attentions: Any = None,
        causal: bool | None = None,
        batch_index: int | None = None,
        special: Sequence[bool] | None = None,
        model: str = "external",
    ) -> AttentionCapture:
        """A capture of patterns another tool computed (transformers, TransformerLens, numpy).

        ``attentions``: per-layer patterns of the self-attention over ``tokens`` (the encoder's, for an
        encoder-decoder model) in any form :mod:`attnviz.captures.external` accepts, or a transformers
        model output; ``cross_attentions`` / ``decoder_attentions``: an encoder-decoder model's cross- and
        decoder self-attention, whose queries are ``target_tokens``. ``batch_index``: the example to take
        from ``[batch, head, query, key]`` tensors holding several. ``causal``: None infers it from the
        upper triangle (all zero: a causal model). ``special``: special-token flags (default: read off the
        token strings). Raises :class:`~attnviz.common.errors.InputError` when a shape does not fit the
        tokens or a row is not a distribution.
        """
        from attnviz.captures.external import (
            check_tokens,
            checked_layers,
            default_special,
            layers_of,
            looks_causal,
            stacks_of_output,
        )
        from attnviz.common.tokens import word_ids_from_markers

        tokens = check_tokens(tokens, "tokens")
        output = stacks_of_output(attentions)
        if output is not None:  # a transformers ModelOutput
            attentions = output.get("encoder", output.get("self"))
            decoder_attentions = decoder_attentions if decoder_attentions is not None else output.get("decoder")
            cross_attentions = cross_attentions if cross_attentions is not None else output.get("cross")
            if attentions is None:
                raise InputError("the model output holds no attentions: run the model with output_attentions=True")
        encoder_decoder = target_tokens is not None or cross_attentions is not None or decoder_attentions is not None
        flags = default_special(tokens) if special is None else [bool(flag) for flag in special]
        if len(flags) != len(tokens):
            raise InputError(f"special has {len(flags)} flags for {len(tokens)} tokens: give one per token")
        fields: dict[str, Any] = {"special": flags, "word_ids": word_ids_from_markers(tokens, flags)}
        self_layers = checked_layers(
            layers_of(attentions, "attentions", batch_index), len(tokens), len(tokens), "attentions"
        )
        if not encoder_decoder:
            inferred = looks_causal(self_layers)
            if causal and not inferred:
                raise InputError(
                    "causal=True, but the patterns give weight to later tokens: leave causal out to infer it"
                )
            return cls(
                model=model,
                tokens=tokens,
                causal=inferred if causal is None else bool(causal),
                patterns={"self": self_layers},
                **fields,
            )
        if target_tokens is None:
            raise InputError(
                "decoder or cross-attention was given without target_tokens: pass the decoder's tokens as target_tokens"
            )
        targets = check_tokens(target_tokens, "target_tokens")
        target_flags = default_special(targets)
        patterns = {"encoder": self_layers}
        if decoder_attentions is not None:
            patterns["decoder"] = checked_layers(
                layers_of(decoder_attentions, "decoder_attentions", batch_index),
                len(targets),
                len(targets),
                "decoder_attentions",
            )
        if cross_attentions is not None:
            patterns["cross"] = checked_layers(
                layers_of(cross_attentions, "cross_attentions", batch_index),
                len(targets),
                len(tokens),
                "cross_attentions",
            )
        return cls(
            model=model,
            tokens=tokens,
            causal=False,
            patterns=patterns,
            target_tokens=targets,
            target_special=target_flags,
            target_word_ids=word_ids_from_markers(targets, target_flags),
            **fields,
        )

    # -- file format -----------------------------------------------------------------------

    def save(self, path: str | Path, *, bits: int = 32) -> Path:
        """Write the capture as safetensors (atomically) with ``bits`` (32, 16 or 8) per weight.

        See the module docstring for the format and :mod:`attnviz.captures.compact` for the error bounds.
        """
        from safetensors.torch import save_file

        check_bits(bits)
        path = check_output_path(path, (".safetensors",))
        tensors: dict[str, Tensor] = {}
        for stack, layers in self.patterns.items():
            for layer, pattern in enumerate(layers):
                tensors.update(encode_pattern(f"{stack}.{layer}", pattern, bits))
        tensors.update(
            {name: tensor.detach().to("cpu", torch.float32).contiguous() for name, tensor in self.extras.items()}
        )
        metadata = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "bits": str(bits),
            "model": self.model,
            "tokens": json.dumps(self.tokens),
            "special": json.dumps(self.special),
            "word_ids": json.dumps(self.word_ids),
            "causal": json.dumps(self.causal),
        }
        if self.target_tokens is not None:
            metadata["target_tokens"] = json.dumps(self.target_tokens)
            metadata["target_special"] = json.dumps(self.target_special)
            metadata["target_word_ids"] = json.dumps(self.target_word_ids)
        if self.generated_from is not None:
            metadata["generated_from"] = json.dumps(self.generated_from)
        if self.identity is not None:
            metadata["head_identity"] = json.dumps(self.identity.to_dict())
        if self.image_grid is not None:
            metadata["image_grid"] = json.dumps(self.image_grid.to_dict())
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata=metadata)
        return path

    @classmethod
    def load(cls, path: str | Path) -> AttentionCapture:
        """Read a capture written by :meth:`save` (or by ``attnviz capture``)."""
        from safetensors import safe_open

        from attnviz.captures.checks import capture_fields
        from attnviz.outputs.files import protect_inputs

        path = Path(path).expanduser()
        if not path.is_file():
            raise CaptureFileError(f"capture file {path} does not exist or is not a file")
        protect_inputs([path], "capture file")
        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (safe_open is not iterable)
        except Exception as exc:  # SafetensorError, OSError, ValueError, an unknown dtype, …
            raise CaptureFileError(f"{path} is not a readable safetensors capture file: {exc}") from exc
        if metadata.get("format") != FORMAT_NAME:
            raise CaptureFileError(f"{path} is not an attnviz capture (attnviz capture writes those)")
        version = metadata.get("version")
        if version not in READABLE_VERSIONS:
            raise CaptureFileError(
                f"{path} is an attnviz capture of format version {version!r}; this attnviz reads versions "
                f"{' and '.join(READABLE_VERSIONS)}: capture it again (or upgrade attnviz for newer files)"
            )
        try:
            decoded = decode_patterns(tensors)  # float32, whatever the bits per weight
        except (ValueError, RuntimeError) as exc:
            raise CaptureFileError(f"{path} is a damaged attnviz capture: {exc}; capture it again") from exc
        fields = capture_fields(path, metadata, decoded, version)
        if "head_identity" in metadata:  # a pruned model's original head numbers
            try:
                fields["identity"] = HeadIdentity.from_dict(json.loads(metadata["head_identity"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise CaptureFileError(f"{path} has a damaged head_identity field ({exc}): capture it again") from exc
        return cls(**fields)


def captures_from_patterns(
    patterns: dict[AttentionSite, Tensor], batch: EncodedBatch, model_name: str, causal: bool
) -> list[AttentionCapture]:
    """Split batched ``[b, h, q, k]`` patterns into one trimmed :class:`AttentionCapture` per example."""
    by_stack: dict[str, dict[int, Tensor]] = defaultdict(dict)
    for site, tensor in patterns.items():
        by_stack[site.stack][site.layer] = tensor
    captures = []
    for i in range(len(batch)):
        per_stack = {}
        for stack, layers in by_stack.items():
            query_lengths, key_lengths = batch.query_key_lengths(stack)
            q, k = query_lengths[i], key_lengths[i]
            per_stack[stack] = [layers[layer][i, :, :q, :k].clone() for layer in sorted(layers)]
        captures.append(
            AttentionCapture(
                model=model_name,
                tokens=batch.tokens[i],
                causal=causal,
                patterns=per_stack,
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


def capture_batch(
    loaded: LoadedModel,
    texts: Sequence[str],
    *,
    targets: Sequence[str] | None = None,
    max_length: int | None = None,
    truncate: bool = True,
) -> list[AttentionCapture]:
    """Run ``texts`` through ``loaded`` and return one capture per text (padding trimmed)."""
    batch = loaded.encode(texts, targets=targets, max_length=max_length, truncate=truncate)
    return capture_encoded(loaded, batch)


def capture_encoded(loaded: LoadedModel, batch: EncodedBatch) -> list[AttentionCapture]:
    """Run an encoded ``batch`` (texts or images) through ``loaded``: one capture per example (padding trimmed)."""
    recorder = PatternRecorder()
    with torch.no_grad():
        loaded.forward(batch, loaded.context([recorder]))
    captures = captures_from_patterns(recorder.patterns, batch, loaded.name, loaded.causal)
    identity = model_identity(loaded)
    for result in captures:
        result.identity = identity
    return captures


def capture(
    loaded: LoadedModel,
    text: str,
    *,
    target: str | None = None,
    max_length: int | None = None,
    truncate: bool = True,
) -> AttentionCapture:
    """Capture every attention pattern of ``loaded`` on one text (and decoder ``target``)."""
    return capture_batch(
        loaded, [text], targets=None if target is None else [target], max_length=max_length, truncate=truncate
    )[0]
