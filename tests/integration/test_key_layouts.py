"""Causal masks with padding and sliding windows, said without a ``[q, k]`` tensor.

Where transformers asks for its standard causal mask with padding or a sliding window, attnviz's mask function
(:func:`attnviz.core.hf_mask.core_mask`) returns a :class:`~attnviz.core.hf_mask.LayoutMask`: the description
(:class:`~attnviz.core.key_range.KeyLayout`), whose values are built only if something other than the core reads
them. The core applies it by position in its tile kernels and one block of rows at a time elsewhere. Every path must
give what eager's mask tensor gives, rows that see no key included (softmax weighs every key alike there).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import TEXTS

import attnviz
from attnviz.captures.attention_capture import PatternRecorder
from attnviz.core import AttentionContext, AttentionSite, attend, softmax_pattern
from attnviz.core import attention as core_attention
from attnviz.core.hf_mask import LayoutMask, core_mask
from attnviz.core.kernel import prepare_kernel
from attnviz.core.key_range import KeyLayout

SITE = AttentionSite("self", 0)
LENGTH = 40


class SummaryRecorder:
    """An observer that needs no pattern (so the tile kernels run when the kernel is loaded): keeps what it gets."""

    accepts_key_prefix = accepts_summary = accepts_summary_only = accepts_sink_share = True
    summary_band_reach = 2

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def summary_columns(self, site):
        return [0, 3, 30]

    def observe(self, site, pattern, start, summary=None, sink_share=None, **extras):
        self.seen.append((summary.values if summary is not None else pattern).clone())
        if sink_share is not None:
            self.seen.append(sink_share.clone())


def _arguments(**overrides):
    import transformers
    from transformers.masking_utils import causal_mask_function

    arguments = {
        "batch_size": 2,
        "q_length": 12,
        "kv_length": 12,
        "mask_function": causal_mask_function,
        "dtype": torch.float32,
        "allow_is_causal_skip": True,
        "config": transformers.LlamaConfig(),
    }
    return {**arguments, **overrides}


def _padding(*runs: tuple[int, int], length: int = 12) -> torch.Tensor:
    """Boolean ``[b, k]`` padding mask with each sequence's tokens at ``[start, stop)``."""
    keys = torch.arange(length)
    return torch.stack([(keys >= start) & (keys < stop) for start, stop in runs])


DESCRIBED = {
    "left padding": {"attention_mask": _padding((3, 12), (0, 12))},
    "right padding": {"attention_mask": _padding((0, 12), (0, 7))},
    "a sequence of padding only": {"attention_mask": _padding((0, 0), (0, 12))},
    "window": {"window": 4},
    "window and padding on both sides": {"window": 4, "attention_mask": _padding((2, 12), (0, 6))},
    # transformers' bidirectional mask: an encoder's padding, and a decoder's queries over the encoder's keys
    "encoder padding": {"bidirectional": True, "attention_mask": _padding((0, 9), (0, 12))},
    "cross-attention padding": {"bidirectional": True, "q_length": 5, "attention_mask": _padding((0, 12), (0, 4))},
    # transformers' bidirectional window (ModernBERT's local attention): keys at most 3 positions away
    "two-sided window": {"two_sided": 3},
    "two-sided window and padding": {"two_sided": 3, "attention_mask": _padding((0, 9), (0, 12))},
}


