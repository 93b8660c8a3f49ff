"""Toy transformers end to end: masks in real forward passes, head masks vs. physical pruning, checkpoints, errors."""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from attnviz.captures.attention_capture import PatternRecorder, capture
from attnviz.common.errors import InputError, ModelSpecError, OutputError
from attnviz.core import AttentionSite, HeadMask
from attnviz.models.specs import load_model
from attnviz.toy import (
    VARIANT_NAMES,
    ToyConfig,
    build_toy_model,
    load_toy_model,
    prune_toy_heads,
    save_toy_model,
)
from attnviz.toy.tasks import get_task
from attnviz.toy.tokenizer import ToyTokenizer

SMALL = {
    "width": 24,
    "num_heads": 3,
    "num_layers": 2,
    "mlp_width": 32,
    "window": 1,
    "stride": 2,
    "block_size": 2,
    "num_features": 8,
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _model(task="reverse", attention="scaled-dot", architecture=None, seed=0):
    torch.manual_seed(seed)
    loaded = build_toy_model(task, architecture=architecture, attention=attention, **SMALL)
    for parameter in loaded.model.parameters():  # random weights large enough to give peaked patterns
        parameter.data.normal_(0, 0.3)
    return loaded


def _patterns(loaded, batch, head_mask=None):
    recorder = PatternRecorder()
    with torch.no_grad():
        output = loaded.forward(batch, loaded.context([recorder], head_mask))
    return recorder.patterns, output


# -- masks in real forward passes --------------------------------------------------------------------


@pytest.mark.parametrize("attention", VARIANT_NAMES)
@pytest.mark.parametrize("architecture", ["decoder", "encoder-decoder"])
def test_patterns_respect_causal_and_padding_masks(attention, architecture):
    loaded = _model("copy", attention, architecture)
    batch = loaded.encode(["3 1 4 1 5 9", "2 7"], targets=["3 1 4 1 5 9", "2 7"])
    patterns, _ = _patterns(loaded, batch)
    assert {site.stack for site in patterns} == set(loaded.stacks())
    for site, pattern in patterns.items():  # [b, h, q, k]
        query_lengths, key_lengths = batch.query_key_lengths(site.stack)
        causal = site.stack == "decoder" or (site.stack == "self" and loaded.causal)
        for example in range(2):
            q, k = query_lengths[example], key_lengths[example]
            real = pattern[example, :, :q]  # [h, q, k]: rows of real queries
            torch.testing.assert_close(real.sum(-1), torch.ones(real.shape[:2]), atol=1e-5, rtol=0)
            assert float(real[:, :, k:].abs().sum()) == 0.0, "padding keys must get zero weight"
            if causal:
                future = torch.ones(q, real.shape[-1], dtype=torch.bool).triu(1)
                assert float(real[:, future].abs().sum()) == 0.0, "causal rows must put zero weight on the future"


@pytest.mark.parametrize("attention", VARIANT_NAMES)
def test_padding_does_not_change_an_example(attention):
    loaded = _model("reverse", attention)
    alone = loaded.encode(["2 7"], targets=["7 2"])
    padded = loaded.encode(["2 7", "3 1 4 1 5 9"], targets=["7 2", "9 5 1 4 1 3"])
    with torch.no_grad():
        single = loaded.forward(alone).logits[0]
        batched = loaded.forward(padded).logits[0, : single.shape[0]]
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-4)


def test_capture_of_an_encoder_decoder_toy_model():
    loaded = _model("reverse")
    result = capture(loaded, "3 1 4 1 5", target="5 1 4 1 3")
    assert result.tokens == ["3", "1", "4", "1", "5", "<eos>"]
    assert result.target_tokens == ["<bos>", "5", "1", "4", "1", "3"]
    assert result.stacks == ["encoder", "decoder", "cross"]
    assert result.layer(1, "cross").shape == (3, 6, 6)
    assert result.special == [False] * 5 + [True]
    assert loaded.layout() == {AttentionSite(s, l): 3 for s in ("cross", "decoder", "encoder") for l in range(2)}
    # without a target the decoder reads the model's own greedy answer
    generated = capture(loaded, "3 1 4")
    assert generated.target_tokens[0] == "<bos>" and 1 <= len(generated.target_tokens) <= 5


