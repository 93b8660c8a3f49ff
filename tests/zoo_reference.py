"""What transformers' own eager attention says about a zoo model: the reference ``test_zoo.py`` holds attnviz to.

Nothing here imports attnviz's core: patterns and logits come from ``output_attentions=True`` under
``attn_implementation="eager"``; each head's value vectors from a wrapper around the family's own
``eager_attention_forward`` (the function the modeling code calls); patching from a plain forward pre-hook on each
attention module's output projection, whose input is ``[b, q, heads × head_dim]`` with head ``h`` in columns
``h·d … h·d+d−1``.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import torch
from torch import nn

#: module-name fragments of cross-attention modules (BERT-style, BART-style, T5-style, others)
CROSS_NAMES = ("crossattention", "encoder_attn", "encdecattention", "cross_attn", "cross_attention")


def eager_model(directory, class_name: str):
    import transformers

    return getattr(transformers, class_name).from_pretrained(str(directory), attn_implementation="eager").eval()


def stack_of(name: str, encoder_decoder: bool, module: nn.Module | None = None) -> str:
    """attnviz's stack name for the attention module called ``name`` (T5's ``T5LayerCrossAttention`` by its class)."""
    lowered = name.lower() + "." + type(module).__name__.lower()
    if not encoder_decoder:
        return "self"
    if any(part in lowered for part in CROSS_NAMES) or "crossattention" in lowered:
        return "cross"
    # a decoder module, or one named for its decoder (SeamlessM4T's text_decoder)
    return "decoder" if any(part.split("_")[-1] == "decoder" for part in lowered.split(".")) else "encoder"


def unfold_local(blocked: torch.Tensor, length: int) -> torch.Tensor:
    """LongT5's local weights of example 0, ``[1, blocks, h, block, 3·block]`` (each block's queries over the block
    before, its own and the one after), laid out over ``length`` tokens as ``[h, q, k]`` by an index loop."""
    block = blocked.shape[3]
    unfolded = torch.zeros(blocked.shape[2], length, length)  # [h, q, k]
    for query in range(length):
        index, row = divmod(query, block)
        for key in range(length):
            column = key - (index - 1) * block
            if 0 <= column < 3 * block:
                unfolded[:, query, key] = blocked[0, index, :, row, column]
    return unfolded


def eager_patterns(outputs, encoder_decoder: bool, length: int | None = None) -> dict[str, list[torch.Tensor]]:
    """``{stack: [[h, q, k] per attention layer]}`` (example 0) from the eager outputs; layers without attention left
    out; LongT5's blocked local weights unfolded over the ``length`` input tokens."""
    groups = (
        {"encoder": "encoder_attentions", "decoder": "decoder_attentions", "cross": "cross_attentions"}
        if encoder_decoder
        else {"self": "attentions"}
    )
    patterns: dict[str, list[torch.Tensor]] = {}
    for stack, attribute in groups.items():
        layers = [a for a in (getattr(outputs, attribute, None) or ()) if a is not None]
        if length is not None:
            layers = [unfold_local(a, length)[None] if a.dim() == 5 else a for a in layers]
        if any(not isinstance(a, torch.Tensor) for a in layers):
            raise LookupError(f"eager {attribute} are not one [batch, head, query, key] tensor per layer")
        patterns[stack] = [a[0].float() for a in layers]
    return patterns


def run_eager(model, inputs: dict) -> tuple[torch.Tensor, dict[str, list[torch.Tensor]]]:
    """``(logits [q, vocab] of example 0, patterns by stack)``; a hybrid stack's linear-attention layers, whose
    eager weights are no softmax (MiniMax's lightning attention returns some), left out by their layer type."""
    with torch.no_grad():
        outputs = model(**inputs, output_attentions=True, use_cache=False)
    patterns = eager_patterns(outputs, model.config.is_encoder_decoder, inputs["input_ids"].shape[1])
    types = getattr(model.config.get_text_config(), "layer_types", None) or []
    if "self" in patterns and len(types) == len(patterns["self"]):
        patterns["self"] = [p for p, kind in zip(patterns["self"], types, strict=True) if "linear" not in kind]
    return outputs.logits[0].float(), patterns


def hand_statistics(pattern: torch.Tensor, positions: bool = True) -> dict[str, torch.Tensor]:
    """Per-head means over queries ``[h]`` of a few statistics of one ``[h, q, k]`` pattern, as stats.md defines them.

    ``positions``: also those measured along the token sequence (diagonal, mean distance), which an image model
    measures on its patch grid instead."""
    sink = (1 - pattern.sum(-1)).clamp(min=0)  # [h, q]: the weight a learned sink takes (0 up to rounding without one)
    queries = torch.arange(pattern.shape[1], dtype=pattern.dtype)
    keys = torch.arange(pattern.shape[2], dtype=pattern.dtype)
    distance = (queries[:, None] - keys[None, :]).abs()  # [q, k]
    logs = torch.where(pattern > 0, pattern.log(), torch.zeros_like(pattern))
    statistics = {
        # the whole softmax's entropy, keys and sink (stats.md)
        "entropy": (-(pattern * logs).sum(-1) - torch.where(sink > 0, sink * sink.log(), 0 * sink)).mean(-1),
        "sink_share": sink.mean(-1),
        "max_weight": pattern.amax(-1).mean(-1),
        "first_token": pattern[..., 0].mean(-1),
        "diagonal": pattern.diagonal(dim1=-2, dim2=-1).mean(-1) if pattern.shape[1] == pattern.shape[2] else None,
        "mean_distance": (pattern * distance).sum(-1).mean(-1),
    }
    return statistics if positions else {k: v for k, v in statistics.items() if k not in ("diagonal", "mean_distance")}


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost modules whose class is an attention block and that hold a projection, in model order."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if not _is_attention_block(type(module).__name__) or any(name.startswith(outer + ".") for outer, _ in found):
            continue
        if output_projection(module) is not None:
            found.append((name, module))
    return found


