"""Attention during generation: step-by-step rows with the key/value cache equal one forward pass;
the text equals ``model.generate`` with the same settings."""

from __future__ import annotations

import pytest
import torch

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.captures.generation import _word_ids_of_new_tokens, generate_capture
from attnviz.common.errors import InputError, UnsupportedModelError
from attnviz.core.recorder import PatternRecorder
from attnviz.models.hf import load_hf_model

PROMPT = "The cat sat on the mat."
# model.generate applies rules from the generation config that attnviz's plain decoding leaves out
PLAIN = {"top_k": None, "top_p": None, "forced_eos_token_id": None, "forced_bos_token_id": None}
PLAIN |= {"no_repeat_ngram_size": 0, "repetition_penalty": 1.0, "min_length": 0}


@pytest.fixture(scope="module")
def tiny(tiny_model_dirs):
    return {
        family: load_hf_model(str(tiny_model_dirs[family]), name=family) for family in ("gpt2", "llama", "bart", "t5")
    }


def _one_forward(loaded, generation) -> dict:
    """Patterns of one forward pass, without cache, over prompt + generated tokens: ``{site: [h, q, k]}``."""
    recorder = PatternRecorder()
    batch = loaded.encode([PROMPT])
    with torch.no_grad():
        if loaded.encoder_decoder:
            decoder_ids = torch.tensor([[loaded.model.config.decoder_start_token_id, *generation.token_ids]])
            loaded.model(
                input_ids=batch.inputs["input_ids"],
                decoder_input_ids=decoder_ids,
                use_cache=False,
                attnviz_context=loaded.context([recorder]),
            )
        else:
            ids = torch.cat([batch.inputs["input_ids"], torch.tensor([generation.token_ids])], dim=1)  # [1, n + new]
            loaded.model(input_ids=ids, use_cache=False, attnviz_context=loaded.context([recorder]))
    return {site: pattern[0] for site, pattern in recorder.patterns.items()}


def _reference_ids(loaded, **settings) -> list[int]:
    batch = loaded.encode([PROMPT])
    output = loaded.model.generate(
        batch.inputs["input_ids"], attention_mask=batch.inputs["attention_mask"], **settings, **PLAIN
    )
    start = 1 if loaded.encoder_decoder else batch.inputs["input_ids"].shape[1]  # decoder start / the prompt
    return output[0, start:].tolist()


@pytest.mark.parametrize("family", ["gpt2", "llama", "bart", "t5"])
@pytest.mark.parametrize("sample", [False, True])
def test_cached_step_rows_equal_one_forward_and_text_equals_model_generate(tiny, family, sample, one_torch_thread):
    loaded = tiny[family]
    settings = {"sample": sample, "temperature": 0.7, "seed": 3} if sample else {}
    generation = generate_capture(loaded, PROMPT, max_new_tokens=6, **settings)
    capture = generation.capture
    # the text equals model.generate with the same settings (same seed for sampling)
    if sample:
        torch.manual_seed(3)
        reference = _reference_ids(loaded, do_sample=True, temperature=0.7, max_new_tokens=6)
    else:
        reference = _reference_ids(loaded, do_sample=False, max_new_tokens=6)
    assert generation.token_ids == reference[: len(generation.token_ids)]
    assert len(generation.token_ids) == 6 or generation.token_ids[-1] == loaded.model.generation_config.eos_token_id
    # every row, prompt and generated, equals the one-pass pattern
    single = _one_forward(loaded, generation)
    captured = {(stack, layer) for stack in capture.stacks for layer in range(capture.num_layers(stack))}
    assert captured == {(site.stack, site.layer) for site in single}
    for site, expected in single.items():
        got = capture.layer(site.layer, site.stack)  # [h, q, k]
        assert got.shape == expected.shape
        assert float((got - expected).abs().max()) <= 1e-5, site
    if loaded.encoder_decoder:
        assert capture.generated_from == 1
        assert len(capture.target_tokens) == 1 + len(generation.token_ids)
        assert capture.stacks == ["encoder", "decoder", "cross"]
    else:
        prompt_len = len(loaded.encode([PROMPT]).tokens[0])
        assert capture.generated_from == prompt_len
        assert len(capture.tokens) == prompt_len + len(generation.token_ids)
        assert capture.causal


def test_llama_grouped_query_capture_has_every_query_head_and_a_zero_future(tiny):
    capture = generate_capture(tiny["llama"], PROMPT, max_new_tokens=4).capture
    pattern = capture.layer(1)  # [8 query heads over 2 key/value heads, q, k]
    assert pattern.shape[0] == 8
    torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:2]), atol=1e-5, rtol=0)
    assert float(pattern.triu(diagonal=1).abs().max()) == 0.0


def test_generated_from_survives_save_and_load(tiny, tmp_path):
    capture = generate_capture(tiny["gpt2"], PROMPT, max_new_tokens=3, sample=True, seed=1).capture
    again = AttentionCapture.load(capture.save(tmp_path / "g.safetensors", bits=8))
    assert again.generated_from == capture.generated_from
    assert again.tokens == capture.tokens


def test_word_ids_of_generated_tokens_follow_the_tokenizer_markers():
    assert _word_ids_of_new_tokens(["Ġthe", "Ġca", "t", "<eos>"], [False, False, False, True], 4) == [5, 6, 6, None]
    assert _word_ids_of_new_tokens(["play", "##ing", "."], [False] * 3, None) == [0, 0, 1]


def test_refusals(tiny, minilm):
    with pytest.raises(UnsupportedModelError, match="language-model head"):
        generate_capture(minilm, PROMPT, max_new_tokens=2)
    with pytest.raises(InputError, match="at least 1"):
        generate_capture(tiny["gpt2"], PROMPT, max_new_tokens=0)
    with pytest.raises(InputError, match="temperature"):
        generate_capture(tiny["gpt2"], PROMPT, max_new_tokens=2, sample=True, temperature=0)
    with pytest.raises(InputError, match="positions"):
        generate_capture(tiny["gpt2"], PROMPT, max_new_tokens=tiny["gpt2"].max_length)
