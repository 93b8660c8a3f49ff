"""AttentionCapture.from_attentions: patterns from transformers, TransformerLens-style caches and numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from tiny_models import TEXTS

import attnviz
from attnviz import AttentionCapture
from attnviz.common.errors import InputError


def eager_run(directory, text, target=None):
    """(output with attentions, source tokens, target tokens) of the model's own eager forward pass."""
    config = transformers.AutoConfig.from_pretrained(directory)
    model = getattr(transformers, config.architectures[0]).from_pretrained(directory, attn_implementation="eager")
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    encoded = tokenizer([text], return_tensors="pt", return_token_type_ids=False)
    kwargs = dict(encoded)
    target_tokens = None
    if target is not None:
        target_ids = tokenizer([target], return_tensors="pt")["input_ids"]
        kwargs["decoder_input_ids"] = target_ids
        target_tokens = tokenizer.convert_ids_to_tokens(target_ids[0])
    with torch.no_grad():
        output = model.eval()(**kwargs, output_attentions=True)
    return output, tokenizer.convert_ids_to_tokens(encoded["input_ids"][0]), target_tokens


@pytest.fixture(scope="module")
def gpt2_run(tiny_model_dirs):
    return eager_run(tiny_model_dirs["gpt2"], TEXTS[0])


def test_every_form_gives_the_same_capture(gpt2_run):
    output, tokens, _ = gpt2_run
    reference = torch.stack([layer[0] for layer in output.attentions])  # [layer, head, q, k]
    forms = {
        "tuple": output.attentions,
        "output": output,
        "list of [head, q, k]": [layer[0] for layer in output.attentions],
        "numpy": [layer[0].numpy() for layer in output.attentions],
        "one array": reference.numpy(),
        "TransformerLens cache": {
            f"blocks.{i}.attn.hook_pattern": layer for i, layer in reversed(list(enumerate(output.attentions)))
        },
    }
    for form, attentions in forms.items():
        capture = AttentionCapture.from_attentions(attentions, tokens)
        assert torch.equal(capture.stacked("self"), reference), form
        assert capture.causal, form  # inferred from the empty upper triangle
        assert capture.special == [t in ("[CLS]", "[SEP]") for t in tokens] and capture.tokens == tokens
        assert capture.model == "external"


def test_batch_index_picks_one_example(gpt2_run):
    output, tokens, _ = gpt2_run
    batched = [torch.cat([layer, layer.flip(0)]) for layer in output.attentions]  # [2, head, q, k]
    with pytest.raises(InputError, match="batch_index"):
        AttentionCapture.from_attentions(batched, tokens)
    capture = AttentionCapture.from_attentions(batched, tokens, batch_index=1)
    assert torch.equal(capture.layer(0), output.attentions[0][0])
    with pytest.raises(InputError, match="out of range"):
        AttentionCapture.from_attentions(batched, tokens, batch_index=2)


def test_encoder_attention_is_not_causal_and_encoder_decoder_outputs_fill_three_stacks(tiny_model_dirs):
    output, tokens, _ = eager_run(tiny_model_dirs["bert"], TEXTS[0])
    assert not AttentionCapture.from_attentions(output.attentions, tokens).causal
    output, tokens, targets = eager_run(tiny_model_dirs["bart"], TEXTS[0], TEXTS[1])
    capture = AttentionCapture.from_attentions(output, tokens, target_tokens=targets, model="bart")
    assert capture.stacks == ["encoder", "decoder", "cross"]
    assert torch.equal(capture.layer(1, "cross"), output.cross_attentions[1][0])
    explicit = AttentionCapture.from_attentions(
        output.encoder_attentions, tokens, cross_attentions=output.cross_attentions, target_tokens=targets
    )
    assert explicit.stacks == ["encoder", "cross"]


def test_matches_a_capture_of_the_same_model(tiny_model_dirs):
    output, tokens, _ = eager_run(tiny_model_dirs["llama"], TEXTS[2])
    ours = attnviz.capture(attnviz.load_model(str(tiny_model_dirs["llama"]), device="cpu"), TEXTS[2])
    theirs = AttentionCapture.from_attentions(output.attentions, tokens)
    assert theirs.tokens == ours.tokens and theirs.causal == ours.causal
    assert float((theirs.stacked() - ours.stacked()).abs().max()) <= 1e-6
    assert torch.allclose(attnviz.rollout(theirs), attnviz.rollout(ours), atol=1e-6)