def _is_attention_block(class_name: str) -> bool:
    """``LlamaAttention``, ``BertAttention``, ``T5Attention``: not a whole layer (``MllamaSelfAttentionDecoderLayer``)."""
    named = "Attention" in class_name or class_name.endswith("MLA")  # LongCat-Flash: multi-head latent attention
    return named and not class_name.endswith(("Layer", "Block", "Model"))


#: the names attention blocks give their output projection (the last part of the submodule's name)
OUTPUT_NAMES = ("o_proj", "out_proj", "c_proj", "dense", "o", "wo", "out_lin", "proj", "out", "output_proj")


def output_projection(attention: nn.Module) -> nn.Module | None:
    """The block's output projection: the last linear map named like one (o_proj, out_proj, dense, …), else the last."""
    linear = [
        (name, m) for name, m in attention.named_modules() if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"
    ]
    named = [m for name, m in linear if name.rsplit(".", 1)[-1] in OUTPUT_NAMES]
    return named[-1] if named else (linear[-1][1] if linear else None)


def projection_columns(projection: nn.Module) -> torch.Tensor:
    """The projection's weight as ``[out, in]`` (GPT-2's Conv1D stores ``[in, out]``)."""
    weight = projection.weight
    return weight.t() if type(projection).__name__ == "Conv1D" else weight


@contextmanager
def recorded_values(model: nn.Module):
    """Yield a list that fills with ``(module, weights [b, h, q, k], value [b, kv_heads, k, d_v])`` per eager call."""
    calls: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []
    patched = []
    # the modules that define the blocks' classes, and the model's own (LongCat-Flash names its blocks "MLA")
    owners = {type(sub).__module__ for _, block in attention_modules(model) for sub in block.modules()}
    owners.add(type(model).__module__)
    for module_name in owners:
        namespace = sys.modules[module_name]
        original = getattr(namespace, "eager_attention_forward", None)
        if original is None:
            continue

        def wrapper(module, query, key, value, *args, _original=original, **kwargs):
            output, weights = _original(module, query, key, value, *args, **kwargs)
            calls.append((module, weights, value))
            return output, weights

        patched.append((namespace, original))
        namespace.eager_attention_forward = wrapper  # type: ignore[attr-defined]
    try:
        yield calls
    finally:
        for namespace, original in patched:
            namespace.eager_attention_forward = original  # type: ignore[attr-defined]


