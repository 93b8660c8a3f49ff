"""Model specs: short names, directories, GGUF files (converted once and cached), and clear errors."""

from __future__ import annotations

import time

import pytest
import torch

from attnviz.captures.attention_capture import capture
from attnviz.common.errors import InputError, ModelSpecError
from attnviz.core import AttentionSite
from attnviz.models.specs import load_model, resolve_dtype, smollm2_path


def test_directory_spec_loads_tiny_models(tiny_model_dirs):
    loaded = load_model(str(tiny_model_dirs["gpt2"]), device="cpu")
    assert loaded.causal and not loaded.encoder_decoder
    assert loaded.max_length == 128
    assert loaded.num_layers() == 2 and loaded.num_heads() == 4
    bart = load_model(str(tiny_model_dirs["bart"]))
    assert bart.encoder_decoder and bart.stacks() == ("encoder", "decoder", "cross")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no/such/path/anywhere", "does not exist"),
        ("missing.gguf", "does not exist"),
        ("definitely-not-a-cached-model-xyz", "unknown model"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(ModelSpecError, match=message):
        load_model(spec)


def test_directory_that_is_not_a_model(tmp_path):
    with pytest.raises(ModelSpecError, match="not a model"):
        load_model(str(tmp_path))


def test_dtype_and_device_options():
    assert resolve_dtype("bf16") is torch.bfloat16
    with pytest.raises(InputError, match="unknown dtype"):
        resolve_dtype("int3")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="no CUDA GPU"):
            load_model("minilm", device="cuda")


@pytest.mark.slow
def test_smollm2_gguf_loads_causal_gqa_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    assert smollm2_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    started = time.perf_counter()
    loaded = load_model("smollm2", device="cpu")
    first = time.perf_counter() - started
    assert loaded.causal
    assert loaded.layout() == {AttentionSite("self", i): 9 for i in range(30)}
    assert loaded.model.config.num_key_value_heads == 3
    result = capture(loaded, "The capital of France is Paris.")
    n = len(result.tokens)
    assert result.layer(10)[:, torch.ones(n, n, dtype=torch.bool).triu(1)].sum() == 0
    torch.testing.assert_close(result.layer(10).sum(-1), torch.ones(9, n), atol=1e-5, rtol=0)

    # The converted weights are cached: a second load skips de-quantisation and gives the same model.
    started = time.perf_counter()
    again = load_model("smollm2", device="cpu")
    second = time.perf_counter() - started
    assert second < first
    batch = loaded.encode(["The capital of France is"])
    with torch.no_grad():
        logits_a = loaded.forward(batch, logits=True).logits
        logits_b = again.forward(batch, logits=True).logits
    assert torch.equal(logits_a, logits_b)
    assert loaded.tokenizer.decode([int(logits_a[0, -1].argmax())]).strip() == "Paris"
