"""The causal triangle without a ``[q, k]`` mask tensor.

transformers builds the mask attnviz's attention reads through :func:`attnviz.core.hf.core_mask`, which leaves it
out (``None``) where it would be the plain causal triangle — as many keys as queries, no padding, no sliding
window — as transformers does for sdpa; the core then applies causality itself (``attend(..., causal=True)``): the
tile kernels by position, the block path one block's rows at a time, every other path through a mask it builds.
Each path must give exactly what the mask tensor gives.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import TEXTS

import attnviz
from attnviz.captures.attention_capture import PatternRecorder
from attnviz.core import AttentionContext, AttentionSite, attend
from attnviz.core import attention as core_attention
from attnviz.core.hf import core_mask
from attnviz.core.hf_mask import LayoutMask
from attnviz.core.kernel import prepare_kernel
from attnviz.core.key_range import causal_mask

SITE = AttentionSite("self", 0)


class SummaryRecorder:
    """An observer that needs no pattern (so the tile kernels run when the kernel is loaded): keeps what it gets."""

    accepts_key_prefix = accepts_summary = accepts_summary_only = True
    summary_band_reach = 1

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def summary_columns(self, site):
        return [0, 3]

    def observe(self, site, pattern, start, summary=None, **extras):
        self.seen.append((summary.values if summary is not None else pattern).clone())


def test_the_mask_is_left_out_only_for_the_plain_triangle():
    import transformers
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    plain = {
        "mask_function": causal_mask_function,
        "dtype": torch.float32,
        "allow_is_causal_skip": True,
        "config": transformers.LlamaConfig(),
    }
    assert (
        core_mask(batch_size=1, q_length=12, kv_length=12, attention_mask=torch.ones(1, 12, dtype=torch.bool), **plain)
        is None
    )
    padded = torch.tensor([[True] * 9 + [False] * 3])  # transformers hands the 2-D mask over as booleans
    built = core_mask(batch_size=1, q_length=12, kv_length=12, attention_mask=padded, **plain)
    assert built.shape == (1, 1, 12, 12) and torch.equal(
        built[0, 0, :, :9], causal_mask(12, 9, torch.float32, "cpu")[0, 0]
    )
    assert (built[0, 0, :, 9:] == torch.finfo(torch.float32).min).all()  # padding keys hidden from every query
    windowed = {**plain, "mask_function": sliding_window_causal_mask_function(4), "local_size": 4}
    # a window shorter than the input is described (tests/integration/test_key_layouts.py), not left out
    assert isinstance(core_mask(batch_size=1, q_length=12, kv_length=12, **windowed), LayoutMask)
    assert (
        core_mask(batch_size=1, q_length=12, kv_length=12, **{**plain, "allow_is_causal_skip": False}) is not None
    )  # transformers said no
    # a family transformers does not run on sdpa may mark a causal decoder is_causal=False: its mask always stays
    assert (
        core_mask(batch_size=1, q_length=12, kv_length=12, **{**plain, "config": transformers.NllbMoeConfig()})
        is not None
    )


@pytest.fixture
def qkv():
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 6, 40, 16, generator=generator) * 2  # 3 query heads per key/value head, peaked rows
    key = torch.randn(2, 2, 40, 16, generator=generator) * 2
    value = torch.randn(2, 2, 40, 16, generator=generator)
    return query, key, value


@pytest.mark.parametrize("fused", [False, True], ids=["torch", "kernel"])
@pytest.mark.parametrize("blocks", [1, 3], ids=["one-block", "three-blocks"])
def test_every_path_equals_the_mask_tensor(qkv, monkeypatch, fused, blocks):
    if fused and not prepare_kernel():
        pytest.skip("the fused kernel is not available here")
    query, key, value = qkv
    monkeypatch.setattr(core_attention, "BLOCK_ELEMENTS", 2 * 6 * 40 * -(-40 // blocks))
    mask = causal_mask(40, 40, torch.float32, "cpu")
    for make_observers in (lambda: [PatternRecorder()], lambda: [SummaryRecorder()], list):
        results = []
        for arguments in ({"mask": mask}, {"causal": True}):
            observers = make_observers()
            context = AttentionContext(observers=observers, fused_softmax=fused)
            output = attend(query, key, value, site=SITE, context=context, **arguments)
            results.append((output, observers))
        (expected, expected_observers), (output, observers) = results
        torch.testing.assert_close(output, expected, atol=2e-6, rtol=0)
        if observers and isinstance(observers[0], PatternRecorder):
            torch.testing.assert_close(
                observers[0].patterns[SITE], expected_observers[0].patterns[SITE], atol=1e-6, rtol=0
            )
    # the differentiable path builds the mask itself
    gradient_query = query.clone().requires_grad_(True)
    with_mask = attend(gradient_query, key, value, mask=mask)
    without = attend(gradient_query, key, value, causal=True)
    torch.testing.assert_close(without, with_mask, atol=1e-6, rtol=0)


def test_a_causal_model_without_its_mask_equals_eager(tiny_dirs):
    import transformers

    path = tiny_dirs["llama"]
    loaded = attnviz.load_model(str(path), device="cpu")
    batch = loaded.encode([TEXTS[0]])
    assert batch.inputs["attention_mask"].all()  # one text, no padding: the mask is left out
    eager = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    with torch.no_grad():
        reference = eager(**batch.inputs, output_attentions=True)
    capture = attnviz.capture(loaded, TEXTS[0])
    torch.testing.assert_close(capture.stacked(), torch.stack(reference.attentions)[:, 0], atol=1e-5, rtol=0)
    with torch.no_grad():
        logits = loaded.forward(batch, logits=True).logits
    torch.testing.assert_close(logits, reference.logits, atol=1e-4, rtol=0)


def test_statistics_without_the_mask_equal_those_with_it(tiny_dirs, monkeypatch):
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    loaded = attnviz.load_model(str(tiny_dirs["llama"]), device="cpu")
    without = attnviz.compute_statistics(loaded, [TEXTS[0]], progress=False)
    monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, "attnviz", eager_mask)
    with_mask = attnviz.compute_statistics(loaded, [TEXTS[0]], progress=False)
    for (site, head, values), (_, _, expected) in zip(without.heads(), with_mask.heads()):
        for name, value in values.items():
            assert value == pytest.approx(expected[name], abs=1e-5, nan_ok=True), (site, head, name)
