"""The residual stream's readers in Hugging Face models (:mod:`attnviz.models.readers`).

The attention sites and their weight layouts are those :mod:`attnviz.models.physical` finds; the layer is the
module that holds the attention module, and its norms and MLP are found by the attribute names of the two
pre-norm layouts transformers uses: LLaMA-style (``input_layernorm``, ``post_attention_layernorm``, ``mlp``:
LLaMA, Mistral, Qwen2/3, SmolLM2, …) and GPT-2-style (``ln_1``, ``ln_2``, ``mlp``). BERT-style layers are post-norm
(the stream is normalised after each sum), so no head writes into a stream that later heads read as a sum:
they are refused, as is every layout the probe check of :func:`~attnviz.models.readers.check_residual_sum` rejects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from attnviz.common.errors import UnsupportedModelError
from attnviz.models.hf_patching import check_hf_patching
from attnviz.models.physical import AttentionBlock, find_attention_blocks
from attnviz.models.readers import LayerReaders, Projection, ResidualReaders, check_residual_sum
from attnviz.models.readout import FINAL_NORM_NAMES

if TYPE_CHECKING:
    from attnviz.models.hf import HFModel

#: per weight layout: (the attention's input norm, the MLP's input norm, the MLP) attribute names on the layer
_LAYER_NAMES = {"llama": ("input_layernorm", "post_attention_layernorm", "mlp"), "gpt2": ("ln_1", "ln_2", "mlp")}


def hf_residual_readers(loaded: HFModel) -> ResidualReaders:
    """Every layer's readers of a pre-norm decoder (see the module docstring)."""
    check_hf_patching(loaded)
    if loaded.encoder_decoder:
        raise UnsupportedModelError(
            f"{loaded.name} is an encoder-decoder model ({loaded.model.config.model_type}): attnviz finds circuits in "
            "one residual stream, that of a pre-norm decoder such as SmolLM2, LLaMA, Qwen2 or GPT-2"
        )
    base = loaded.model.base_model
    final_norm = next(
        (getattr(base, name) for name in FINAL_NORM_NAMES if isinstance(getattr(base, name, None), nn.Module)), None
    )
    if final_norm is None:
        raise UnsupportedModelError(
            f"{loaded.name} has no final norm attnviz knows ({', '.join(FINAL_NORM_NAMES)}) between its last layer and "
            "its logits, so attnviz cannot split its residual stream into edges; use a pre-norm decoder such as "
            "SmolLM2, LLaMA, Qwen2 or GPT-2"
        )
    names = {module: name for name, module in loaded.model.named_modules()}
    try:
        blocks = find_attention_blocks(loaded)
    except UnsupportedModelError as error:
        raise UnsupportedModelError(
            f"{loaded.name}: attnviz cannot find each head's query, key and value projections in this model's "
            "attention, so it cannot find circuits in it; supported layouts are LLaMA-style (q_proj/k_proj/v_proj/"
            "o_proj) and GPT-2-style (c_attn/c_proj) pre-norm decoders"
        ) from error
    layers = []
    for site, block in blocks.items():
        if block.family not in _LAYER_NAMES:
            raise UnsupportedModelError(
                f"{loaded.name} has post-norm layers ({type(block.module).__name__}): its residual stream is "
                "normalised after every sum, so it is not a sum of head and MLP outputs that later heads read, and "
                "attnviz cannot find circuits in it; use a pre-norm decoder such as SmolLM2, LLaMA, Qwen2 or GPT-2"
            )
        attention_name = names.get(block.module, "")
        layer = loaded.model.get_submodule(attention_name.rpartition(".")[0])
        norm_name, mlp_norm_name, mlp_name = _LAYER_NAMES[block.family]
        parts = [getattr(layer, name, None) for name in (norm_name, mlp_norm_name, mlp_name)]
        if not all(isinstance(part, nn.Module) for part in parts):
            raise UnsupportedModelError(
                f"{loaded.name}: the layer holding {attention_name} has no {norm_name}, {mlp_norm_name} and "
                f"{mlp_name}, so attnviz cannot find what reads its residual stream"
            )
        norm, mlp_norm, mlp = parts
        assert norm is not None  # every part is a module (checked above)
        layers.append(LayerReaders(site, layer, norm, _projections(block), mlp_norm, mlp))
    return check_residual_sum(loaded, ResidualReaders(tuple(layers), final_norm))


def _projections(block: AttentionBlock) -> tuple[Projection, ...]:
    module: Any = block.module
    d, heads, kv_heads = block.head_dim, block.num_heads, block.num_kv_heads
    queries = tuple(("q", h) for h in range(heads))
    keys, values = (tuple((kind, h) for h in range(kv_heads)) for kind in ("k", "v"))
    if block.family == "gpt2":  # one Conv1D, weight [in, out], output columns [q | k | v]
        fused = module.c_attn
        bias = fused.bias.detach() if fused.bias is not None else None
        return (Projection(fused, fused.weight.detach().t(), bias, d, queries + keys + values),)  # type: ignore[arg-type]
    found = []
    for name, readers in (("q_proj", queries), ("k_proj", keys), ("v_proj", values)):
        linear = getattr(module, name)
        bias = linear.bias.detach() if linear.bias is not None else None
        found.append(Projection(linear, linear.weight.detach(), bias, d, readers))  # type: ignore[arg-type]
    return tuple(found)