@pytest.mark.parametrize("case", DESCRIBED)
def test_described_masks_hold_eager_masks_values(case):
    from transformers.masking_utils import (
        bidirectional_mask_function,
        eager_mask,
        sliding_window_bidirectional_mask_function,
        sliding_window_causal_mask_function,
    )

    settings = dict(DESCRIBED[case])
    window = settings.pop("window", None)
    if window is not None:
        settings.update(mask_function=sliding_window_causal_mask_function(window), local_size=window)
    if settings.pop("bidirectional", False):  # as create_bidirectional_mask calls it
        settings.update(
            mask_function=bidirectional_mask_function, allow_is_causal_skip=False, allow_is_bidirectional_skip=True
        )
    reach = settings.pop("two_sided", None)
    if reach is not None:  # as create_bidirectional_sliding_window_mask calls it
        settings.update(
            mask_function=sliding_window_bidirectional_mask_function(reach),
            local_size=reach,
            allow_is_causal_skip=False,
            allow_is_bidirectional_skip=True,
        )
    arguments = _arguments(**settings)
    described = core_mask(**arguments)
    assert isinstance(described, LayoutMask)
    expected = eager_mask(**arguments)
    assert described.shape == expected.shape and described.dtype == expected.dtype
    moved = described.to("meta")  # accelerate moves arguments to each layer's device: still a description
    assert isinstance(moved, LayoutMask) and moved.device.type == "meta" and moved.described
    assert described.described  # nothing built yet
    assert torch.equal(described.dense(), expected)
    assert not described.described  # its values were handed out: from now on they are the mask
    # anything else that reads it gets eager's values: slices, arithmetic, comparisons
    assert torch.equal(described[:, :, 3:9, :5], expected[:, :, 3:9, :5])
    assert torch.equal(described + 1.0, expected + 1.0) and torch.equal(described == 0, expected == 0)
    assert not isinstance(described.to(torch.float16), LayoutMask)  # a new dtype: eager's values, cast
    fresh = core_mask(**arguments)
    fresh[0, 0, 3, 2] = 1.5  # written in place (as a model's own code might): the attention reads what was written
    expected[0, 0, 3, 2] = 1.5
    assert not fresh.described and torch.equal(fresh.dense(), expected)
    assert isinstance(fresh.to("meta"), LayoutMask) is False  # a move of written values moves the values


def test_other_masks_stay_tensors():
    from transformers.masking_utils import (
        bidirectional_mask_function,
        chunked_causal_mask_function,
        sliding_window_bidirectional_mask_function,
        sliding_window_causal_mask_function,
    )

    left = torch.zeros(2, dtype=torch.long)
    cases = {
        "tokens in two runs": _arguments(attention_mask=torch.tensor([[True] * 4 + [False] * 2 + [True] * 6] * 2)),
        "chunked attention": _arguments(mask_function=chunked_causal_mask_function(4, left), local_size=4),
        "a window other than the one said": _arguments(
            mask_function=sliding_window_causal_mask_function(3), local_size=4
        ),
        "custom overlays (vmap)": _arguments(attention_mask=_padding((3, 12), (0, 12)), use_vmap=True),
        "queries after a cache": _arguments(q_length=4, q_offset=8, attention_mask=_padding((3, 12), (0, 12))),
        "transformers said no": _arguments(attention_mask=_padding((3, 12), (0, 12)), allow_is_causal_skip=False),
        # a window of 4 keys for the first sequence, 3 for the second: right for the first sequence alone
        "a window that depends on the sequence": _arguments(
            mask_function=lambda b, h, q, k: (k <= q) & (k > q - torch.tensor([4, 3])[b]), local_size=4
        ),
        "a bidirectional window other than the one said": _arguments(
            mask_function=sliding_window_bidirectional_mask_function(2), local_size=3, allow_is_causal_skip=False
        ),
    }
    for name, arguments in cases.items():
        built = core_mask(**arguments)
        assert type(built) is torch.Tensor, name
    # a bidirectional mask without padding is eager's too: None where transformers may skip it
    unpadded = _arguments(mask_function=bidirectional_mask_function, allow_is_causal_skip=False)
    assert core_mask(**unpadded, allow_is_bidirectional_skip=True) is None
    assert type(core_mask(**unpadded, allow_is_bidirectional_skip=False)) is torch.Tensor


