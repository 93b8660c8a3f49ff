"""Mllama: a text reading its picture through cross-attention layers between its self-attention layers. Its text's
self-attention (stack ``decoder``) and cross-attention over the picture's tiles (stack ``cross``), numbered by the
model's own layers, against transformers' eager attention; the tiles on the picture; the captioning view; statistics,
patching and norm weighting; refusals by name."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli
from tiny_vision import sample_images
from tiny_vlm import build_tiny_vlm

import attnviz
from attnviz.captures.result import AttentionCapture
from attnviz.captures.vision_language import caption_view, vision_language_batch
from attnviz.core import AttentionSite

#: the tiny model: self-attention layers 0 and 2, cross-attention layer 1
STACK_OF_LAYER = {0: "decoder", 1: "cross", 2: "decoder"}


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return build_tiny_vlm("mllama", tmp_path_factory.mktemp("mllama") / "mllama")


@pytest.fixture(scope="module")
def loaded(directory):
    return attnviz.load_model(str(directory), device="cpu")


@pytest.fixture(scope="module")
def wide():
    """A picture twice as wide as high: cut into 1×2 tiles of the 4 the model has room for."""
    return sample_images(1, seed=3, size=40)[0].resize((40, 20))


def eager(directory, inputs: dict):
    import transformers

    model = transformers.AutoModelForImageTextToText.from_pretrained(directory, attn_implementation="eager").eval()
    with torch.no_grad():
        return model, model(**inputs, output_attentions=True)


def test_capture_equals_eager_in_both_stacks_and_maps_the_tiles(tmp_path, directory, loaded, wide):
    prompt = "look: <|image|> a red cat"
    result = attnviz.capture(loaded, prompt, image=wide)
    batch = vision_language_batch(loaded, [prompt], [wide])
    _, outputs = eager(directory, batch.inputs)
    assert len(outputs.attentions) == 3 and loaded.stacks() == ("decoder", "cross")
    assert result.attention_layers("decoder") == [0, 2] and result.attention_layers("cross") == [1]
    for layer, reference in enumerate(outputs.attentions):  # [1, h, text, text] or [1, h, text, picture keys]
        assert float((result.layer(layer, STACK_OF_LAYER[layer]) - reference[0]).abs().max()) <= 1e-5
    with torch.no_grad():
        logits = loaded.forward(batch, logits=True).logits
    assert float((logits - outputs.logits).abs().max()) <= 1e-4
    grid = result.image_grid
    # 2 tiles of 2×2 patches (8 pixels) side by side: a 2×4 grid; each tile's class token first; 2 empty tiles
    assert (grid.rows, grid.cols, grid.tiles, grid.padding, grid.patch_size) == (2, 4, (1, 2), 10, (8, 8))
    assert result.tokens[:10] == ["[CLS]0", "r0c0", "r0c1", "r1c0", "r1c1", "[CLS]1", "r0c2", "r0c3", "r1c2", "r1c3"]
    assert result.tokens[10:] == ["[PAD]"] * 10 and result.extras["image"].shape == (16, 32, 3)
    assert result.target_tokens[grid.placeholder] == "<|image|>" and grid.placeholder > 1  # after BOS and "look:"
    # a token before the placeholder reads no tile: its row is left unmasked, over every key, the empty tiles' too
    before = result.layer(1, "cross")[:, 0]  # [h, keys]
    assert float(before[:, 10:].min()) > 0 and torch.allclose(before.sum(-1), torch.ones(()))
    after = result.layer(1, "cross")[:, grid.placeholder :]  # [h, text from the placeholder, keys]
    assert float(after[..., 10:].abs().max()) == 0.0 and torch.allclose(after.sum(-1), torch.ones(()))
    saved = AttentionCapture.load(result.save(tmp_path / "tiles.safetensors"))
    assert saved.image_grid == grid and torch.equal(saved.layer(1, "cross"), result.layer(1, "cross"))


def test_caption_view_puts_the_keys_on_the_canvas(loaded, wide):
    from attnviz.render.caption_overlay import peak_patches

    result = attnviz.capture(loaded, "a red cat", image=wide)
    view = caption_view(result)
    grid = result.image_grid
    first = grid.placeholder + 2  # the placeholder, then the BOS the processor puts after it
    assert view.target_tokens == result.target_tokens[first - 1 :]
    assert view.tokens == ["[CLS]0", "[CLS]1"] + [f"r{row}c{col}" for row in range(2) for col in range(4)]
    order = [0, 5, 1, 2, 6, 7, 3, 4, 8, 9]  # the tiles' class tokens, then the canvas row-major
    expected = result.layer(1, "cross")[:, first - 1 : -1][:, :, order]  # [head, written, picture key]
    assert torch.equal(view.layer(1, "cross"), expected)
    strongest = expected[:, :, 2:].amax(dim=0)  # [written, patch]
    assert [divmod(int(row.argmax()), 4) for row in strongest] == [patch for _, patch in peak_patches(result)]


def test_statistics_equal_the_captures(loaded):
    """Every head's mean entropy over the texts' queries, in both stacks, equals the captures'."""
    from attnviz.stats.definitions import STATISTIC_NAMES

    texts = ["a red cat", "the blue car by the sea"]
    pictures = sample_images(2, seed=8, size=40)
    stats = attnviz.compute_statistics(loaded, texts, images=pictures, progress=False)
    captures = [attnviz.capture(loaded, text, image=image) for text, image in zip(texts, pictures)]
    entropy = STATISTIC_NAMES.index("entropy")
    assert stats.picture is None and set(stats.sites) == {AttentionSite(s, n) for n, s in STACK_OF_LAYER.items()}
    for layer, stack in STACK_OF_LAYER.items():
        rows = [c.layer(layer, stack).double() for c in captures]  # each [h, query, keys]
        entropies = torch.cat([-(row * row.clamp(min=1e-300).log()).sum(-1) for row in rows], dim=1)  # [h, queries]
        expected = entropies.mean(1)  # [h]
        assert torch.allclose(stats.sites[AttentionSite(stack, layer)].mean[entropy], expected, atol=1e-5)