def test_encode_errors_are_clear():
    loaded = _model("reverse")
    with pytest.raises(InputError, match="unknown symbol 'x'"):
        loaded.encode(["3 x 4"])
    with pytest.raises(InputError, match="adds special tokens itself"):
        loaded.encode(["3 <eos> 4"])
    with pytest.raises(InputError, match="more than the"):
        loaded.encode([" ".join(["1"] * 40)], truncate=False)
    truncated = loaded.encode([" ".join(["1"] * 40)], targets=["1"])
    assert truncated.truncated == [True] and len(truncated.tokens[0]) == loaded.max_length
    induction = _model("induction", architecture="decoder")
    with pytest.raises(InputError, match="reads one sequence"):
        induction.encode(["a b"], targets=["b a"])
    assert induction.encode(["abcabc"]).tokens[0] == ["<bos>", "a", "b", "c", "a", "b", "c"]


# -- tasks -----------------------------------------------------------------------------------------------


def test_task_layouts_and_labels():
    reverse = get_task("reverse")
    example = reverse.example("encoder-decoder", ["3", "1", "4"])
    assert (example.source, example.target, example.labels) == (
        ["3", "1", "4", "<eos>"],
        ["<bos>", "4", "1", "3"],
        ["4", "1", "3", "<eos>"],
    )
    copy = get_task("copy").example("decoder", ["3", "1"])
    assert copy.source == ["<bos>", "3", "1", "<sep>", "3", "1"]
    assert copy.labels == [None, None, None, "3", "1", "<eos>"]
    assert get_task("sort").answer(["10", "2", "7", "2"]) == ["2", "2", "7", "10"]
    assert get_task("previous-token").labels(["<bos>", "a", "b"]) == [None, "<bos>", "a"]
    induction = get_task("induction").labels(["<bos>", "a", "b", "c", "a", "b", "c"])
    assert induction == [None, None, None, None, "b", "c", None]


def test_task_batch_is_seeded_and_labelled():
    loaded = _model("sort")
    first, again, other = loaded.task_batch(8, seed=1), loaded.task_batch(8, seed=1), loaded.task_batch(8, seed=2)
    assert first.tokens == again.tokens and first.tokens != other.tokens
    labels = first.inputs["labels"]
    assert labels.shape == first.inputs["decoder_input_ids"].shape
    metrics = loaded.task_metrics(first)
    assert set(metrics) >= {"loss", "accuracy", "sequence_accuracy"} and 0 <= metrics["accuracy"] <= 1
    assert metrics["tokens"] == sum(len(t) for t in first.target_tokens)  # every decoder position is scored


def test_task_loss_is_differentiable_in_a_head_mask():
    loaded = _model("reverse")
    batch = loaded.task_batch(4, seed=0)
    xi = {site: torch.ones(h, requires_grad=True) for site, h in loaded.layout().items()}
    loss = loaded.task_loss(batch, loaded.context([], HeadMask(xi)))
    loss.backward()
    assert loss.dim() == 0
    assert all(t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0 for t in xi.values())


# -- pruning -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attention", ["scaled-dot", "general", "additive", "relative", "bigbird", "performer"])
def test_physical_pruning_equals_head_masking(attention, tmp_path):
    loaded = _model("reverse", attention)
    remove = {
        AttentionSite("encoder", 0): [1],
        AttentionSite("cross", 1): [0, 2],
        AttentionSite("decoder", 1): [0, 1, 2],
    }
    masks = {}
    for site, heads in loaded.layout().items():
        mask = torch.ones(heads)
        mask[remove.get(site, [])] = 0.0
        masks[site] = mask
    batch = loaded.task_batch(6, seed=3)
    with torch.no_grad():
        masked = loaded.forward(batch, loaded.context([], HeadMask(masks))).logits
    pruned = prune_toy_heads(loaded, remove)
    with torch.no_grad():
        physical = pruned.forward(batch).logits
    torch.testing.assert_close(physical, masked, atol=1e-5, rtol=1e-5)
    before = sum(p.numel() for p in loaded.model.parameters())
    after = sum(p.numel() for p in pruned.model.parameters())
    assert after < before
    assert pruned.layout()[AttentionSite("cross", 1)] == 1 and pruned.layout()[AttentionSite("decoder", 1)] == 0
    assert loaded.layout()[AttentionSite("cross", 1)] == 3  # the original is untouched
    # saved, it reloads through the model-spec loader with the new shapes
    path = save_toy_model(pruned, tmp_path / "pruned")
    reloaded = load_model(str(path), device="cpu")
    with torch.no_grad():
        torch.testing.assert_close(reloaded.forward(batch).logits, physical, atol=1e-6, rtol=0)
    assert reloaded.config.heads_per_layer["cross"] == [3, 1]
    assert reloaded.metadata["pruned"]["parameters_after"] == after


