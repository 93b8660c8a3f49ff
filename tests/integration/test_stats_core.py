"""The attention core's fast path (reused buffers, causal key cut-off) that streaming statistics rely on."""

from __future__ import annotations

import math

import pytest
import torch

from attnviz.captures.attention_capture import PatternRecorder
from attnviz.core import AttentionContext, AttentionSite, HeadMask, attend
from attnviz.core import attention as core_attention
from attnviz.core import blocks as core_blocks

MIN = torch.finfo(torch.float32).min
SITE = AttentionSite("self", 0)


def causal_mask(lengths: list[int], width: int) -> torch.Tensor:
    """Additive ``[b, 1, q, k]`` causal + right-padding mask, as transformers' eager_mask builds it."""
    mask = torch.zeros(len(lengths), 1, width, width)
    future = torch.ones(width, width, dtype=torch.bool).triu(1)
    for example, length in enumerate(lengths):
        mask[example, 0] = mask[example, 0].masked_fill(future, MIN)
        mask[example, 0, :, length:] = MIN
    return mask


def hand_attention(q, k, v, mask):
    """softmax(q kᵀ/√d + mask) v with repeated key/value heads: ``([b, h, q, k], [b, q, h, d])``."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    pattern = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask, dim=-1)
    return pattern, (pattern @ v).transpose(1, 2)


class PrefixRecorder:
    """Records the widths and copies of what a prefix-accepting observer is handed."""

    accepts_key_prefix = True

    def __init__(self):
        self.blocks = []

    def observe(self, site, pattern, query_start):
        self.blocks.append((query_start, pattern.clone()))


def test_key_stops_follow_the_causal_mask_and_are_cached():
    mask = causal_mask([7, 5], 7)
    stops = core_attention.key_stops(mask, 3, 7, 7)
    assert stops == [3, 6, 7]
    assert core_attention.key_stops(mask, 3, 7, 7) is stops  # read once per mask, not once per layer
    mask[..., 0, 1] = 0.0  # query 0 may now see key 1: the cache notices the change
    assert core_attention.key_stops(mask, 3, 7, 7) == [3, 6, 7]
    mask[..., 0, 4] = 0.0
    assert core_attention.key_stops(mask, 3, 7, 7) == [5, 6, 7]
    padding_only = torch.zeros(2, 1, 1, 6)
    padding_only[1, ..., 4:] = MIN
    assert core_attention.key_stops(padding_only, 2, 6, 6) == [6, 6, 6]  # example 0 sees every key
    dead_row = causal_mask([4], 4)
    dead_row[0, 0, 3, :] = MIN  # softmax makes a fully masked row uniform over all keys: keep them all
    assert core_attention.key_stops(dead_row, 2, 4, 4) == [2, 4]
    assert core_attention.key_stops(None, 2, 5, 5) == [5, 5, 5]
    assert core_attention.key_stops(torch.ones(1, 1, 5, 5, dtype=torch.bool), 2, 5, 5) == [5, 5, 5]


def test_key_stops_of_a_long_mask_read_in_runs_of_rows_equal_a_hand_count():
    """Past 256 rows the mask is read a run of rows at a time; the stops are still each block's last visible key."""
    length = 700
    mask = causal_mask([length, 650], length)
    mask[1, 0, 300] = MIN  # a row that sees no key (in the second run): its block keeps every key
    mask[0, 0, 520, 690] = 0.0  # a row in the third run that sees one key far ahead
    stops = core_attention.key_stops(mask, 128, length, length)
    visible = mask[:, 0] > MIN  # [b, q, k]
    expected = []
    for start in range(0, length, 128):
        rows = visible[:, start : start + 128]  # [b, blk, k]
        if not rows.any(-1).all():
            expected.append(length)  # some query sees nothing: softmax spreads it over every key
        else:
            expected.append(max(int(row.nonzero().max()) + 1 for row in rows.reshape(-1, length)))
    assert stops == expected == [128, 256, 700, 512, 691, 700]