@pytest.fixture
def qkv():
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 6, LENGTH, 16, generator=generator) * 2  # 3 query heads per key/value head, peaked rows
    key = torch.randn(2, 2, LENGTH, 16, generator=generator) * 2
    value = torch.randn(2, 2, LENGTH, 16, generator=generator)
    return query, key, value


LAYOUTS = {
    # the second sequence padded on the left: its first 9 queries see no key
    "left padding": KeyLayout(None, torch.tensor([0, 9]), torch.tensor([LENGTH, LENGTH])),
    # the first padded on the right; with the window its last queries see no key either
    "window and padding": KeyLayout(7, torch.tensor([0, 9]), torch.tensor([25, LENGTH])),
    "window": KeyLayout(5),
    # an encoder's padding on the right, the second sequence empty: its queries weigh every key alike
    "encoder padding": KeyLayout(None, torch.tensor([0, 0]), torch.tensor([31, 0]), causal=False),
    # keys less than 6 positions away on either side, the first sequence padded after 30 tokens
    "two-sided window and padding": KeyLayout(6, torch.tensor([0, 0]), torch.tensor([30, LENGTH]), causal=False),
    "two-sided window": KeyLayout(6, causal=False),
}


@pytest.mark.parametrize("layout_name", LAYOUTS)
@pytest.mark.parametrize("sinks", [False, True], ids=["softmax", "sinks"])
@pytest.mark.parametrize("fused", [False, True], ids=["torch", "kernel"])
@pytest.mark.parametrize("blocks", [1, 3], ids=["one-block", "three-blocks"])
def test_every_path_equals_the_mask_tensor(qkv, monkeypatch, layout_name, sinks, fused, blocks):
    if fused and not prepare_kernel():
        pytest.skip("the fused kernel is not available here")
    query, key, value = qkv
    layout = LAYOUTS[layout_name]
    monkeypatch.setattr(core_attention, "BLOCK_ELEMENTS", 2 * 6 * LENGTH * -(-LENGTH // blocks))
    mask = layout.additive_rows(0, LENGTH, LENGTH, torch.float32, torch.device("cpu")).expand(2, 1, LENGTH, LENGTH)
    pattern_fn = softmax_pattern(16**-0.5, sinks=torch.tensor([-1.0, 0.0, 1.0, 2.0, 0.5, 8.0]) if sinks else None)
    for make_observers in (lambda: [PatternRecorder()], lambda: [SummaryRecorder()], list):
        results = []
        for described in (mask.contiguous(), layout):
            observers = make_observers()
            context = AttentionContext(observers=observers, fused_softmax=fused)
            output = attend(query, key, value, mask=described, pattern_fn=pattern_fn, site=SITE, context=context)
            results.append((output, observers))
        (expected, expected_observers), (output, observers) = results
        torch.testing.assert_close(output, expected, atol=2e-6, rtol=0)
        if isinstance(observers[0:1] and observers[0], PatternRecorder):
            torch.testing.assert_close(
                observers[0].patterns[SITE], expected_observers[0].patterns[SITE], atol=1e-6, rtol=0
            )
        if observers and isinstance(observers[0], SummaryRecorder):
            for got, want in zip(observers[0].seen, expected_observers[0].seen, strict=True):
                torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-6)
    # the differentiable path builds the layout's rows itself
    gradient_query = query.clone().requires_grad_(True)
    with_mask = attend(gradient_query, key, value, mask=mask, pattern_fn=pattern_fn)
    without = attend(gradient_query, key, value, mask=layout, pattern_fn=pattern_fn)
    torch.testing.assert_close(without, with_mask, atol=1e-6, rtol=0)


def test_rows_that_see_no_key_weigh_every_key_alike(qkv):
    query, key, value = qkv
    layout = LAYOUTS["left padding"]
    recorder = PatternRecorder()
    attend(query, key, value, mask=layout, site=SITE, context=AttentionContext(observers=[recorder]))
    pattern = recorder.patterns[SITE]  # [b, h, q, k]
    assert torch.allclose(pattern[1, :, :9], torch.full((6, 9, LENGTH), 1 / LENGTH))
    assert (pattern[1, :, 9:, :9] == 0).all()  # the real queries never weigh padding


def _left_padded(loaded, texts):
    """The batch of ``texts`` padded on the left (as a user's own tokenizer may pad it)."""
    tokenizer = loaded.tokenizer
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        return dict(tokenizer(texts, return_tensors="pt", padding=True))
    finally:
        tokenizer.padding_side = side


@pytest.mark.parametrize("family", ["llama", "mistral", "gpt_oss"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batches_equal_eager_without_building_their_mask(tmp_path, monkeypatch, family, side):
    """A padded batch through a tiny model (Mistral and gpt-oss: a sliding window of 4 keys, gpt-oss with sinks):
    patterns and logits equal eager's, every position included, and no mask of ``[q, k]`` values is ever built."""
    import transformers
    from zoo import build

    path = build(family, tmp_path / family)
    loaded = attnviz.load_model(str(path), device="cpu")
    texts = [TEXTS[0], TEXTS[1] + " " + TEXTS[2]]
    if side == "left":
        inputs = _left_padded(loaded, texts)
    else:
        inputs = dict(loaded.encode(texts).inputs)
    assert not inputs["attention_mask"].all()
    eager = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    with torch.no_grad():
        reference = eager(**inputs, output_attentions=True, use_cache=False)

    def never(self):
        raise AssertionError("a [q, k] mask was built")

    monkeypatch.setattr(LayoutMask, "dense", never)
    described = []
    original = core_mask

    def spy(*args, **kwargs):
        built = original(*args, **kwargs)
        described.append(type(built))
        return built

    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, "attnviz", spy)
    recorder = PatternRecorder()
    context = AttentionContext(observers=[recorder], site_of=loaded.site_of)
    with torch.no_grad():
        logits = loaded.model(**inputs, attnviz_context=context, use_cache=False).logits
    assert LayoutMask in described
    torch.testing.assert_close(logits, reference.logits, atol=1e-4, rtol=0)
    patterns = [recorder.patterns[site] for site in sorted(recorder.patterns, key=lambda site: site.layer)]
    torch.testing.assert_close(torch.stack(patterns), torch.stack(reference.attentions), atol=1e-5, rtol=0)


def test_statistics_of_a_padded_batch_equal_those_with_eager_mask(tmp_path, monkeypatch):
    """The statistics pass (tile kernels, sinks, windows, carriers) over padded batches, with the description and
    with transformers' eager mask tensor."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask
    from zoo import build

    loaded = attnviz.load_model(str(build("gpt_oss", tmp_path / "gpt_oss")), device="cpu")
    texts = [TEXTS[0], " ".join(TEXTS[1:4]), TEXTS[2]]
    plan = {"batch_size": 3, "progress": False}
    described = attnviz.compute_statistics(loaded, texts, **plan)
    monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, "attnviz", eager_mask)
    with_mask = attnviz.compute_statistics(loaded, texts, **plan)
    for (site, head, values), (_, _, expected) in zip(described.heads(), with_mask.heads(), strict=True):
        for name, value in values.items():
            assert value == pytest.approx(expected[name], abs=1e-5, nan_ok=True), (site, head, name)
    assert described.carriers is not None and with_mask.carriers is not None
    for site, means in with_mask.carriers.means.items():
        assert torch.allclose(described.carriers.means[site], means, rtol=1e-5, atol=1e-6, equal_nan=True), site


@pytest.mark.parametrize("layout_name", [*LAYOUTS, "causal"])
def test_key_spans_equal_a_hand_count(layout_name):
    """The keys each block of queries reads: from its first visible key to its last, all of them where a row of the
    block sees none (that row weighs every key)."""
    layout = LAYOUTS.get(layout_name, KeyLayout())
    lowest = torch.finfo(torch.float32).min
    visible = layout.additive_rows(0, LENGTH, LENGTH, torch.float32, torch.device("cpu"))[:, 0] > lowest  # [b|1, q, k]
    for block in (1, 7, 16, LENGTH):
        starts, stops = layout.key_spans(block, LENGTH, LENGTH)
        expected = []
        for first in range(0, LENGTH, block):
            rows = visible[:, first : first + block]  # [b|1, r, k]
            if not rows.any(-1).all():
                expected.append((0, LENGTH))
            else:
                keys = rows.any(0).any(0).nonzero()[:, 0]
                expected.append((int(keys.min()), int(keys.max()) + 1))
        assert list(zip(starts, stops, strict=True)) == expected, block
        assert layout.key_spans(block, LENGTH, LENGTH) == (starts, stops)


@pytest.mark.parametrize("family", ["bert", "t5"])
def test_encoder_padding_equals_eager_without_building_its_mask(tmp_path, monkeypatch, family):
    """An encoder's padded batch (BERT), and an encoder-decoder's (T5: the encoder's padding, and the decoder's
    queries over it): outputs equal eager's at every position, and no mask of ``[q, k]`` values is built."""
    from zoo import build, tiny_config

    path = build(family, tmp_path / family)
    loaded = attnviz.load_model(str(path), device="cpu")
    texts = [TEXTS[0], TEXTS[1] + " " + TEXTS[2]]
    targets = ["a cat", "a cat sat on the mat"] if family == "t5" else None
    inputs = dict(loaded.encode(texts, targets=targets).inputs)
    assert not inputs["attention_mask"].all()
    model_class, _ = tiny_config(family)
    eager = model_class.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        reference = eager(**inputs)
    monkeypatch.setattr(LayoutMask, "dense", lambda self: pytest.fail("a [q, k] mask was built"))
    described = []

    def spy(*args, **kwargs):
        built = core_mask(*args, **kwargs)
        described.append(type(built))
        return built

    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, "attnviz", spy)
    with torch.no_grad():
        output = loaded.model(**inputs)
    assert LayoutMask in described
    torch.testing.assert_close(output.logits, reference.logits, atol=1e-4, rtol=0)  # a masked LM's, T5's decoder's


@pytest.mark.parametrize("layout_name", [*LAYOUTS, "causal"])
def test_the_path_of_a_few_observed_rows_equals_the_mask_tensor(qkv, monkeypatch, layout_name):
    """``observed_queries`` (one query's strip): sdpa for the output, the chosen rows' pattern apart. The plain
    triangle goes to sdpa as ``is_causal``: no ``[q, k]`` rows are built for it, only the observed ones."""
    query, key, value = qkv
    layout = LAYOUTS.get(layout_name, KeyLayout())
    mask = layout.additive_rows(0, LENGTH, LENGTH, torch.float32, torch.device("cpu")).expand(2, 1, LENGTH, LENGTH)
    built: list[int] = []
    additive_rows = KeyLayout.additive_rows

    def counted(self, query_start, rows, *args):
        built.append(rows)
        return additive_rows(self, query_start, rows, *args)

    results = []
    for described in (mask.contiguous(), layout):
        recorder = PatternRecorder()
        context = AttentionContext(observers=[recorder], observed_queries=range(LENGTH - 2, LENGTH))
        monkeypatch.setattr(KeyLayout, "additive_rows", counted)
        with torch.no_grad():
            output = attend(query, key, value, mask=described, site=SITE, context=context)
        monkeypatch.setattr(KeyLayout, "additive_rows", additive_rows)
        results.append((output, recorder.patterns[SITE]))
    (expected, expected_rows), (output, rows) = results
    torch.testing.assert_close(output, expected, atol=2e-6, rtol=0)
    torch.testing.assert_close(rows, expected_rows, atol=1e-6, rtol=0)
    assert rows.shape[2] == 2
    if layout_name == "causal":
        assert built == [2]  # the two observed rows only
