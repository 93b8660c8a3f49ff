"""The attention core against transformers' own eager attention, and against hand computations."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from attnviz.captures.attention_capture import PatternRecorder
from attnviz.core import AttentionContext, AttentionSite, HeadMask, attend
from attnviz.core import attention as core_attention
from attnviz.models.hf import load_hf_model

SENTENCES = ["The cat sat on the mat because it was tired.", "Short one."]
TARGETS = ["Le chat dormait.", "Court."]


def eager_reference(path, batch, encoder_decoder):
    """transformers' eager attention with output_attentions: ``{site: [b, h, q, k]}`` and the output."""
    config = transformers.AutoConfig.from_pretrained(path)
    cls = getattr(transformers, config.architectures[0])
    model = cls.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(**batch.inputs, output_attentions=True, use_cache=False)
    groups = (
        [("encoder", out.encoder_attentions), ("decoder", out.decoder_attentions), ("cross", out.cross_attentions)]
        if encoder_decoder
        else [("self", out.attentions)]
    )
    patterns = {AttentionSite(stack, i): a for stack, layers in groups for i, a in enumerate(layers)}
    return patterns, out


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama", "bart", "t5"])
def test_patterns_and_outputs_match_eager(family, tiny_model_dirs):
    loaded = load_hf_model(str(tiny_model_dirs[family]), name=family)
    assert loaded.model.config._attn_implementation == "attnviz"
    targets = TARGETS if loaded.encoder_decoder else None
    batch = loaded.encode(SENTENCES, targets=targets)
    reference, ref_out = eager_reference(tiny_model_dirs[family], batch, loaded.encoder_decoder)

    recorder = PatternRecorder()
    with torch.no_grad():
        captured_out = loaded.forward(batch, loaded.context([recorder]), logits=True)
        plain_out = loaded.forward(batch, None, logits=True)
    # capture does not change the model's outputs at all
    assert torch.equal(
        captured_out.logits if hasattr(captured_out, "logits") else captured_out.last_hidden_state,
        plain_out.logits if hasattr(plain_out, "logits") else plain_out.last_hidden_state,
    )
    ref = ref_out.logits if hasattr(ref_out, "logits") else ref_out.last_hidden_state
    mine = captured_out.logits if hasattr(captured_out, "logits") else captured_out.last_hidden_state
    assert (ref - mine).abs().max() <= 1e-5

    patterns = recorder.patterns
    assert set(patterns) == set(reference)
    for site, expected in reference.items():
        query_lengths, key_lengths = batch.query_key_lengths(site.stack)
        for i in range(len(SENTENCES)):
            q, k = query_lengths[i], key_lengths[i]
            got = patterns[site][i, :, :q, :k]
            assert (got - expected[i, :, :q, :k]).abs().max() <= 1e-6, (family, site)
            # no weight on padding keys
            assert patterns[site][i, :, :q, k:].abs().sum() == 0.0
            if loaded.causal or site.stack == "decoder":
                future = torch.ones(q, k, dtype=torch.bool).triu(1)
                assert got[:, future].abs().sum() == 0.0, "weight on future keys"
            torch.testing.assert_close(got.sum(-1), torch.ones(got.shape[:-1]), atol=1e-5, rtol=0)


def test_gqa_heads_count_query_heads(tiny_model_dirs):
    loaded = load_hf_model(str(tiny_model_dirs["llama"]), name="llama")
    assert loaded.causal
    assert loaded.layout() == {AttentionSite("self", 0): 8, AttentionSite("self", 1): 8}


def test_real_minilm_matches_eager(minilm, minilm_dir):
    batch = minilm.encode(SENTENCES)
    reference, ref_out = eager_reference(minilm_dir, batch, False)
    recorder = PatternRecorder()
    with torch.no_grad():
        out = minilm.forward(batch, minilm.context([recorder]))
    assert (out.last_hidden_state - ref_out.last_hidden_state).abs().max() <= 1e-5
    assert len(recorder.patterns) == 6
    for site, expected in reference.items():
        for i, n in enumerate(batch.lengths):
            got = recorder.patterns[site][i, :, :n, :n]
            assert got.shape[0] == 12
            assert (got - expected[i, :, :n, :n]).abs().max() <= 1e-6


def test_unregistered_family_falls_back_to_eager(tiny_model_dirs):
    from attnviz.common.progress import AttnvizWarning

    # the library prints nothing: the notice is a Python warning unless a reporter is installed
    with pytest.warns(AttnvizWarning, match="eager"):
        loaded = load_hf_model(str(tiny_model_dirs["gpt_neo"]), name="gpt_neo")
    assert loaded.fallback
    batch = loaded.encode(SENTENCES)
    recorder = PatternRecorder()
    with torch.no_grad():
        loaded.forward(batch, loaded.context([recorder]))
    assert len(recorder.patterns) == 2
    n = batch.lengths[1]
    assert recorder.patterns[AttentionSite("self", 0)][1, :, :n, n:].abs().max() == 0  # padding keys


