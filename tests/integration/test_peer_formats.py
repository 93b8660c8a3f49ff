"""from_attentions takes attention as each peer tool hands it over, and checks it against the same patterns.

The reference is a tiny GPT-2's own eager ``outputs.attentions`` for a batch of two texts (the second example
chosen with ``batch_index``). Each format: a stacked ``[layer, batch, head, query, key]`` tensor, a TransformerLens
``ActivationCache``-like object (duck-typed: ``cache_dict``, no TransformerLens import) and the whole cache dict
holding other hooks too, circuitsvis's one ``[head, query, key]`` layer. inseq's sequence output is refused with
the call that converts it, and that call gives the same patterns; pre-softmax scores get the ``hook_pattern`` hint.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from tiny_models import TEXTS

from attnviz import AttentionCapture
from attnviz.common.errors import InputError


@pytest.fixture(scope="module")
def run(tiny_model_dirs):
    """(outputs.attentions of a batch of two equal-length texts, tokens of the second)."""
    directory = tiny_model_dirs["gpt2"]
    model = transformers.GPT2LMHeadModel.from_pretrained(directory, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    ids = [tokenizer(text)["input_ids"][:8] for text in TEXTS[:2]]
    with torch.no_grad():
        output = model(torch.tensor(ids), output_attentions=True)
    return output.attentions, tokenizer.convert_ids_to_tokens(ids[1])


def reference(attentions):
    return [layer[1] for layer in attentions]  # [head, q, k] of example 1


def assert_same(capture, attentions):
    for index, expected in enumerate(reference(attentions)):
        assert torch.equal(capture.layer(index), expected)


class ActivationCacheLike:
    """What TransformerLens's ActivationCache exposes that matters here: ``cache_dict`` of hook name -> tensor."""

    def __init__(self, cache_dict):
        self.cache_dict = cache_dict

    def __getitem__(self, name):
        return self.cache_dict[name]


def tl_cache(attentions, *, scores=True):
    cache = {"hook_embed": torch.zeros(2, 8, 32)}
    for layer, pattern in enumerate(attentions):
        cache[f"blocks.{layer}.hook_resid_pre"] = torch.zeros(2, 8, 32)
        if scores:
            cache[f"blocks.{layer}.attn.hook_attn_scores"] = torch.log(pattern)
        cache[f"blocks.{layer}.attn.hook_pattern"] = pattern
    return cache


def test_stacked_five_dimensional_tensor(run):
    attentions, tokens = run
    assert_same(AttentionCapture.from_attentions(torch.stack(attentions), tokens, batch_index=1), attentions)
    with pytest.raises(InputError, match="batch_index"):
        AttentionCapture.from_attentions(torch.stack(attentions), tokens)


def test_activation_cache_object_and_its_whole_dict(run):
    attentions, tokens = run
    assert_same(
        AttentionCapture.from_attentions(ActivationCacheLike(tl_cache(attentions)), tokens, batch_index=1), attentions
    )
    assert_same(AttentionCapture.from_attentions(tl_cache(attentions), tokens, batch_index=1), attentions)


def test_one_layer_as_circuitsvis_takes_it(run):
    attentions, tokens = run
    capture = AttentionCapture.from_attentions(attentions[1][1], tokens)  # [head, q, k]
    assert capture.num_layers() == 1 and torch.equal(capture.layer(0), attentions[1][1])


def test_inseq_output_is_refused_with_the_call_that_converts_it(run):
    attentions, tokens = run

    class FeatureAttributionSequenceOutput:  # inseq's attention layout: [key, query, layer, head]
        source_attributions = None
        target_attributions = torch.stack(reference(attentions)).permute(3, 2, 0, 1)

    out = FeatureAttributionSequenceOutput()
    with pytest.raises(InputError, match=r"permute\(2, 3, 1, 0\)") as error:
        AttentionCapture.from_attentions(out, tokens)
    assert "[key, query, layer, head]" in str(error.value) and "target_attributions" in str(error.value)
    assert_same(AttentionCapture.from_attentions(out.target_attributions.permute(2, 3, 1, 0), tokens), attentions)


@pytest.mark.parametrize("form", ["cache-of-scores", "scores-tensor"])
def test_scores_before_the_softmax_get_the_hook_pattern_hint(run, form):
    attentions, tokens = run
    scores = [torch.log(layer) for layer in attentions]  # -inf above the diagonal, negative elsewhere
    given = (
        {name: value for name, value in tl_cache(attentions).items() if "hook_pattern" not in name}
        if form == "cache-of-scores"
        else scores
    )
    with pytest.raises(InputError, match="hook_pattern") as error:
        AttentionCapture.from_attentions(given, tokens, batch_index=1)
    assert "NaN, infinite or negative" not in str(error.value)