def test_causal_blocks_match_hand_attention_and_observers_do_not_change_outputs(monkeypatch):
    torch.manual_seed(0)
    lengths, width = [9, 6], 9
    q = torch.randn(2, 6, width, 8)
    k = torch.randn(2, 2, width, 8)  # grouped-query attention: 3 query heads per key/value head
    v = torch.randn(2, 2, width, 8)
    mask = causal_mask(lengths, width)
    expected_pattern, expected_out = hand_attention(q, k, v, mask)
    monkeypatch.setattr(core_attention, "BLOCK_ELEMENTS", 2 * 6 * width * 4)  # 4 queries per block
    monkeypatch.setattr(core_blocks, "WIDTH_MULTIPLE", 1)  # exact key stops (by default rounded up to 16)

    plain = attend(q, k, v, mask=mask)
    full, prefix = PatternRecorder(), PrefixRecorder()
    observed = attend(q, k, v, mask=mask, site=SITE, context=AttentionContext(observers=[full, prefix]))
    assert torch.equal(plain, observed)  # bit for bit
    torch.testing.assert_close(observed, expected_out, atol=1e-6, rtol=0)

    # A full-width observer gets [b, h, blk, k] with exact zeros on future keys, like before.
    torch.testing.assert_close(full.patterns[SITE], expected_pattern, atol=1e-6, rtol=0)
    assert full.patterns[SITE].masked_select(torch.ones(width, width, dtype=torch.bool).triu(1)).abs().max() == 0
    # A prefix-accepting observer gets only the keys up to the end of each block.
    assert [(start, p.shape[-1]) for start, p in prefix.blocks] == [(0, 4), (4, 8), (8, 9)]
    for start, pattern in prefix.blocks:
        rows = pattern.shape[2]
        torch.testing.assert_close(
            pattern, expected_pattern[:, :, start : start + rows, : pattern.shape[-1]], atol=1e-6, rtol=0
        )


def test_gradient_path_matches_the_buffer_path_and_differentiates():
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    mask = causal_mask([6], 6)
    fast = attend(q, k, v, mask=mask)
    xi = torch.ones(4, requires_grad=True)  # head-mask variable of gradient importance
    slow = attend(q, k, v, mask=mask, site=SITE, context=AttentionContext(head_mask=HeadMask({SITE: xi})))
    torch.testing.assert_close(slow, fast, atol=1e-6, rtol=0)
    slow.square().sum().backward()
    assert xi.grad is not None and xi.grad.abs().min() > 0


def test_head_mask_and_half_precision_on_the_buffer_path():
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8)
    mask = causal_mask([5], 5)
    weights = torch.tensor([1.0, 0.0, 0.5, 1.0])
    out = attend(q, k, v, mask=mask, site=SITE, context=AttentionContext(head_mask=HeadMask({SITE: weights})))
    _, expected = hand_attention(q, k, v, mask)
    torch.testing.assert_close(out, expected * weights.view(1, 1, 4, 1), atol=1e-6, rtol=0)
    half = attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask=mask.bfloat16())
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), expected, atol=3e-2, rtol=0)


def test_buffers_are_reused_across_calls():
    q = torch.randn(1, 2, 16, 8)
    mask = causal_mask([16], 16)
    attend(q, q, q, mask=mask)
    pointers = {name: buffer.data_ptr() for name, buffer in core_attention._workspace.buffers.items()}
    attend(q * 2, q, q, mask=mask)
    assert {name: b.data_ptr() for name, b in core_attention._workspace.buffers.items()} == pointers


@pytest.mark.slow
def test_smollm2_patterns_match_transformers_eager(monkeypatch):
    """The real causal model (GQA, padding): patterns within 1e-6 of eager attention, also in query blocks."""
    import transformers

    from attnviz.models.specs import load_model

    loaded = load_model("smollm2", device="cpu")
    batch = loaded.encode(["The quick brown fox jumps over the lazy dog near the river bank.", "A short one."])
    eager = transformers.AutoModelForCausalLM.from_pretrained(
        loaded.model.config._name_or_path, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        reference = eager.model(**batch.inputs, output_attentions=True, use_cache=False)

    def largest_differences():
        recorder = PatternRecorder()
        with torch.no_grad():
            mine = loaded.forward(batch, loaded.context([recorder]))
        per_layer = [
            max(
                (recorder.patterns[AttentionSite("self", layer)][i, :, :n, :n] - expected[i, :, :n, :n]).abs().max()
                for i, n in enumerate(batch.lengths)
            )
            for layer, expected in enumerate(reference.attentions)
        ]
        return per_layer, (mine.last_hidden_state - reference.last_hidden_state).abs().max()

    per_layer, hidden = largest_differences()
    assert max(per_layer) <= 1e-6 and hidden <= 1e-5
    # 3 queries per block, causal blocks cut to their keys: the first layer still agrees within 1e-6;
    # later layers see the rounding of a differently blocked matmul carried through the network.
    monkeypatch.setattr(core_attention, "BLOCK_ELEMENTS", 2 * 9 * 16 * 3)
    per_layer, hidden = largest_differences()
    assert per_layer[0] <= 1e-6
    assert max(per_layer) <= 1e-5 and hidden <= 5e-4