def hand_attention(q, k, v, mask=None):
    """Attention written out per head with Python floats' reference: softmax(qkᵀ/√d + mask) v."""
    d = q.shape[-1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    if mask is not None:
        scores = scores + mask
    pattern = torch.softmax(scores, dim=-1)
    return pattern, pattern @ v


def test_attend_matches_hand_computation_with_gqa_mask_and_blocks(monkeypatch):
    torch.manual_seed(1)
    q = torch.randn(2, 4, 5, 8)
    k = torch.randn(2, 2, 5, 8)
    v = torch.randn(2, 2, 5, 8)
    mask = torch.zeros(2, 1, 5, 5)
    mask[1, :, :, 3:] = torch.finfo(torch.float32).min  # padding keys of example 1
    k_full, v_full = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    expected_pattern, expected_out = hand_attention(q, k_full, v_full, mask)

    recorder = PatternRecorder()
    site = AttentionSite("self", 0)
    out = attend(q, k, v, mask=mask, site=site, context=AttentionContext(observers=[recorder]))
    torch.testing.assert_close(out, expected_out.transpose(1, 2), atol=1e-6, rtol=0)
    torch.testing.assert_close(recorder.patterns[site], expected_pattern, atol=1e-6, rtol=0)

    # Blocked queries (forced tiny block) give the same numbers, and every block reaches observers.
    monkeypatch.setattr(core_attention, "BLOCK_ELEMENTS", 2 * 4 * 5 * 2)  # 2 queries per block
    blocked = PatternRecorder()
    out_blocked = attend(q, k, v, mask=mask, site=site, context=AttentionContext(observers=[blocked]))
    torch.testing.assert_close(out_blocked, out, atol=1e-6, rtol=0)
    assert len(blocked._blocks[site]) == 3
    torch.testing.assert_close(blocked.patterns[site], expected_pattern, atol=1e-6, rtol=0)


def test_attend_under_inference_mode_with_causal_mask():
    # Inference-mode tensors track no version counter; the core must not depend on one.
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    causal = torch.full((6, 6), torch.finfo(torch.float32).min).triu(1).view(1, 1, 6, 6)
    _, expected_out = hand_attention(q, k, v, causal)
    with torch.inference_mode():
        mask = causal.clone()
        out = attend(q, k, v, mask=mask)
        again = attend(q, k, v, mask=mask)
    torch.testing.assert_close(out, expected_out.transpose(1, 2), atol=1e-6, rtol=0)
    torch.testing.assert_close(again, out, atol=0, rtol=0)


def test_head_mask_equals_zeroing_head_contribution_by_hand():
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 3, 4, 5), torch.randn(1, 3, 4, 5), torch.randn(1, 3, 4, 5)
    site = AttentionSite("self", 0)
    mask = HeadMask({site: torch.tensor([1.0, 0.0, 0.5])})
    out = attend(q, k, v, site=site, context=AttentionContext(head_mask=mask))  # [b, q, h, d]
    _, per_head = hand_attention(q, k, v)  # [b, h, q, d]
    expected = per_head.transpose(1, 2).clone()
    expected[:, :, 1] = 0.0
    expected[:, :, 2] *= 0.5
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_head_mask_reaches_hf_model(tiny_model_dirs):
    loaded = load_hf_model(str(tiny_model_dirs["bert"]), name="bert")
    batch = loaded.encode(SENTENCES)
    ones = torch.ones(2, 4)
    with torch.no_grad():
        base = loaded.forward(batch, loaded.context()).last_hidden_state
        same = loaded.forward(batch, loaded.context(head_mask=HeadMask.from_matrix(ones))).last_hidden_state
        zero = ones.clone()
        zero[1, 2] = 0
        changed = loaded.forward(batch, loaded.context(head_mask=HeadMask.from_matrix(zero))).last_hidden_state
    assert torch.equal(base, same)
    assert (base - changed).abs().max() > 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_core_on_cuda_matches_cpu(minilm_dir):
    cpu = load_hf_model(str(minilm_dir), name="minilm", device="cpu")
    gpu = load_hf_model(str(minilm_dir), name="minilm", device="cuda")
    batch_cpu, batch_gpu = cpu.encode(SENTENCES), gpu.encode(SENTENCES)
    rec_cpu, rec_gpu = PatternRecorder(), PatternRecorder()
    with torch.no_grad():
        cpu.forward(batch_cpu, cpu.context([rec_cpu]))
        gpu.forward(batch_gpu, gpu.context([rec_gpu]))
    for site, pattern in rec_cpu.patterns.items():
        assert (rec_gpu.patterns[site] - pattern).abs().max() <= 1e-4
