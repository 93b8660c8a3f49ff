"""The Python API under a notebook user's odd calls: a clear exception (AttnvizError, TypeError or ValueError) whose
message says what to do, and the user's objects as they were; or, where the call has an obvious meaning (bertviz's
``head_view(attention, tokens)``, an image as an array), the same result as the canonical call.

A Hypothesis suite draws attention tensors of random shapes, dtypes and devices with NaN, negative and
unnormalised rows: ``from_attentions`` and ``head_view`` either give the patterns back exactly or refuse them with
one of those exceptions, never changing the tensors given.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import attnviz
from attnviz import AttentionCapture
from attnviz.common.errors import AttnvizError

TEXT = "The cat sat on the mat."
ACTIONABLE = ("give", "pass", "load", "run", "call", "relabel", "capture", "use")


def assert_actionable(error: BaseException) -> None:
    message = str(error)
    assert "\n" not in message and any(word in message.lower() for word in ACTIONABLE), message


@pytest.fixture(scope="module")
def bert(tiny_model_dirs):
    directory = tiny_model_dirs["bert"]
    model = transformers.AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    encoded = tokenizer(TEXT, return_tensors="pt")
    with torch.no_grad():
        outputs = model(**encoded, output_attentions=True)
    return model, tokenizer, outputs.attentions, tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])


def test_head_view_takes_attentions_and_tokens_as_bertviz(bert):
    _, _, attentions, tokens = bert
    view = attnviz.head_view(attentions, tokens)
    assert view.html == attnviz.head_view(AttentionCapture.from_attentions(attentions, tokens)).html
    assert attnviz.model_view(attentions, tokens).html.startswith("<!DOCTYPE html>")
    with pytest.raises(TypeError, match="tokens") as error:
        attnviz.head_view(attentions)
    assert_actionable(error.value)


def test_head_view_of_a_capture_whose_tokens_were_edited(bert):
    _, _, attentions, tokens = bert
    capture = AttentionCapture.from_attentions(attentions, tokens)
    capture.tokens.append("extra")
    before = list(capture.tokens)
    with pytest.raises(AttnvizError, match="changed after the capture was made") as error:
        attnviz.head_view(capture)
    assert_actionable(error.value)
    assert "never arrived" not in str(error.value) and capture.tokens == before


def test_wrapped_model_on_the_meta_device(bert):
    model, tokenizer, _, _ = bert
    copy_of_model = copy.deepcopy(model)
    wrapped = attnviz.wrap(copy_of_model, tokenizer)
    copy_of_model.to("meta")
    implementation = copy_of_model.config._attn_implementation
    with pytest.raises(AttnvizError, match="meta device") as error:
        attnviz.capture(wrapped, TEXT)
    assert_actionable(error.value)
    assert copy_of_model.config._attn_implementation == implementation and copy_of_model.training is False


def test_wrap_of_a_model_whose_embedding_is_smaller_than_its_vocabulary(bert):
    _, tokenizer, _, _ = bert
    config = transformers.BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=64)  # fmt: skip
    small = transformers.BertModel(config).eval()
    state = {name: tensor.clone() for name, tensor in small.state_dict().items()}
    with pytest.raises(AttnvizError, match="1,000 rows") as error:
        attnviz.wrap(small, tokenizer)
    assert_actionable(error.value)
    assert all(torch.equal(state[name], tensor) for name, tensor in small.state_dict().items())


@pytest.fixture(scope="module")
def vit(tiny_vision_dirs):
    return attnviz.load_model(str(tiny_vision_dirs["vit"]), device="cpu")


def test_capture_of_an_image_takes_arrays_and_pil_images(vit):
    pixels = np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    reference = attnviz.capture(vit, Image.fromarray(pixels))
    for form in (pixels, pixels / 255.0, torch.from_numpy(pixels).permute(2, 0, 1)):
        given = form.clone() if isinstance(form, torch.Tensor) else form.copy()
        result = attnviz.capture(vit, form)
        assert torch.equal(result.stacked(), reference.stacked())
        assert (given == form).all()  # the user's array is left as it was
    for bad, kind in ((pixels * 2.0, ValueError), (pixels[..., :2], ValueError), (42, TypeError)):
        with pytest.raises(kind) as error:
            attnviz.capture(vit, bad)
        assert_actionable(error.value)


# -- random attention tensors ------------------------------------------------------------------------------


@st.composite
def attention_inputs(draw):
    layers, heads, tokens = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 5))
    shape = draw(
        st.sampled_from(
            [
                ("tuple", (1, heads, tokens, tokens)),
                ("tuple", (2, heads, tokens, tokens)),
                ("stacked", (layers, heads, tokens, tokens)),
                ("stacked5", (layers, 1, heads, tokens, tokens)),
                ("one-layer", (heads, tokens, tokens)),
                ("tuple", (heads, tokens)),
            ]
        )
    )
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64]))
    device = draw(st.sampled_from(["cpu", "meta"]))
    damage = draw(st.sampled_from(["none", "nan", "negative", "unnormalised", "scores"]))
    extra_tokens = draw(st.sampled_from([0, 0, 0, 1, -1]))
    form, size = shape
    values = torch.rand(size, generator=torch.Generator().manual_seed(draw(st.integers(0, 1000)))).softmax(-1)
    if damage == "nan":
        values[..., 0] = float("nan")
    elif damage == "negative":
        values[..., 0] = -0.25
    elif damage == "unnormalised":
        values = values * 1.5
    elif damage == "scores":
        values = values.log()
    values = values.to(dtype).to(device)
    given = tuple(values) if form == "tuple" else values
    return given, values, max(1, tokens + extra_tokens), form


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(case=attention_inputs())
def test_random_attentions_give_their_patterns_or_a_clear_error(case):
    given, values, count, form = case
    tokens = [f"t{i}" for i in range(count)]
    before = values.clone() if values.device.type != "meta" else None
    try:
        capture = AttentionCapture.from_attentions(given, tokens)
    except (AttnvizError, TypeError, ValueError) as error:
        assert_actionable(error)
        if before is not None:
            assert torch.equal(before.nan_to_num(7.0), values.nan_to_num(7.0))  # the input is left as it was
        return
    expected = values.float()
    # "tuple": one [head, q, k] layer per entry; "stacked5": [layer, batch of 1, head, q, k]
    layers = [expected] if form == "one-layer" else list(expected[:, 0] if form == "stacked5" else expected)
    for index, layer in enumerate(layers):
        assert torch.equal(capture.layer(index), layer)
    assert isinstance(attnviz.head_view(capture).html, str)