def test_file_format_and_views(gpt2_run, tmp_path):
    output, tokens, _ = gpt2_run
    capture = AttentionCapture.from_attentions(output.attentions, tokens)
    path = capture.save(tmp_path / "external.safetensors")
    loaded = AttentionCapture.load(path)
    assert torch.equal(loaded.stacked(), capture.stacked())
    assert (loaded.tokens, loaded.causal, loaded.word_ids) == (capture.tokens, capture.causal, capture.word_ids)
    for view in (attnviz.head_view(capture), attnviz.model_view(capture)):
        assert '"format":"attnviz-view"' in view.html and "srcdoc=" in view._repr_html_()


@pytest.mark.parametrize(
    ("attentions", "tokens", "message"),
    [
        ([torch.full((2, 3, 3), 1 / 3)], ["a", "b"], r"\[head, 3, 3\] but the tokens give \[head, 2, 2\]"),
        ([torch.rand(2, 3, 3) + 1], ["a", "b", "c"], "sums to .*, not 1"),
        ([torch.full((2, 3, 3), float("nan"))], ["a", "b", "c"], "NaN"),
        ([torch.full((2, 3), 0.5)], ["a", "b"], "give one"),
        ({"attn": torch.full((2, 3, 3), 1 / 3)}, ["a", "b", "c"], "no layer number"),
        ({"blocks.1.x": torch.full((2, 3, 3), 1 / 3)}, ["a", "b", "c"], r"not 0…0"),
        ([torch.ones(2, 3, 3, dtype=torch.long)], ["a", "b", "c"], "not attention weights"),
        ([], ["a"], "is empty"),
        ("patterns", ["a"], "one attention tensor per layer"),
        ([torch.full((1, 1, 1), 1.0)], "a", "list of token strings"),
        (np.full((3, 3), 1 / 3), ["a", "b", "c"], r"\[layer, head, query, key\]"),
        ([torch.zeros(0, 3, 3)], ["a", "b", "c"], r"has shape \[0, 3, 3\]: .* at least one head"),
        (torch.zeros(1, 0, 3, 3), ["a", "b", "c"], "at least one head"),
        (np.array([np.full((1, 3, 3), 1 / 3)], dtype=object), ["a", "b", "c"], "numpy array of object values"),
        ([np.full((1, 3, 3), "a")], ["a", "b", "c"], "array of <U1 values, not attention weights"),
        ([torch.full((1, 3, 3), 1 / 3).to_sparse()], ["a", "b", "c"], "is a sparse_coo tensor: give dense weights"),
        (torch.full((1, 1, 3, 3), 1 / 3).to_sparse(), ["a", "b", "c"], "sparse_coo tensor"),
    ],
)
def test_bad_attentions_get_one_clear_error(attentions, tokens, message):
    with pytest.raises(InputError, match=message):
        AttentionCapture.from_attentions(attentions, tokens)


def test_raw_byte_level_tokens_read_as_text():
    # tokenizer.convert_ids_to_tokens of a byte-level BPE: "␣café" and "␣bière" split as GPT-2 splits them
    raw = ["The", "ĠcafÃ©", "Ġbi", "Ã¨re", "Ġ", "ðŁĺ", "Ģ"]
    uniform = [torch.full((1, 7, 7), 1 / 7)]
    capture = AttentionCapture.from_attentions(uniform, raw)
    assert capture.tokens == ["The", "Ġcafé", "Ġbi", "ère", "Ġ", "😀", "◌"]
    assert capture.word_ids == [0, 1, 2, 2, 3, 3, 3]
    page = attnviz.head_view(uniform, raw).html
    assert "café" in page and "Ã" not in page
    # tokens that are not byte-level stand-ins stay as written (a WordPiece "café" is no UTF-8 byte string)
    assert AttentionCapture.from_attentions([torch.full((1, 2, 2), 0.5)], ["café", "##s"]).tokens == ["café", "##s"]


def test_cross_attention_needs_target_tokens_and_causal_must_fit(gpt2_run):
    output, tokens, _ = gpt2_run
    with pytest.raises(InputError, match="target_tokens"):
        AttentionCapture.from_attentions(output.attentions, tokens, cross_attentions=output.attentions)
    uniform = [torch.full((2, 3, 3), 1 / 3)]
    with pytest.raises(InputError, match="later tokens"):
        AttentionCapture.from_attentions(uniform, ["a", "b", "c"], causal=True)
    assert not AttentionCapture.from_attentions(output.attentions, tokens, causal=False).causal
