"""Masking a head through the core equals removing its contribution by hand."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import TEXTS, main_output

from attnviz.core import AttentionContext, AttentionSite, HeadMask, attend
from attnviz.models.head_sets import (
    keep_matrix,
    layout_after,
    max_removable,
    merge_removed,
    normalize_removed,
    removal_mask,
)

# fixtures shared by the pruning tests (tiny BERT, GPT-2 and LLaMA models)

SITE0, SITE1 = AttentionSite("self", 0), AttentionSite("self", 1)


def test_attend_head_mask_equals_hand_computation():
    """softmax(QKᵀ/√d + mask)·V per head, with GQA, and the masked head's output set to zero by hand."""
    torch.manual_seed(0)
    batch, heads, kv_heads, length, dim = 2, 6, 2, 5, 4
    query = torch.randn(batch, heads, length, dim, dtype=torch.float64)
    key = torch.randn(batch, kv_heads, length, dim, dtype=torch.float64)
    value = torch.randn(batch, kv_heads, length, dim, dtype=torch.float64)
    causal = torch.full((length, length), float("-inf"), dtype=torch.float64).triu(1)[None, None]  # [1, 1, q, k]
    site = AttentionSite("self", 0)
    multipliers = torch.tensor([1.0, 0.0, 1.0, 0.5, 1.0, 0.0], dtype=torch.float64)
    context = AttentionContext(head_mask=HeadMask({site: multipliers}))

    ours = attend(query, key, value, mask=causal, site=site, context=context)  # [b, q, h, d]

    expected = torch.empty(batch, length, heads, dim, dtype=torch.float64)
    group = heads // kv_heads
    for h in range(heads):
        scores = query[:, h] @ key[:, h // group].transpose(1, 2) / math.sqrt(dim) + causal[0, 0]  # [b, q, k]
        expected[:, :, h] = torch.softmax(scores, -1) @ value[:, h // group] * multipliers[h]
    assert torch.allclose(ours, expected, atol=1e-12)
    assert ours[:, :, 1].abs().max() == 0 and ours[:, :, 5].abs().max() == 0


def _zero_head_by_hand(loaded, family: str, layer: int, head: int):
    """Register a hook that zeroes ``head``'s slice of the merged attention output before the output projection."""
    model = loaded.model
    if family == "bert":
        attention = model.encoder.layer[layer].attention
        width = attention.self.attention_head_size
        projection = attention.output.dense
    elif family == "gpt2":
        attention = model.transformer.h[layer].attn
        width = attention.head_dim
        projection = attention.c_proj
    else:
        attention = model.model.layers[layer].self_attn
        width = attention.head_dim
        projection = attention.o_proj

    def hook(module, args):
        merged = args[0].clone()  # [b, q, h·d]
        merged[..., head * width : (head + 1) * width] = 0
        return (merged, *args[1:])

    return projection.register_forward_pre_hook(hook)


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_core_head_mask_equals_zeroing_the_head_by_hand(tiny_models, family):
    loaded = tiny_models[family]
    layout = loaded.layout()
    batch = loaded.encode(TEXTS[:3])
    layer, head = 1, 2
    masked = main_output(
        loaded, batch, loaded.context(head_mask=removal_mask(layout, {AttentionSite("self", layer): [head]}))
    )
    handle = _zero_head_by_hand(loaded, family, layer, head)
    try:
        by_hand = main_output(loaded, batch)
    finally:
        handle.remove()
    unmasked = main_output(loaded, batch)
    valid = batch.inputs["attention_mask"].bool()
    assert torch.allclose(masked[valid], by_hand[valid], atol=1e-6)
    assert (masked[valid] - unmasked[valid]).abs().max() > 1e-3  # the head did matter


def test_removed_head_sets():
    layout = {SITE0: 4, SITE1: 4}
    removed = merge_removed({SITE0: [3, 1]}, {SITE0: [1], SITE1: [0]})
    assert removed == {SITE0: [1, 3], SITE1: [0]}
    assert normalize_removed({SITE0: [], SITE1: [2, 2]}) == {SITE1: [2]}
    assert layout_after(layout, removed) == {SITE0: 2, SITE1: 3}
    assert max_removable(layout) == 6
    keep = keep_matrix(layout, removed)
    assert keep[SITE0].tolist() == [1, 0, 1, 0] and keep[SITE1].tolist() == [0, 1, 1, 1]
    assert removal_mask(layout, {}) is None