def test_pruning_rejects_unknown_sites_and_heads():
    loaded = _model("reverse")
    with pytest.raises(InputError, match="no attention site self.0"):
        prune_toy_heads(loaded, {AttentionSite("self", 0): [0]})
    with pytest.raises(InputError, match="heads 0–2"):
        prune_toy_heads(loaded, {AttentionSite("cross", 0): [3]})


# -- checkpoints ------------------------------------------------------------------------------------------------


def test_checkpoint_round_trip(tmp_path):
    loaded = _model("induction", "longformer")
    path = save_toy_model(loaded, tmp_path / "ckpt")
    assert (path / "attnviz-toy.json").is_file() and (path / "model.safetensors").is_file()
    reloaded = load_model(str(path), device="cpu")
    assert reloaded.task == "induction" and reloaded.causal and not reloaded.encoder_decoder
    batch = loaded.task_batch(3, seed=0)
    with torch.no_grad():
        torch.testing.assert_close(reloaded.forward(batch).logits, loaded.forward(batch).logits, atol=0, rtol=0)
    half = load_toy_model(path, dtype=torch.bfloat16)
    assert half.model.lm_head.weight.dtype == torch.bfloat16
    assert torch.isfinite(half.forward(half.task_batch(2, seed=0)).logits.float()).all()
    with pytest.raises(OutputError, match="loaded from"):
        save_toy_model(reloaded, path)


def _damage(path, how):
    marker, weights = path / "attnviz-toy.json", path / "model.safetensors"
    if how == "json":
        marker.write_text("{not json")
    elif how == "format":
        marker.write_text(json.dumps({"format": "something-else"}))
    elif how == "config":
        document = json.loads(marker.read_text())
        document["config"]["num_heads"] = 5
        marker.write_text(json.dumps(document))
    elif how == "missing":
        weights.unlink()
    elif how == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    elif how == "flipped":
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif how == "shapes":
        document = json.loads(marker.read_text())
        document["config"]["width"] = 30
        document.pop("weights_sha256")
        marker.write_text(json.dumps(document))


@pytest.mark.parametrize("how", ["json", "format", "config", "missing", "truncated", "flipped", "shapes"])
def test_corrupted_checkpoint_is_one_clear_error(tmp_path, how):
    path = save_toy_model(_model("reverse"), tmp_path / "ckpt")
    _damage(path, how)
    with pytest.raises(ModelSpecError, match="damaged attnviz toy checkpoint") as error:
        load_model(str(path), device="cpu")
    assert "\n" not in str(error.value)


def test_checkpoint_output_is_checked(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(OutputError, match="not an attnviz toy checkpoint"):
        save_toy_model(_model("reverse"), tmp_path / "notes")
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"
    with pytest.raises(OutputError, match="does not exist"):
        save_toy_model(_model("reverse"), tmp_path / "missing" / "ckpt")


# -- configuration errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"width": 30, "num_heads": 4}, "4 heads do not divide the width 30"),
        ({"window": -1}, "window must be 0 or more"),
        ({"attention": "flash"}, "unknown attention variant 'flash'"),
        ({"architecture": "rnn"}, "unknown architecture 'rnn'"),
        ({"heads_per_layer": {"cross": [1, 1]}}, "names stack 'cross'"),
    ],
)
def test_config_errors(fields, message):
    with pytest.raises(InputError, match=message):
        ToyConfig(**fields).validate()


def test_task_and_tokenizer_errors():
    with pytest.raises(InputError, match="unknown task 'add'.*copy, reverse, sort, previous-token, induction"):
        build_toy_model("add")
    with pytest.raises(InputError, match="does not fit the encoder-decoder architecture"):
        build_toy_model("induction", architecture="encoder-decoder")
    with pytest.raises(InputError, match="cannot exceed the number of symbols"):
        build_toy_model("induction", max_length=30)
    with pytest.raises(InputError, match="distinct"):
        ToyTokenizer(["a", "a"])
    assert ToyTokenizer(["10", "11"]).split("10 11") == ["10", "11"]