def test_patching_equals_a_plain_hook_on_each_output_projection(directory, loaded, wide):
    """Each patched logit difference, self- and cross-attention heads alike, equals a corrupt run whose ``o_proj``
    input gets the clean run's columns of that head."""
    clean, corrupt, answer, wrong = "a red cat", "a red mat", "a", "s"
    result = attnviz.patch_heads(loaded, clean=clean, corrupt=corrupt, answer=answer, wrong=wrong, image=wide)
    pair = vision_language_batch(loaded, [clean, corrupt], [wide, wide])
    model, _ = eager(directory, {name: value[:1] for name, value in pair.inputs.items()})
    layers = model.model.language_model.layers
    attention = {index: getattr(layer, "cross_attn", None) or layer.self_attn for index, layer in enumerate(layers)}
    heard: dict[int, torch.Tensor] = {}
    hooks = [
        module.o_proj.register_forward_pre_hook(lambda _, args, i=i: heard.__setitem__(i, args[0].clone()))
        for i, module in attention.items()
    ]
    with torch.no_grad():
        model(**{name: value[:1] for name, value in pair.inputs.items()})
    for hook in hooks:
        hook.remove()
    ids = [loaded.tokenizer.convert_tokens_to_ids(token) for token in (answer, wrong)]
    assert {(effect.stack, effect.layer) for effect in result.heads} == {(s, n) for n, s in STACK_OF_LAYER.items()}
    for effect in result.heads:
        columns = slice(effect.head * 12, (effect.head + 1) * 12)

        def patch(_, args, clean_input=heard[effect.layer], columns=columns):
            patched = args[0].clone()
            patched[..., columns] = clean_input[..., columns]
            return (patched,)

        hook = attention[effect.layer].o_proj.register_forward_pre_hook(patch)
        with torch.no_grad():
            logits = model(**{name: value[1:] for name, value in pair.inputs.items()}).logits[0, -1]
        hook.remove()
        assert abs(float(logits[ids[0]] - logits[ids[1]]) - effect.patched_logit_diff) <= 1e-4
    assert result.decoder_tokens[-3:] == ["Ġ", "re", "d"] or result.decoder_tokens[-1] == "at"


