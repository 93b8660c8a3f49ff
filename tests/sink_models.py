"""Tiny seeded models with attention sinks (gpt-oss, granite with sliding window) or a value head size of its own
(multi-head latent attention: DeepSeek-V2/V3), saved as directories with MiniLM's tokenizer.

Weights are drawn ten times wider than the configs' default (initializer range 0.2) and every learned sink from
N(0, 2²), so heads focus and each row gives its sink a weight far from 0 and 1: a sink left out, or a value size
taken from the queries, shows as a wrong number rather than rounding.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_models import SPECIAL_TOKENS, VOCAB

#: families whose attention takes learned sinks (transformers' ``s_aux``)
SINK_FAMILIES = ("gpt_oss", "granite_swa")
#: families whose value head size differs from the query/key head size
LATENT_FAMILIES = ("deepseek_v2", "deepseek_v3")
#: the spread of the sink logits
SINK_STD = 2.0


def sink_model_config(family: str):
    import transformers

    common = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
        "initializer_range": 0.2,
        "pad_token_id": 0,
        **SPECIAL_TOKENS,
    }
    # layer 0 slides over 4 keys, layer 1 sees them all
    windowed = {"num_key_value_heads": 2, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}
    latent = {
        "num_key_value_heads": 4,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,
        "v_head_dim": 12,  # queries and keys 16 wide, values 12
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "n_shared_experts": 1,
    }
    if family == "gpt_oss":
        return transformers.GptOssConfig(**common, **windowed, head_dim=16, num_local_experts=4, num_experts_per_tok=2)
    if family == "granite_swa":
        return transformers.GraniteSWAConfig(**common, **windowed)
    if family == "deepseek_v2":
        return transformers.DeepseekV2Config(**common, **latent, q_lora_rank=None)
    if family == "deepseek_v3":
        return transformers.DeepseekV3Config(**common, **latent, q_lora_rank=24, n_group=1, topk_group=1)
    raise ValueError(f"no tiny {family!r} model; choose one of {SINK_FAMILIES + LATENT_FAMILIES}")


def build_sink_model(family: str, path: Path) -> Path:
    """Save a seeded tiny ``family`` causal LM with MiniLM's tokenizer into ``path`` and return ``path``."""
    import transformers

    from attnviz.models.specs import minilm_path

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(sink_model_config(family), attn_implementation="eager")
    with torch.no_grad():
        for module in model.modules():
            if isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
                module.sinks.normal_(0.0, SINK_STD)
    model.save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(path)
    return path
