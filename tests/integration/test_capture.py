"""The capture object: trimming, save/load round trip, file format, and padding invariance."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from attnviz.captures.attention_capture import AttentionCapture, capture, capture_batch
from attnviz.common.errors import CaptureFileError, InputError
from attnviz.models.hf import load_hf_model


def test_capture_of_one_sentence_equals_its_capture_inside_a_padded_batch(minilm):
    alone = capture(minilm, "Short one.")
    batched = capture_batch(minilm, ["The cat sat on the mat because it was tired.", "Short one."])[1]
    assert alone.tokens == batched.tokens == ["[CLS]", "short", "one", ".", "[SEP]"]
    # the same sentence padded to another length runs through matrix products of other shapes, whose float32
    # rounding differs by an ulp or two (up to 1.1e-6 on AVX-512 machines): equal to that rounding
    for layer in range(6):
        torch.testing.assert_close(alone.layer(layer), batched.layer(layer), atol=2e-6, rtol=0)


def test_capture_metadata_and_axes(minilm):
    result = capture(minilm, "The cat sat on the mat.")
    assert result.stacks == ["self"]
    assert result.stacked().shape == (6, 12, len(result.tokens), len(result.tokens))
    assert result.special[0] and result.special[-1] and not any(result.special[1:-1])
    assert result.word_ids[0] is None and result.word_ids[1] == 0
    assert not result.causal


def test_save_load_round_trip_and_documented_format(minilm, tmp_path):
    result = capture(minilm, "The cat sat on the mat.")
    path = result.save(tmp_path / "cat.safetensors")
    with safe_open(str(path), framework="pt") as handle:
        assert sorted(handle.keys()) == [f"self.{i}" for i in range(6)]
        metadata = handle.metadata()
        assert handle.get_tensor("self.0").dtype == torch.float32
        assert handle.get_tensor("self.0").shape == (12, 9, 9)  # [CLS] the cat sat on the mat . [SEP]
    assert metadata["model"] == "minilm"
    assert json.loads(metadata["tokens"]) == result.tokens
    assert metadata["causal"] == "false"
    loaded = AttentionCapture.load(path)
    assert loaded.tokens == result.tokens and loaded.word_ids == result.word_ids
    for layer in range(6):
        assert torch.equal(loaded.layer(layer), result.layer(layer))


def test_encoder_decoder_capture_names_three_stacks(tiny_model_dirs, tmp_path):
    bart = load_hf_model(str(tiny_model_dirs["bart"]), name="bart")
    result = capture(bart, "The cat sat.", target="Le chat.")
    assert result.stacks == ["encoder", "decoder", "cross"]
    n_source, n_target = len(result.tokens), len(result.target_tokens)
    assert result.layer(0, "cross").shape == (4, n_target, n_source)
    assert result.layer(0, "decoder").shape == (4, n_target, n_target)
    path = result.save(tmp_path / "bart.safetensors")
    with safe_open(str(path), framework="pt") as handle:
        assert sorted(handle.keys()) == [f"{s}.{i}" for s in ("cross", "decoder", "encoder") for i in range(2)]
    again = AttentionCapture.load(path)
    assert again.target_tokens == result.target_tokens
    assert torch.equal(again.layer(1, "cross"), result.layer(1, "cross"))


def test_causal_capture_has_no_weight_on_future(tiny_model_dirs):
    llama = load_hf_model(str(tiny_model_dirs["llama"]), name="llama")
    result = capture(llama, "The cat sat on the mat.")
    assert result.causal
    n = len(result.tokens)
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    assert result.layer(0)[:, future].sum() == 0


def test_bad_capture_files(tmp_path):
    with pytest.raises(CaptureFileError, match="does not exist"):
        AttentionCapture.load(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(CaptureFileError, match="not a readable"):
        AttentionCapture.load(junk)


def test_layer_out_of_range(minilm):
    result = capture(minilm, "Hello there.")
    with pytest.raises(InputError, match="out of range"):
        result.layer(6)
    assert torch.equal(result.layer(-1), result.layer(5))