def test_norm_weighting_is_weight_times_the_moved_vector(directory, loaded, wide):
    """``α_ij·‖W_O^h v_j^h‖`` in both stacks, the values read by a plain hook on ``v_proj`` (a cross-attention
    layer's from the picture's keys)."""
    normed = attnviz.capture(loaded, "a red cat", image=wide, weighting="norm")
    batch = vision_language_batch(loaded, ["a red cat"], [wide])
    model, _ = eager(directory, batch.inputs)
    layers = model.model.language_model.layers
    attention = {index: getattr(layer, "cross_attn", None) or layer.self_attn for index, layer in enumerate(layers)}
    values: dict[int, torch.Tensor] = {}
    hooks = [
        module.v_proj.register_forward_hook(lambda _, __, out, i=i: values.__setitem__(i, out))
        for i, module in attention.items()
    ]
    with torch.no_grad():
        outputs = model(**batch.inputs, output_attentions=True)
    for hook in hooks:
        hook.remove()
    for index, module in attention.items():
        value = values[index].reshape(-1, 2, 12)  # [k, kv heads, d] (a cross layer's: [tiles, keys per tile, …])
        weight = module.o_proj.weight.detach()  # [width, heads × d]
        norms = torch.stack(
            [(value[:, head // 2] @ weight[:, head * 12 : (head + 1) * 12].T).norm(dim=-1) for head in range(4)]
        )  # [h, k]
        expected = outputs.attentions[index][0] * norms[:, None, :]  # [h, q, k]
        got = normed.layer(index, STACK_OF_LAYER[index])
        assert float((got - expected).abs().max()) <= 1e-4


def test_command_line_draws_each_word_on_the_tiles_and_refuses_what_it_cannot(capsys, tmp_path, directory, wide):
    image = tmp_path / "wide.png"
    wide.save(image)
    figure = tmp_path / "words.png"
    result = run_cli(capsys, "heatmap", "--model", directory, "a red cat", "--image", image, "--out", figure)
    assert result.exit_code == 0, result.stderr
    assert figure.stat().st_size > 0
    picture_keys = len(
        attnviz.capture(attnviz.load_model(str(directory), device="cpu"), "a red cat", image=wide).tokens
    )
    summary = " ".join(result.stderr.split())  # rich may wrap the line
    assert f"(image → text) · {picture_keys} picture tokens → " in summary
    page = tmp_path / "words.html"
    result = run_cli(capsys, "heatmap", "--model", directory, "a red cat", "--image", image, "--out", page)
    assert result.exit_code == 0, result.stderr
    result = run_cli(capsys, "heatmap", "--model", directory, "a red cat", "--out", tmp_path / "text.png")
    assert_clean_error(result, "reads a text with its picture")
    written = tmp_path / "written.png"
    result = run_cli(capsys, "heatmap", "--model", directory, "a red", "--image", image, "--generate", "3", "--out",
                     written)  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "written:" in result.stderr and written.stat().st_size > 0
    loaded = attnviz.load_model(str(directory), device="cpu")
    with pytest.raises(attnviz.AttnvizError, match="reads a text with its picture"):
        attnviz.generate(loaded, "a red", max_new_tokens=2)
    # its language model's positions (128) bound what it can write: refused before it runs
    with pytest.raises(attnviz.AttnvizError, match="new tokens exceed the model's 128 positions"):
        attnviz.generate(loaded, "a red", image=wide, max_new_tokens=1000)


def test_writing_equals_transformers_generate_and_the_teacher_forced_capture(directory, loaded, wide):
    """``attnviz.generate`` with the picture writes the tokens transformers' greedy ``generate`` writes (each new
    token reads the picture through the cross-attention layers as the prompt's last token does), and every step's
    rows equal one eager run over the prompt and the written tokens."""
    import transformers

    prompt = "<|image|>a red cat"
    written = attnviz.generate(loaded, prompt, image=wide, max_new_tokens=4)
    batch = vision_language_batch(loaded, [prompt], [wide])
    model = transformers.AutoModelForImageTextToText.from_pretrained(directory, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = model.generate(**batch.inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    prompt_len = batch.inputs["input_ids"].shape[1]
    assert written.token_ids == expected[0, prompt_len:].tolist()
    capture = written.capture
    assert capture.generated_from == prompt_len and len(capture.target_tokens) == prompt_len + 4
    assert capture.tokens == attnviz.capture(loaded, prompt, image=wide).tokens  # the picture's keys
    rows = batch.inputs["cross_attention_mask"]  # [1, q, pictures, tiles]: the written tokens repeat the last row
    forced = dict(batch.inputs, input_ids=expected, attention_mask=torch.ones_like(expected))
    forced["cross_attention_mask"] = torch.cat([rows, rows[:, -1:].expand(1, 4, *rows.shape[2:])], dim=1)
    with torch.no_grad():
        outputs = model(**forced, output_attentions=True)
    for layer, reference in enumerate(outputs.attentions):  # [1, h, q, k]
        assert float((capture.layer(layer, STACK_OF_LAYER[layer]) - reference[0]).abs().max()) <= 1e-5
    assert caption_view(capture).target_tokens[-4:] == capture.target_tokens[-4:]
