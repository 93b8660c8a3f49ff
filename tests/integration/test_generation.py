"""Attention during generation (``attnviz.generate``): step-by-step rows with the key/value cache equal one forward
pass and a teacher-forced ``attnviz.capture`` of what was written; the text equals ``model.generate`` with the same
settings. The captioner, Whisper and vision-language paths are tested with their models (test_caption.py,
test_audio.py, test_vision_language.py); the old names of the call warn here."""

from __future__ import annotations

import re

import pytest
import torch

import attnviz
from attnviz.captures.attention_capture import AttentionCapture
from attnviz.captures.generation import Generation
from attnviz.common.errors import AttnvizError, InputError, UnsupportedModelError
from attnviz.common.tokens import word_ids_from_markers
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
    generation = attnviz.generate(loaded, PROMPT, max_new_tokens=6, **settings)
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
    capture = attnviz.generate(tiny["llama"], PROMPT, max_new_tokens=4).capture
    pattern = capture.layer(1)  # [8 query heads over 2 key/value heads, q, k]
    assert pattern.shape[0] == 8
    torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:2]), atol=1e-5, rtol=0)
    assert float(pattern.triu(diagonal=1).abs().max()) == 0.0


def test_what_a_model_wrote_shows_inline_as_its_capture(tiny, one_torch_thread):
    """A notebook shows a Generation as the page of its capture (prompt and written tokens, every layer)."""
    written = attnviz.generate(tiny["gpt2"], PROMPT, max_new_tokens=3)
    assert attnviz.show(written).html == attnviz.show(written.capture).html
    assert written._repr_html_() == attnviz.show(written.capture)._repr_html_()
    assert repr(written) == f"Generation(text={written.text!r})"  # the short repr: no tensors printed


def test_generated_from_survives_save_and_load(tiny, tmp_path):
    capture = attnviz.generate(tiny["gpt2"], PROMPT, max_new_tokens=3, sample=True, seed=1).capture
    again = AttentionCapture.load(capture.save(tmp_path / "g.safetensors", bits=8))
    assert again.generated_from == capture.generated_from
    assert again.tokens == capture.tokens


def test_word_ids_of_generated_tokens_follow_the_tokenizer_markers():
    assert word_ids_from_markers(["Ġthe", "Ġca", "t", "<eos>"], [False, False, False, True], 4) == [5, 6, 6, None]
    assert word_ids_from_markers(["play", "##ing", "."], [False] * 3, None) == [0, 0, 1]


def test_refusals(tiny, minilm):
    with pytest.raises(UnsupportedModelError, match="language-model head"):
        attnviz.generate(minilm, PROMPT, max_new_tokens=2)
    with pytest.raises(InputError, match="at least 1"):
        attnviz.generate(tiny["gpt2"], PROMPT, max_new_tokens=0)
    with pytest.raises(InputError, match="temperature"):
        attnviz.generate(tiny["gpt2"], PROMPT, max_new_tokens=2, sample=True, temperature=0)
    with pytest.raises(InputError, match="positions"):
        attnviz.generate(tiny["gpt2"], PROMPT, max_new_tokens=tiny["gpt2"].max_length)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_written_tokens_equal_a_teacher_forced_capture_of_prompt_and_text(tiny, family, one_torch_thread):
    loaded = tiny[family]
    written = attnviz.generate(loaded, PROMPT, max_new_tokens=5)
    assert isinstance(written, Generation) and written.text == loaded.tokenizer.decode(written.token_ids)
    # the same tokens read in one pass: the MiniLM tokenizer ends the prompt with [SEP] (and the text too: a causal
    # model's rows before that last token do not see it)
    forced = attnviz.capture(loaded, f"{PROMPT} [SEP] {written.text}")
    n = written.capture.generated_from + 5
    assert forced.tokens[:n] == written.capture.tokens and len(forced.tokens) == n + 1
    for layer in range(forced.num_layers()):
        got, expected = written.capture.layer(layer), forced.layer(layer)[:, :n, :n]  # [h, q, k]
        assert got.shape == expected.shape and float(expected.max()) > 0.1
        assert float((got - expected).abs().max()) <= 1e-5, layer
    # layers and heads keep only those, numbered as the model's
    one = attnviz.generate(loaded, PROMPT, max_new_tokens=5, layers=[-1], heads=[1])
    assert one.token_ids == written.token_ids and one.capture.recorded_layers() == [forced.num_layers() - 1]
    assert torch.equal(one.capture.layer(-1)[0], written.capture.layer(-1)[1])


