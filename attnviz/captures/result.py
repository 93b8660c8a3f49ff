"""The capture object that holds one example's full attention patterns, and its file format.

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
``image`` (float32 ``[H, W, 3]`` in 0–1, the resized picture). ``weighting`` says what the tensors hold:
``weights`` (the softmax weights; a file without the field holds those) or ``norm`` (``α_ij·‖f_h(x_j)‖``,
norm-based attention: :mod:`attnviz.core.weighting`; not renormalised, so rows need not sum to 1).
Version-1 files (always float32) still load. No pickle is involved.

A capture of some layers or heads (``capture(..., layers=, heads=, stacks=)``) keeps the model's
numbers: ``patterns[stack]`` still has one entry per model layer, those not recorded holding no heads
(``[0, query, key]``), and ``identity`` (metadata ``head_identity``) names the recorded layers and
the model's number of each recorded head; the file stores the recorded layers only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnviz.captures.compact import check_bits, encode_pattern
from attnviz.common.display import NotebookDisplay
from attnviz.common.errors import InputError
from attnviz.common.images import ImageGrid
from attnviz.common.tokens import display_token, word_groups, word_label
from attnviz.common.wording import plural
from attnviz.core.choices import Weighting
from attnviz.core.stacks import is_causal_stack, stack_of
from attnviz.models.identity import HeadIdentity
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
    #: what the patterns hold: ``"weights"`` (softmax weights) or ``"norm"`` (``α_ij·‖f_h(x_j)‖``, rows not summing to 1)
    weighting: Weighting = "weights"

    def __repr__(self) -> str:
        shape = ", ".join(
            f"{stack}: {len(layers)} layers × {max((t.shape[0] for t in layers), default=0)} heads"
            for stack, layers in self.patterns.items()
        )
        target = "" if self.target_tokens is None else f", {len(self.target_tokens)} target tokens"
        recorded = " (some layers or heads only)" if self.identity is not None and self.identity.is_subset() else ""
        return f"AttentionCapture(model={self.model!r}, {len(self.tokens)} tokens{target}, {shape}{recorded})"

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
            raise InputError(
                f"layer {layer} is out of range: the model has {plural(len(layers), 'layer')} (0–{len(layers) - 1})"
            )
        number = layer % len(layers)
        if not self.is_recorded(number, stack):
            held = ", ".join(map(str, self.recorded_layers(stack))) or "none"
            raise InputError(f"layer {number} is not in this capture: it records {stack} layers {held}")
        return layers[layer]

    def is_recorded(self, layer: int, stack: str = "self") -> bool:
        """Whether the capture holds ``layer`` of ``stack`` (a capture of some layers holds no heads of the others)."""
        return self.identity is None or self.identity.is_recorded(stack, layer)

    def attention_layers(self, stack: str = "self") -> list[int]:
        """The model's layers of ``stack`` that have attention: every layer, except in a hybrid stack (Qwen3-Next,
        Jamba, …), whose recurrent or convolution layers hold no heads (whether this capture records them or not)."""
        layout = self.identity.model_layout.get(stack) if self.identity is not None else None
        layers = range(len(self._layers(stack)))
        return [layer for layer in layers if layout is None or layer >= len(layout) or layout[layer] > 0]

    def recorded_layers(self, stack: str = "self") -> list[int]:
        """The model's layers of ``stack`` this capture holds (every layer, unless it records some only)."""
        return [layer for layer in range(len(self._layers(stack))) if self.is_recorded(layer, stack)]

    def stacked(self, stack: str = "self") -> Tensor:
        """``[layer, head, query, key]``; needs the same head count in every layer."""
        layers = self._layers(stack)
        if len(self.recorded_layers(stack)) != len(layers):
            raise InputError("this capture records some layers only: index them one by one (recorded_layers)")
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

    def renormalised(self) -> AttentionCapture:
        """A norm-based capture with every row divided by its sum (a distribution again, as views of weights
        expect); a capture of weights as it is."""
        if self.weighting != "norm":
            return self
        rows = {
            stack: [p / p.sum(-1, keepdim=True).clamp(min=1e-30) for p in layers]
            for stack, layers in self.patterns.items()
        }
        return dataclasses.replace(self, patterns=rows, model=f"{self.model} · norm-based, rows renormalised")

    # -- attention from other tools ---------------------------------------------------------

    @classmethod
    def from_attentions(cls, attentions: Any, tokens: Sequence[str], **options: Any) -> AttentionCapture:
        """A capture of patterns another tool computed (transformers, TransformerLens, numpy).

        ``attentions``: per-layer patterns of the self-attention over ``tokens`` (the encoder's, for an
        encoder-decoder model) in any form :mod:`attnviz.captures.external` accepts, or a transformers
        model output. ``options``, by keyword: ``cross_attentions`` / ``decoder_attentions``, an
        encoder-decoder model's cross- and decoder self-attention, whose queries are ``target_tokens``;
        ``batch_index``, the example to take from ``[batch, head, query, key]`` tensors holding several;
        ``causal``, None infers it from the upper triangle (all zero: a causal model); ``special``,
        special-token flags (default: read off the token strings); ``model``, the name the capture gives its
        model (default ``"external"``). Raises :class:`~attnviz.common.errors.InputError` when a shape does
        not fit the tokens or a row is not a distribution.
        """
        from attnviz.captures.external import capture_from_attentions

        return capture_from_attentions(cls, attentions, tokens, **options)

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
                if self.is_recorded(layer, stack):  # a capture of some layers stores only those
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
        metadata["weighting"] = self.weighting
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata=metadata)
        return path

    @classmethod
    def load(cls, path: str | Path) -> AttentionCapture:
        """Read a capture written by :meth:`save` (or by ``attnviz capture``)."""
        from attnviz.captures.checks import read_capture_file

        fields = read_capture_file(Path(path).expanduser(), FORMAT_NAME, READABLE_VERSIONS)
        return cls(**fields)
