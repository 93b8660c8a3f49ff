"""Attention patterns another tool computed, made into an :class:`AttentionCapture`.

Accepted per stack (self / encoder attention, decoder attention, cross-attention):

* transformers' ``outputs.attentions`` (or ``encoder_attentions`` / ``decoder_attentions`` /
  ``cross_attentions``): a tuple with one ``[batch, head, query, key]`` tensor per layer;
* a list of ``[head, query, key]`` tensors or numpy arrays, one per layer;
* one ``[layer, head, query, key]`` tensor or array;
* a mapping of layer name -> tensor, ordered by the number in the name (a TransformerLens cache's
  ``blocks.{layer}.attn.hook_pattern``, ``[batch, head, query, key]``); a whole cache (a TransformerLens
  ``ActivationCache``, or its ``cache_dict``) gives its ``hook_pattern`` entries;
* one ``[layer, batch, head, query, key]`` tensor (``torch.stack(outputs.attentions)``,
  ``cache.stack_activation("pattern")``), or one layer's ``[head, query, key]`` (circuitsvis's format);
* a transformers model output itself (its ``attentions``, or its encoder / decoder / cross ones).

inseq's ``FeatureAttributionSequenceOutput`` is refused with the call that converts it (its attention is
``[key, query, layer, head]``). Every layer is checked against the tokens (``[head, len(query tokens), len(key tokens)]``) and every
row must be a distribution (non-negative, summing to 1). Patterns are kept as float32 on the CPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from attnviz.common.errors import InputError

#: how far a row's sum may be from 1: half-precision softmax rows are off by ~1e-3
_ROW_SUM_TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 2e-2}
_DEFAULT_ROW_SUM_TOLERANCE = 1e-3
#: an upper triangle whose weights are all below this is taken as masked (a causal model)
_CAUSAL_EPSILON = 1e-6
#: tokens shown as special tokens when the caller does not say: ``[CLS]``, ``<s>``, ``<|endoftext|>``, …
_SPECIAL_TOKEN = re.compile(r"^(\[[A-Z_]+\]|<\|?[A-Za-z_/]*\|?>)$")


def layers_of(attentions: Any, what: str, batch_index: int | None) -> list[Tensor]:
    """One float32 CPU ``[head, query, key]`` tensor per layer, out of any of the accepted forms."""
    _refuse_inseq(attentions, what)
    cache = getattr(attentions, "cache_dict", None)  # a TransformerLens ActivationCache, duck-typed
    if isinstance(cache, Mapping):
        attentions = cache
    if isinstance(attentions, Mapping):
        attentions = _ordered_by_layer(_patterns_only(attentions, what), what)
    elif _is_array(attentions):
        array = _as_tensor(attentions, what)
        if array.ndim == 5:  # [layer, batch, head, q, k]: torch.stack(outputs.attentions)
            attentions = [_one_example(layer, f"{what} (stacked)", batch_index) for layer in array]
        elif array.ndim == 3:  # [head, q, k]: one layer (circuitsvis's attention_patterns)
            attentions = [array]
        elif array.ndim != 4:
            raise InputError(
                f"{what}: one array must be [layer, head, query, key], [layer, batch, head, query, key] or one "
                f"layer's [head, query, key], got shape {list(array.shape)}"
            )
        else:
            attentions = list(array)  # [layer, head, q, k] -> layers of [head, q, k]
    if isinstance(attentions, Sequence) and not isinstance(attentions, str) and not attentions:
        raise InputError(
            f"{what} is empty: the model returned no attention weights; run it with output_attentions=True and "
            'attn_implementation="eager" (sdpa and flash attention do not return them)'
        )
    if not isinstance(attentions, Sequence) or isinstance(attentions, str):
        raise InputError(
            f"{what}: give a tuple or list with one attention tensor per layer (e.g. outputs.attentions), "
            f"got {type(attentions).__name__}"
        )
    layers = []
    for index, layer in enumerate(attentions):
        tensor = _as_tensor(layer, f"{what} layer {index}")
        if tensor.ndim == 4:  # [batch, head, q, k]
            tensor = _one_example(tensor, f"{what} layer {index}", batch_index)
        if tensor.ndim != 3:
            raise InputError(
                f"{what} layer {index} has shape {list(tensor.shape)}: give one [batch, head, query, key] "
                "or [head, query, key] tensor per layer"
            )
        layers.append(tensor)
    return layers


#: a TransformerLens cache's names of the attention weights (after the softmax) and scores (before it)
_PATTERN_HOOK = re.compile(r"(^|\.)hook_pattern$")
_SCORES_HOOK = re.compile(r"(^|\.)hook_attn_scores$")


def _patterns_only(named: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    """A whole TransformerLens cache (residuals, scores, patterns, …) -> its ``hook_pattern`` entries; a mapping
    of layer names to patterns as it is."""
    patterns = {name: value for name, value in named.items() if _PATTERN_HOOK.search(str(name))}
    if patterns:
        return patterns
    if any(_SCORES_HOOK.search(str(name)) for name in named):
        raise InputError(
            f"{what} holds attention scores before the softmax ('hook_attn_scores'): give the weights after it, "
            "a TransformerLens 'hook_pattern' (cache names blocks.{layer}.attn.hook_pattern)"
        )
    if any("hook_" in str(name) for name in named):
        raise InputError(
            f"{what}: this TransformerLens cache holds no 'hook_pattern' entries: run the model with "
            "run_with_cache(...) without a names_filter that drops them"
        )
    return named


def _refuse_inseq(value: Any, what: str) -> None:
    """inseq's FeatureAttributionSequenceOutput: its attention is [key, query, layer, head]; say how to convert it."""
    if not (hasattr(value, "source_attributions") and hasattr(value, "target_attributions")):
        return
    field = "source_attributions" if getattr(value, "source_attributions", None) is not None else "target_attributions"
    raise InputError(
        f"{what} is an inseq {type(value).__name__}, whose {field} is [key, query, layer, head] (with "
        f"model.attribute(..., method='attention') and no aggregation): pass out.{field}.permute(2, 3, 1, 0), "
        "which is [layer, head, query, key], with its tokens"
    )