def test_encoder_decoder_writes_its_target_as_a_teacher_forced_capture_reads_it(tiny, one_torch_thread):
    loaded = tiny["bart"]
    written = attnviz.generate(loaded, PROMPT, max_new_tokens=4)
    ids = [loaded.model.config.decoder_start_token_id, *written.token_ids]
    assert written.capture.target_tokens == loaded.tokenizer.convert_ids_to_tokens(ids)
    for stack in ("encoder", "decoder", "cross"):
        assert written.capture.stacked(stack).sum(-1).min() > 0.99  # every row written, each a distribution


def test_bad_combinations_are_one_clear_error(tiny, minilm, one_torch_thread):
    from PIL import Image

    picture = Image.new("RGB", (8, 8), "red")
    gpt2 = tiny["gpt2"]
    cases = [
        (lambda: attnviz.generate(gpt2, PROMPT, image=picture, max_new_tokens=2), "vision-language model"),
        (lambda: attnviz.generate(gpt2, PROMPT, max_new_tokens=0), "at least 1"),
        (lambda: attnviz.generate(gpt2, PROMPT, max_new_tokens=-3), "at least 1"),
        (lambda: attnviz.generate(gpt2, picture, max_new_tokens=2), "image captioner"),
        (lambda: attnviz.generate(gpt2, [PROMPT, PROMPT], max_new_tokens=2), "one input at a time"),
        (lambda: attnviz.generate(gpt2, PROMPT, max_new_tokens=2, all_frames=True), "applies to audio"),
        (lambda: attnviz.generate(minilm, PROMPT, max_new_tokens=2), "language-model head"),
    ]
    for call, message in cases:
        with pytest.raises(AttnvizError, match=message):
            call()


def test_the_old_names_still_work_with_a_warning(tiny, one_torch_thread):
    import importlib

    from PIL import Image

    new = attnviz.generate(tiny["gpt2"], PROMPT, max_new_tokens=3)
    for module, name, instead in [
        ("attnviz.captures.generation", "generate_capture", "attnviz.generate(model, prompt"),
        ("attnviz.captures.audio", "transcribe_capture", "attnviz.generate(model, audio"),
        ("attnviz.captures.captioning", "caption_capture", "attnviz.generate(model, image"),
    ]:
        with pytest.deprecated_call(match=rf"{module}.{name} is deprecated .*use {re.escape(instead)}"):
            old = getattr(importlib.import_module(module), name)
        if name == "generate_capture":
            assert old(tiny["gpt2"], PROMPT, max_new_tokens=3).token_ids == new.token_ids
        if name == "caption_capture":  # the given caption (teacher-forced) or the one it writes, as the new calls
            toy, image = attnviz.load_model("toy-caption", device="cpu"), Image.new("RGB", (32, 32), "red")
            written = attnviz.generate(toy, image, max_new_tokens=3)
            assert old(toy, image, max_new_tokens=3).token_ids == written.token_ids
            forced = attnviz.capture(toy, image, target="red")
            assert torch.equal(old(toy, image, target="red").stacked("cross"), forced.stacked("cross"))
    with pytest.deprecated_call(match=r"attnviz.caption_capture is deprecated .*attnviz.generate\(model, image"):
        attnviz.caption_capture  # noqa: B018
    with pytest.deprecated_call(match="generate_capture"):
        from attnviz.captures.generation import generate_capture  # noqa: F401
