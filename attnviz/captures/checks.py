"""Checking a capture file read from disk before anything is drawn from it.

A capture file (format in :mod:`attnviz.captures.attention_capture`) is user input: its metadata
may have the wrong JSON types, its tensors the wrong rank, or shapes that do not
match the token lists. Every such file is refused with one
:class:`~attnviz.common.errors.CaptureFileError` line instead of a traceback or a
wrong figure.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnviz.captures.compact import decode_patterns
from attnviz.common.errors import CaptureFileError, InputError
from attnviz.common.images import ImageGrid
from attnviz.core.choices import WEIGHTINGS
from attnviz.core.stacks import stack_of
from attnviz.models.identity import HeadIdentity

#: tensors a capture file may hold besides the per-layer patterns (see AttentionCapture.extras)
KNOWN_EXTRAS = ("rollout",)

#: slack allowed on attention weights read back (they are probabilities)
_WEIGHT_SLACK = 1e-3
_NAME = re.compile(r"(self|encoder|decoder|cross)\.(0|[1-9][0-9]*)")


def read_capture_file(path: Path, format_name: str, readable_versions: tuple[str, ...]) -> dict[str, Any]:
    """The checked keyword arguments of an ``AttentionCapture`` read from ``path``; raises CaptureFileError."""
    from safetensors import safe_open

    from attnviz.outputs.files import protect_inputs

    if not path.is_file():
        raise CaptureFileError(f"capture file {path} does not exist or is not a file")
    protect_inputs([path], "capture file")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except Exception as exc:  # SafetensorError, OSError, ValueError, an unknown dtype, …
        raise CaptureFileError(f"{path} is not a readable safetensors capture file: {exc}") from exc
    if metadata.get("format") != format_name:
        raise CaptureFileError(f"{path} is not an attnviz capture (attnviz capture writes those)")
    version = metadata.get("version")
    if version not in readable_versions:
        raise CaptureFileError(
            f"{path} is an attnviz capture of format version {version!r}; this attnviz reads versions "
            f"{' and '.join(readable_versions)}: capture it again (or upgrade attnviz for newer files)"
        )
    try:
        decoded = decode_patterns(tensors)  # float32, whatever the bits per weight; empties ``tensors``
    except (ValueError, RuntimeError) as exc:
        raise CaptureFileError(f"{path} is a damaged attnviz capture: {exc}; capture it again") from exc
    identity = None
    if "head_identity" in metadata:  # a pruned model's original head numbers, the layers of a partial capture
        try:
            identity = HeadIdentity.from_dict(json.loads(metadata["head_identity"]))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CaptureFileError(f"{path} has a damaged head_identity field ({exc}): capture it again") from exc
    return {**capture_fields(path, metadata, decoded, version, identity), "identity": identity}


def capture_fields(
    path: Path,
    metadata: dict[str, str],
    tensors: dict[str, Tensor],
    version: str,
    identity: HeadIdentity | None = None,
) -> dict[str, Any]:
    """The keyword arguments of :class:`~attnviz.captures.attention_capture.AttentionCapture`, checked; raises CaptureFileError."""

    def damaged(what: str) -> CaptureFileError:
        return CaptureFileError(f"{path} is a damaged attnviz capture: {what}; capture it again")

    if metadata.get("version") != version:
        raise CaptureFileError(
            f"{path} is an attnviz capture of format version {metadata.get('version')!r}; this attnviz reads "
            f"version {version}: capture it again"
        )

    def field(name: str, default: Any = None, required: bool = False) -> Any:
        if name not in metadata:
            if required:
                raise damaged(f"the metadata field {name!r} is missing")
            return default
        try:
            return json.loads(metadata[name])
        except (TypeError, ValueError) as exc:
            raise damaged(f"the metadata field {name!r} is not JSON") from exc

    model = metadata.get("model", "?")
    causal = field("causal", False)
    if not isinstance(causal, bool):
        raise damaged("'causal' is not true or false")
    tokens = _token_list(field("tokens", required=True), "tokens", damaged)
    special = _flag_list(field("special", []), len(tokens), "special", damaged)
    word_ids = _word_list(field("word_ids", []), len(tokens), "word_ids", damaged)
    target_tokens = target_special = target_word_ids = None
    if "target_tokens" in metadata:
        target_tokens = _token_list(field("target_tokens"), "target_tokens", damaged)
        target_special = _flag_list(field("target_special", []), len(target_tokens), "target_special", damaged)
        target_word_ids = _word_list(field("target_word_ids", []), len(target_tokens), "target_word_ids", damaged)

    generated_from = field("generated_from")  # index of the first generated token (version 2, --generate)
    generated_axis = len(target_tokens if target_tokens is not None else tokens)
    if generated_from is not None and (
        not isinstance(generated_from, int)
        or isinstance(generated_from, bool)
        or not 0 <= generated_from <= generated_axis
    ):
        raise damaged(f"'generated_from' is not a token index between 0 and {generated_axis}")

    weighting = metadata.get("weighting", "weights")  # files from before norm-based attention hold weights
    if weighting not in WEIGHTINGS:
        raise damaged(f"its weighting is {weighting!r}, not one of {', '.join(WEIGHTINGS)}")
    allowed = ("encoder", "decoder", "cross") if target_tokens is not None else ("self",)
    # (query length, key length) of each stack, from the one stack table
    lengths = {stack: stack_of(stack).pick(len(tokens), len(target_tokens or [])) for stack in allowed}
    by_stack: dict[str, dict[int, Tensor]] = {}
    extras: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        if name == "image":  # a vision capture's picture: [H, W, 3] in 0–1
            if tensor.ndim != 3 or tensor.shape[2] != 3 or min(tensor.shape[:2]) < 1:
                raise damaged(f"the image tensor has shape {list(tensor.shape)}, not [height, width, 3]")
            if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
                raise damaged("the image tensor is not finite floating-point data")
            extras[name] = tensor.float().clamp(0.0, 1.0)
            continue
        if name in KNOWN_EXTRAS:  # a named tensor next to the patterns
            if tuple(tensor.shape) != (len(tokens), len(tokens)):  # rollout: [query, key] over the source tokens
                raise damaged(f"{name} has shape {list(tensor.shape)}, not [{len(tokens)}, {len(tokens)}]")
            if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
                raise damaged(f"the {name} tensor is not finite floating-point data")
            extras[name] = tensor.float()
            continue
        match = _NAME.fullmatch(name)
        if match is None or match.group(1) not in allowed:
            raise damaged(f"it holds a tensor named {name!r} (expected {' or '.join(s + '.N' for s in allowed)})")
        stack, layer = match.group(1), int(match.group(2))
        # [head, query, key]
        if tensor.ndim != 3 or tensor.shape[0] < 1:
            raise damaged(f"{name} has shape {list(tensor.shape)}, not [head, query, key]")
        if tuple(tensor.shape[1:]) != lengths[stack]:
            raise damaged(
                f"{name} has {tensor.shape[1]} queries × {tensor.shape[2]} keys but the token lists give "
                f"{lengths[stack][0]} × {lengths[stack][1]}"
            )
        if not tensor.is_floating_point():
            raise damaged(f"{name} holds {tensor.dtype} values, not attention weights")
        tensor = tensor.float()
        if not _are_weights(tensor, None if weighting == "norm" else 1 + _WEIGHT_SLACK):
            raise damaged(f"{name} holds values that are not attention weights (NaN, infinite, or outside 0–1)")
        by_stack.setdefault(stack, {})[layer] = tensor
    if not by_stack:
        raise damaged("it holds no attention tensors")
    patterns = {}
    for stack in (s for s in ("self", "encoder", "decoder", "cross") if s in by_stack):
        layers = by_stack[stack]
        recorded = identity.recorded_layers.get(stack) if identity is not None else None
        if recorded is None:
            if sorted(layers) != list(range(len(layers))):
                raise damaged(f"the {stack} layers are not numbered 0…{len(layers) - 1}")
            count = len(layers)
        else:  # a capture of some layers: exactly those, the others hold no heads
            if sorted(layers) != sorted(recorded):
                raise damaged(f"its {stack} layers are {sorted(layers)}, but it says it records {sorted(recorded)}")
            heads = identity.heads.get(stack) if identity is not None else None
            count = len(heads) if heads else max(layers) + 1
            if count <= max(layers):
                raise damaged(f"its {stack} layer {max(layers)} is beyond the {count} layers it says the model has")
        empty = torch.empty(0, *lengths[stack])
        patterns[stack] = [layers.get(i, empty) for i in range(count)]
    image_grid = None
    if "image_grid" in metadata:
        try:
            image_grid = ImageGrid.from_dict(field("image_grid"))
        except ValueError as exc:
            raise damaged(str(exc)) from exc
        # the image's tokens are all the tokens (a captioner's capture has its caption as target tokens), or a run of
        # them inside a text (a vision-language model's)
        inside_text = image_grid.start > 0 or len(tokens) > image_grid.num_tokens
        if (image_grid.num_tokens != len(tokens) and not inside_text) or image_grid.positions.stop > len(tokens):
            raise damaged(f"its image grid makes {image_grid.num_tokens} tokens but it has {len(tokens)}")
        if "image" not in extras:
            raise damaged("it has an image grid but no image tensor")
    return {
        "model": model,
        "image_grid": image_grid,
        "extras": extras,
        "tokens": tokens,
        "causal": causal,
        "patterns": patterns,
        "special": special,
        "word_ids": word_ids,
        "target_tokens": target_tokens,
        "target_special": target_special,
        "target_word_ids": target_word_ids,
        "generated_from": generated_from,
        "weighting": weighting,
    }


def _are_weights(tensor: Tensor, ceiling: float | None = 1 + _WEIGHT_SLACK) -> bool:
    """Every value finite, ≥ 0 and ≤ ``ceiling`` (with slack; None: finite only), head by head: no whole-tensor temporaries.

    ``aminmax`` propagates NaN, and a NaN fails both comparisons.
    """
    for head in tensor:  # [query, key]
        low, high = torch.aminmax(head)
        if not (float(low) >= -_WEIGHT_SLACK and float(high) <= (math.inf if ceiling is None else ceiling)):
            return False
    return True


def _token_list(value: Any, name: str, damaged) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(token, str) for token in value):
        raise damaged(f"{name!r} is not a non-empty list of strings")
    return value


def _flag_list(value: Any, length: int, name: str, damaged) -> list[bool]:
    if value == []:
        return [False] * length
    if not isinstance(value, list) or len(value) != length or not all(isinstance(v, bool) for v in value):
        raise damaged(f"{name!r} is not a list of {length} true/false values")
    return value


def _word_list(value: Any, length: int, name: str, damaged) -> list[int | None]:
    if value == []:
        return list(range(length))
    ok = isinstance(value, list) and len(value) == length
    if not ok or not all(v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0) for v in value):
        raise damaged(f"{name!r} is not a list of {length} word numbers (or null)")
    return value


def check_capture_in_memory(capture: Any) -> None:
    """Refuse a capture whose token lists no longer fit its patterns (edited after it was made), with what to do.

    ``capture``: an :class:`~attnviz.captures.attention_capture.AttentionCapture`. Raises :class:`InputError`.
    """
    for name, tokens in (("tokens", capture.tokens), ("target_tokens", capture.target_tokens)):
        if tokens is not None and (isinstance(tokens, str) or not isinstance(tokens, list)):
            raise InputError(f"capture.{name} is a {type(tokens).__name__}: it must be a list of token strings")
    for stack in capture.stacks:
        query_tokens, key_tokens = capture.axis_tokens(stack)
        for layer in capture.recorded_layers(stack):
            shape = tuple(capture.layer(layer, stack).shape)  # [head, query, key]
            if shape[1:] != (len(query_tokens), len(key_tokens)):
                raise InputError(
                    f"the capture's {stack} layer {layer} is [head, {shape[1]}, {shape[2]}] but its tokens give "
                    f"[head, {len(query_tokens)}, {len(key_tokens)}]: capture.tokens (or target_tokens) was changed "
                    "after the capture was made; relabel tokens with a list of the same length, or capture again"
                )
    for name, flags, tokens in (
        ("special", capture.special, capture.tokens),
        ("word_ids", capture.word_ids, capture.tokens),
    ):
        if flags and len(flags) != len(tokens):
            raise InputError(
                f"capture.{name} has {len(flags)} entries for {len(tokens)} tokens: keep one per token "
                "(the tokens or this list was changed after the capture was made)"
            )