def _is_array(value: Any) -> bool:
    return isinstance(value, Tensor) or type(value).__module__.startswith("numpy")


def _as_tensor(value: Any, what: str) -> Tensor:
    if isinstance(value, Tensor):
        if value.layout != torch.strided:  # sparse (COO, CSR …): attention patterns are dense
            raise InputError(
                f"{what} is a {str(value.layout).removeprefix('torch.')} tensor: give dense weights (convert it with to_dense)"
            )
        return value
    try:
        import numpy as np

        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "fiub":  # object, string … arrays: no weights torch can read
                raise InputError(
                    f"{what} is a numpy array of {value.dtype} values, not attention weights: give a float array "
                    "(np.stack of the per-layer arrays, .astype(np.float32))"
                )
            return torch.from_numpy(np.ascontiguousarray(value))
    except ImportError:  # pragma: no cover - numpy comes with torch
        pass
    raise InputError(f"{what} is a {type(value).__name__}, not a torch tensor or numpy array")


def _one_example(tensor: Tensor, what: str, batch_index: int | None) -> Tensor:
    """``[batch, head, q, k]`` -> ``[head, q, k]`` of example ``batch_index`` (needed when the batch has several)."""
    batch = tensor.shape[0]
    if batch_index is None:
        if batch != 1:
            raise InputError(f"{what} holds a batch of {batch} examples: pass batch_index=… to say which one to show")
        return tensor[0]
    if not -batch <= batch_index < batch:
        raise InputError(f"batch_index {batch_index} is out of range: {what} holds {batch} example(s)")
    return tensor[batch_index]


def _ordered_by_layer(named: Mapping[str, Any], what: str) -> list[Any]:
    """Values of a ``name -> tensor`` mapping in layer order, the layer being the first number in each name."""
    numbered = []
    for name, value in named.items():
        found = re.search(r"\d+", str(name))
        if found is None:
            raise InputError(
                f"{what}: the name {name!r} has no layer number; give names such as 'blocks.0.attn.hook_pattern'"
            )
        numbered.append((int(found.group()), value))
    layers = sorted(number for number, _ in numbered)
    if layers != list(range(len(layers))):
        raise InputError(f"{what}: the layers named are {layers}, not 0…{len(layers) - 1} each once")
    return [value for _, value in sorted(numbered, key=lambda item: item[0])]