def norm_maps(model, inputs: dict, within: nn.Module | None = None) -> dict[str, list[torch.Tensor]]:
    """``{stack: [α_ij·‖W_O^h v_j‖ as [h, q, k] per layer]}`` of example 0, values from the eager function's input;
    ``within``: only the attention blocks inside that part of the model (a vision-language model's language model)."""
    names = {module: name for name, module in attention_modules(within or model)}
    with recorded_values(model) as calls, torch.no_grad():
        model(**inputs, use_cache=False)
    if not calls:
        raise LookupError("the family's modeling code has no eager_attention_forward to read values from")
    maps: dict[str, list[torch.Tensor]] = {}
    for module, weights, value in calls:
        owner = next((m for m in names if any(sub is module for sub in m.modules())), None)
        if owner is None and within is not None:
            continue  # a block outside the part asked for (the vision tower's)
        if owner is None:
            raise LookupError(f"no attention block holds {type(module).__name__}")
        weight = projection_columns(output_projection(owner))  # [hidden, h·d_v]
        heads, size = weights.shape[1], value.shape[-1]
        if weight.shape[1] != heads * size:
            raise LookupError(f"{heads} heads of {size} values do not make the {weight.shape[1]} projection inputs")
        value = value[0].float().repeat_interleave(heads // value.shape[1], dim=0)  # [h, k, d_v]
        blocks = weight.reshape(weight.shape[0], heads, size).permute(1, 0, 2)  # [h, hidden, d_v]
        norms = torch.einsum("hod,hkd->hko", blocks.detach().float(), value).norm(dim=-1)  # [h, k]
        stack = stack_of(names[owner], model.config.is_encoder_decoder, owner)
        maps.setdefault(stack, []).append(weights[0].float() * norms[:, None, :])
    return maps


#: families computing attention in their own eager code (no ``eager_attention_forward`` to read values from):
#: model type -> (the last part of the name of the module whose output holds the values, ``(output [k, width],
#: heads, head size) -> values [kv heads, k, d]``)
VALUE_READERS = {
    **dict.fromkeys(
        ("gpt_neo", "mpnet", "deberta-v2"),
        ("v", lambda out, heads, size: out.view(out.shape[0], heads, size).transpose(0, 1)),
    ),
    # BLOOM's fused projection: per head its query, key and value, in that order
    "bloom": (
        "query_key_value",
        lambda out, heads, size: out.view(out.shape[0], heads, 3, size)[:, :, 2].transpose(0, 1),
    ),
    # Falcon with one key/value head (multi_query): every query head's query, then the key, then the value
    "falcon": ("query_key_value", lambda out, heads, size: out[:, (heads + 1) * size :][None]),
}
#: the names of the value projections VALUE_READERS reads (``v`` stands for all of these)
VALUE_NAMES = ("v_proj", "v", "value_proj")


def eager_code_norm_maps(model, inputs: dict, model_type: str) -> dict[str, list[torch.Tensor]]:
    """:func:`norm_maps` of a family in :data:`VALUE_READERS`: the weights from ``output_attentions``, the values
    read by a forward hook on the module that computes them."""
    name, values_of = VALUE_READERS[model_type]
    names = VALUE_NAMES if name == "v" else (name,)
    blocks = attention_modules(model)
    readers = [next(m for n, m in block.named_modules() if n.rsplit(".", 1)[-1] in names) for _, block in blocks]
    outputs: dict[int, torch.Tensor] = {}
    hooks = [
        r.register_forward_hook(lambda _, __, out, i=i: outputs.__setitem__(i, out[0])) for i, r in enumerate(readers)
    ]
    with torch.no_grad():
        weights = model(**inputs, use_cache=False, output_attentions=True).attentions
    for hook in hooks:
        hook.remove()
    maps = []
    for index, (_, block) in enumerate(blocks):
        alpha = weights[index][0].float()  # [h, q, k]
        heads = alpha.shape[0]
        weight = projection_columns(output_projection(block)).detach().float()  # [hidden, h·d]
        size = weight.shape[1] // heads
        value = values_of(outputs[index].float(), heads, size)  # [kv heads, k, d]
        value = value.repeat_interleave(heads // value.shape[0], dim=0)  # [h, k, d]
        blocks_o = weight.reshape(weight.shape[0], heads, size).permute(1, 0, 2)  # [h, hidden, d]
        norms = torch.einsum("hod,hkd->hko", blocks_o, value).norm(dim=-1)  # [h, k]
        maps.append(alpha * norms[:, None, :])
    return {"self": maps}


def run_blocks(model, ids: torch.Tensor, extra: dict, within: nn.Module | None = None) -> list[tuple[str, nn.Module]]:
    """The attention blocks (inside ``within``, by default anywhere) that compute softmax attention in one run, in
    model order.

    Blocks that call the family's eager attention function where it has one (a hybrid's linear-attention blocks are
    named "Attention" too), else every attention block the run calls (a decoder-only class of an encoder-decoder
    family has idle cross-attention blocks).
    """
    called: set[int] = set()
    blocks = attention_modules(within or model)
    handles = [block.register_forward_pre_hook(lambda m, a: called.add(id(m))) for _, block in blocks]
    with recorded_values(model) as calls, torch.no_grad():
        model(input_ids=ids, use_cache=False, **extra)
    for handle in handles:
        handle.remove()
    if calls:
        attending = {id(m) for module, _, _ in calls for m in [module]}
        return [(n, b) for n, b in blocks if any(id(sub) in attending for sub in b.modules())]
    return [(name, block) for name, block in blocks if id(block) in called]


def head_inputs(model, ids: torch.Tensor, blocks, extra: dict) -> tuple[list[tuple[int, torch.Tensor]], torch.Tensor]:
    """Each output-projection call of one run in order, as ``(block number, input [q, h·d])``, and the logits.

    A block applied several times (ALBERT's shared layer, a looped model) has one entry per application.
    """
    seen: list[tuple[int, torch.Tensor]] = []
    handles = [
        output_projection(block).register_forward_pre_hook(
            lambda m, args, number=number: seen.append((number, args[0][0].clone()))
        )
        for number, (_, block) in enumerate(blocks)
    ]
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False, **extra).logits[0]
    for handle in handles:
        handle.remove()
    return seen, logits


def patched_logits(model, ids, block, application: int, head: int, heads: int, values, extra: dict) -> torch.Tensor:
    """Logits ``[q, vocab]`` with one head's columns of ``block``'s output-projection input replaced by ``values``
    in its ``application``-th call."""
    calls = [0]

    def replace(module, args):
        calls[0] += 1
        if calls[0] - 1 != application:
            return None
        merged = args[0].clone()
        size = merged.shape[-1] // heads
        merged[0, :, head * size : (head + 1) * size] = values[:, head * size : (head + 1) * size]
        return (merged, *args[1:])

    handle = output_projection(block).register_forward_pre_hook(replace)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False, **extra).logits[0]
    handle.remove()
    return logits