def checked_layers(layers: list[Tensor], queries: int, keys: int, what: str) -> list[Tensor]:
    """``layers`` as float32 CPU tensors, after checking shapes against the token counts and that rows sum to 1."""
    checked = []
    for index, layer in enumerate(layers):
        name = f"{what} layer {index}"
        if layer.dim() != 3 or layer.shape[0] == 0:
            raise InputError(
                f"{name} has shape {list(layer.shape)}: give [head, query, key] weights with at least one head"
            )
        if layer.shape[-2:] != (queries, keys):
            raise InputError(
                f"{name} is [head, {layer.shape[-2]}, {layer.shape[-1]}] but the tokens give [head, {queries}, {keys}]: "
                "pass the tokens of exactly this example (padding included if the patterns have it)"
            )
        if not layer.is_floating_point():
            raise InputError(f"{name} holds {layer.dtype} values, not attention weights: give floating-point weights")
        if layer.device.type == "meta":
            raise InputError(f"{name} is on the meta device and holds no values: give the computed weights")
        tolerance = _ROW_SUM_TOLERANCE.get(layer.dtype, _DEFAULT_ROW_SUM_TOLERANCE)
        pattern = layer.detach().to("cpu", torch.float32).contiguous()  # [head, q, k]
        if not _finite_and_non_negative(pattern):
            if not bool(torch.isnan(pattern).any()):  # negative or -inf: scores before the softmax
                raise InputError(
                    f"{name} holds negative or infinite values: these are attention scores before the softmax, "
                    "not weights; give the weights after it (a TransformerLens 'hook_pattern', not "
                    "'hook_attn_scores'; transformers' outputs.attentions)"
                )
            raise InputError(
                f"{name} holds NaN values, not attention weights: give the weights of a healthy run (a model run in "
                "half precision can overflow: run it in float32)"
            )
        sums = pattern.sum(dim=-1)  # [head, q]
        worst = float((sums - 1).abs().max())
        if worst > tolerance:
            head, query = divmod(int((sums - 1).abs().argmax()), sums.shape[1])
            raise InputError(
                f"{name}: the row of head {head}, query {query} sums to {float(sums[head, query]):.4g}, not 1; "
                "give attention weights after the softmax (a TransformerLens 'hook_pattern', not 'hook_attn_scores')"
            )
        # a copy of the caller's tensor, made once: ``to`` already copied one of another dtype or device
        checked.append(pattern.clone() if pattern.data_ptr() == layer.data_ptr() else pattern)
    return checked


def _finite_and_non_negative(pattern: Tensor) -> bool:
    """Head by head (no whole-layer boolean temporaries): ``aminmax`` propagates NaN, which fails both tests."""
    for head in pattern.reshape(-1, *pattern.shape[-2:]):  # [query, key]
        low, high = torch.aminmax(head)
        if not (float(low) >= 0 and float(high) < float("inf")):
            return False
    return True


def looks_causal(layers: list[Tensor]) -> bool:
    """Whether every weight above the diagonal is (almost) zero in every layer (square patterns of 2+ tokens)."""
    size = layers[0].shape[-1]
    if size < 2 or layers[0].shape[-2] != size:
        return False
    upper = torch.ones(size, size, dtype=torch.bool).triu(1)  # [q, k]
    return all(float(layer[:, upper].max()) <= _CAUSAL_EPSILON for layer in layers)


def default_special(tokens: Sequence[str]) -> list[bool]:
    """Special-token flags read off the token strings (``[CLS]``, ``<s>``, ``<|endoftext|>``, …)."""
    return [bool(_SPECIAL_TOKEN.match(token)) for token in tokens]


def check_tokens(tokens: Any, what: str) -> list[str]:
    if isinstance(tokens, str) or not isinstance(tokens, Sequence) or not tokens:
        raise InputError(
            f"{what} must be a non-empty list of token strings (e.g. tokenizer.convert_ids_to_tokens(ids))"
        )
    from attnviz.common.tokens import decoded_if_byte_level

    return decoded_if_byte_level([str(token) for token in tokens])  # raw byte-level strings read as text


def stacks_of_output(output: Any) -> dict[str, Any] | None:
    """The attention tuples of a transformers model output, by stack, or None when ``output`` is not one."""
    found = {
        stack: getattr(output, attribute, None)
        for stack, attribute in (
            ("self", "attentions"),
            ("encoder", "encoder_attentions"),
            ("decoder", "decoder_attentions"),
            ("cross", "cross_attentions"),
        )
    }
    if not any(hasattr(output, attribute) for attribute in ("attentions", "encoder_attentions")):
        return None
    return {stack: value for stack, value in found.items() if value}


def capture_from_attentions(
    capture_class: Any,
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
) -> Any:
    """The body of :meth:`AttentionCapture.from_attentions <attnviz.captures.attention_capture.AttentionCapture.from_attentions>`: ``capture_class(...)`` of checked patterns."""
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
            raise InputError("causal=True, but the patterns give weight to later tokens: leave causal out to infer it")
        return capture_class(
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
    # both target-side stacks have a row per target token; the decoder's keys are the targets, cross-attention's
    # the source tokens
    for stack, given, num_keys in (
        ("decoder", decoder_attentions, len(targets)),
        ("cross", cross_attentions, len(tokens)),
    ):
        if given is not None:
            name = f"{stack}_attentions"
            patterns[stack] = checked_layers(layers_of(given, name, batch_index), len(targets), num_keys, name)
    return capture_class(
        model=model,
        tokens=tokens,
        causal=False,
        patterns=patterns,
        target_tokens=targets,
        target_special=target_flags,
        target_word_ids=word_ids_from_markers(targets, target_flags),
        **fields,
    )
