"""Vision-language models (LLaVA, PaliGemma): the language model's attention over a text with a picture in it,
against transformers' own eager attention; the image tokens on the picture's patch grid; the captioning view, while
writing too; the command line; refusals by name."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli
from figure_helpers import read_svg
from tiny_vision import sample_images
from tiny_vlm import build_tiny_vlm, picture_shares

import attnviz
from attnviz.captures.result import AttentionCapture
from attnviz.captures.vision_language import caption_view, vision_language_batch
from attnviz.core import AttentionSite

#: family -> a prompt (the picture where it names ``<image>``; PaliGemma puts it first, then its BOS and the text)
PROMPTS = {
    "llava": "USER: <image>\na red cat",
    "llava-full": "a red <image> cat",
    "paligemma": "a red cat",
    "gemma3": "look: <start_of_image> a red cat",  # the processor wraps the picture in line breaks and its markers
    "idefics3": "look: <image> a red cat",  # … and Idefics3 in its own markers
}
#: what the processor writes before the picture's first token, after the text before the placeholder
OPENING = {"gemma3": "\n\n<start_of_image>", "idefics3": "<fake_token_around_image><global-img>"}


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlms")
    return {
        "llava": build_tiny_vlm("llava", root / "llava"),
        "llava-full": build_tiny_vlm("llava", root / "llava-full", strategy="full"),
        "paligemma": build_tiny_vlm("paligemma", root / "paligemma"),
        "gemma3": build_tiny_vlm("gemma3", root / "gemma3"),
        "idefics3": build_tiny_vlm("idefics3", root / "idefics3"),
    }


@pytest.fixture(scope="module")
def picture():
    return sample_images(1, seed=3, size=40)[0]


def eager_outputs(directory, inputs: dict):
    """transformers' own eager attention and logits of the model in ``directory`` on processed ``inputs``."""
    import transformers

    model = transformers.AutoModelForImageTextToText.from_pretrained(directory, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(**inputs, output_attentions=True)


@pytest.mark.parametrize("family", list(PROMPTS))
def test_capture_equals_eager_and_maps_the_image_tokens(vlm_dirs, picture, family):
    loaded = attnviz.load_model(str(vlm_dirs[family]), device="cpu")
    prompt = PROMPTS[family]
    marker = "<start_of_image>" if family == "gemma3" else "<image>"
    before, _, _ = prompt.rpartition(marker)  # the picture's tokens come right after the text before it
    before += OPENING.get(family, "")  # … and what the processor writes before them
    start = len(loaded.tokenizer(before, add_special_tokens=False)["input_ids"]) if before else 0
    result = attnviz.capture(loaded, prompt, image=picture)
    batch = vision_language_batch(loaded, [prompt], [picture])
    outputs = eager_outputs(vlm_dirs[family], batch.inputs)
    assert result.num_layers() == len(outputs.attentions) == 2
    for layer, reference in enumerate(outputs.attentions):  # [1, h, q, k]
        assert float((result.layer(layer) - reference[0]).abs().max()) <= 1e-5
    with torch.no_grad():
        logits = loaded.forward(batch, logits=True).logits
    assert float((logits - outputs.logits).abs().max()) <= 1e-4
    # the picture's tokens: where the processor put the image token, one per patch of the 4×4 grid of the 32-pixel
    # picture in 8-pixel patches, row-major (LLaVA's "full" strategy keeps CLIP's class token before them)
    grid = result.image_grid
    extra = ("cls",) if family == "llava-full" else ()
    # Gemma 3 pools the 4×4 patches onto 2×2 tokens, Idefics3 merges each 2×2 block (pixel shuffle)
    side, patch = (2, 16) if family in ("gemma3", "idefics3") else (4, 8)
    shape = (grid.rows, grid.cols, grid.patch_size, grid.extra_kinds, grid.start)
    assert shape == (side, side, (patch, patch), extra, start)
    ids = batch.inputs["input_ids"][0].tolist()
    image_id = loaded.model.config.image_token_id
    assert [position for position, token in enumerate(ids) if token == image_id] == list(grid.positions)
    labels = result.tokens[grid.start : grid.start + grid.num_tokens]
    assert labels == ["[CLS]"] * len(extra) + [f"r{row}c{col}" for row in range(side) for col in range(side)]
    assert result.extras["image"].shape == (32, 32, 3)


def test_paligemma_picture_and_prefix_attend_both_ways(vlm_dirs, picture):
    """PaliGemma's picture and prompt are a bidirectional prefix: a patch attends to later patches, which a causal
    mask would hide; attnviz says the model is not causal everywhere."""
    loaded = attnviz.load_model(str(vlm_dirs["paligemma"]), device="cpu")
    result = attnviz.capture(loaded, "a red cat", image=picture)
    assert not loaded.causal and not result.causal
    assert float(result.layer(0)[:, 0, 1:16].sum()) > 0.1
    llava = attnviz.capture(attnviz.load_model(str(vlm_dirs["llava"]), device="cpu"), "a red cat", image=picture)
    assert llava.causal and float(torch.triu(llava.layer(0), diagonal=1).abs().max()) == 0.0


def test_caption_view_is_each_written_tokens_row_over_the_image(vlm_dirs, picture):
    loaded = attnviz.load_model(str(vlm_dirs["llava"]), device="cpu")
    result = attnviz.capture(loaded, "USER: <image>\na red cat", image=picture)
    view = caption_view(result)
    grid = result.image_grid
    after = grid.start + grid.num_tokens  # the first token after the picture, written by the last image token
    assert view.target_tokens == result.tokens[after - 1 :]
    assert view.tokens == result.tokens[grid.start : after] and view.image_grid.start == 0
    for layer in range(2):
        expected = result.layer(layer)[:, after - 1 : -1, grid.start : after]  # [head, written, image token]
        assert torch.equal(view.layer(layer, "cross"), expected)
    from attnviz.render.caption_overlay import peak_patches

    peaks = peak_patches(result)
    strongest = result.layer(-1)[:, after - 1 : -1, grid.start : after].amax(dim=0)  # [written, patch]
    assert [divmod(int(row.argmax()), 4) for row in strongest] == [patch for _, patch in peaks]


def test_generation_with_a_picture_equals_eager_on_the_written_text(vlm_dirs, picture):
    loaded = attnviz.load_model(str(vlm_dirs["llava"]), device="cpu")
    written = attnviz.generate(loaded, "a red cat", image=picture, max_new_tokens=3)
    batch = vision_language_batch(loaded, ["a red cat"], [picture])
    ids = torch.cat([batch.inputs["input_ids"], torch.tensor([written.token_ids])], dim=1)  # [1, prompt + written]
    inputs = {**batch.inputs, "input_ids": ids, "attention_mask": torch.ones_like(ids)}
    outputs = eager_outputs(vlm_dirs["llava"], inputs)
    length = ids.shape[1]
    capture = written.capture
    assert capture.generated_from == batch.inputs["input_ids"].shape[1] and capture.image_grid == batch.image_grid
    for layer, reference in enumerate(outputs.attentions):
        assert float((capture.layer(layer)[:, :length, :length] - reference[0]).abs().max()) <= 1e-5
    assert len(caption_view(capture).target_tokens) == len(written.token_ids) + 1  # the written tokens only
    with pytest.raises(attnviz.AttnvizError, match="give the prompt as x and its picture as image"):
        attnviz.generate(loaded, picture, max_new_tokens=2)


def test_command_line_draws_each_written_word_and_saves_the_capture(capsys, tmp_path, vlm_dirs, picture):
    image = tmp_path / "cat.png"
    picture.save(image)
    figure = tmp_path / "words.svg"
    model = vlm_dirs["llava"]
    result = run_cli(capsys, "heatmap", "--model", model, "a red cat", "--image", image, "--out", figure)
    assert result.exit_code == 0, result.stderr
    assert "vision-language" in result.stderr and "4×4 patches" in result.stderr
    texts = read_svg(figure).texts
    assert "the image" in texts and "re" in texts and "at" in texts
    saved = tmp_path / "cat.safetensors"
    result = run_cli(capsys, "capture", "--model", model, "a red cat", "--image", image, "--out", saved)
    assert result.exit_code == 0, result.stderr
    loaded = AttentionCapture.load(saved)
    reference = attnviz.capture(attnviz.load_model(str(model), device="cpu"), "a red cat", image=picture)
    assert loaded.image_grid == reference.image_grid and loaded.tokens == reference.tokens
    assert torch.allclose(loaded.layer(1), reference.layer(1))
    page = tmp_path / "written.html"
    result = run_cli(capsys, "heatmap", "--model", model, "a red", "--image", image, "--generate", "2", "--out", page)
    assert result.exit_code == 0, result.stderr
    assert "written:" in result.stderr and page.read_text().rstrip().endswith("</html>")


def test_bad_input_and_refused_families(capsys, tmp_path, vlm_dirs, picture):
    image = tmp_path / "cat.png"
    picture.save(image)
    model = vlm_dirs["llava"]
    result = run_cli(capsys, "heatmap", "--model", model, "<image> a <image>", "--image", image, "--out", "x.png")
    assert_clean_error(result, "one picture per text")
    result = run_cli(capsys, "heatmap", "--model", "minilm", "a cat", "--image", image, "--out", tmp_path / "x.png")
    assert_clean_error(result, "minilm is a text model", "vision-language model")
    assert not (tmp_path / "x.png").exists()


def test_families_attnviz_cannot_map_read_text_and_refuse_a_picture_by_name(tmp_path, vlm_dirs, picture):
    """A family whose image tokens attnviz cannot map (LLaVA-NeXT's tiles of several resolutions)
    still reads text as its language model; a picture is refused with one line naming the family and the reason.
    A readable family saved without its image processor reads text only, and says so."""
    from types import SimpleNamespace

    import transformers

    from attnviz.models.vlm import vision_language_model_of

    for config, reason in ((transformers.LlavaNextConfig(), "tiles of several resolutions"),):
        held = SimpleNamespace(name="held", model=SimpleNamespace(config=config), modality="text")
        with pytest.raises(attnviz.AttnvizError, match=f"of the {config.model_type} family.*{reason}"):
            vision_language_model_of(held)
    import shutil

    bare = tmp_path / "llava-without-processor"
    shutil.copytree(vlm_dirs["llava"], bare)
    (bare / "processor_config.json").unlink()
    loaded = attnviz.load_model(str(bare), device="cpu")
    assert attnviz.capture(loaded, "a red cat").num_layers() == 2
    with pytest.raises(attnviz.AttnvizError, match="without its image processor"):
        attnviz.capture(loaded, "a red cat", image=picture)


def test_statistics_over_texts_with_pictures_equal_the_captures(vlm_dirs):
    """``compute_statistics(model, texts, images=…)``: every head's image share (the attention of each text query
    after the picture on the picture's tokens, averaged) equals the captures'; the text statistics count every
    token of every sequence."""
    from attnviz.stats.export import stats_record

    loaded = attnviz.load_model(str(vlm_dirs["llava"]), device="cpu")
    texts = ["a red cat", "USER: <image>\nthe blue car by the sea"]
    pictures = sample_images(2, seed=8, size=40)
    stats = attnviz.compute_statistics(loaded, texts, images=pictures, progress=False)
    captures = [attnviz.capture(loaded, text, image=image) for text, image in zip(texts, pictures)]
    assert stats.num_examples == 2 and stats.num_tokens == sum(len(c.tokens) for c in captures)
    for layer in range(2):
        expected = picture_shares(captures, layer)  # [head, every text query after a picture]
        site = AttentionSite("self", layer)
        assert torch.allclose(stats.picture.image_share[site], expected.mean(dim=1), atol=1e-6)
        assert torch.allclose(stats.picture.image_share_std[site], expected.std(dim=1, unbiased=False), atol=1e-6)
    assert stats.picture.queries == expected.shape[1]
    record = stats_record(stats, attnviz.detect_heads(stats))
    assert len(record["picture"]["heads"]) == 8 and 0 < record["picture"]["heads"][0]["image_share"] < 1
    with pytest.raises(attnviz.AttnvizError, match="one text per picture"):
        attnviz.compute_statistics(loaded, texts, images=pictures[:1], progress=False)


def test_wrap_takes_the_model_and_its_processor(vlm_dirs, picture):
    """``attnviz.wrap(model, processor)`` on a vision-language model the user holds: the same numbers as the loaded
    directory, and the user's model unchanged afterwards; a bare tokenizer is refused with one line."""
    import transformers

    directory = vlm_dirs["paligemma"]
    model = transformers.AutoModelForImageTextToText.from_pretrained(directory, attn_implementation="eager").eval()
    processor = transformers.AutoProcessor.from_pretrained(directory)
    loaded = attnviz.wrap(model, processor)
    wrapped = attnviz.capture(loaded, "a red cat", image=picture)
    reference = attnviz.capture(attnviz.load_model(str(directory), device="cpu"), "a red cat", image=picture)
    assert wrapped.tokens == reference.tokens and wrapped.image_grid == reference.image_grid
    for layer in range(2):
        assert float((wrapped.layer(layer) - reference.layer(layer)).abs().max()) <= 1e-6
    assert model.config._attn_implementation == "eager"
    assert model.config.text_config._attn_implementation == "eager"
    text_only = attnviz.wrap(model, processor.tokenizer)  # a tokenizer alone: the language model, text only
    assert attnviz.capture(text_only, "a red cat").tokens == loaded.encode(["a red cat"]).tokens[0]
    with pytest.raises(attnviz.AttnvizError, match="without its image processor"):
        attnviz.capture(text_only, "a red cat", image=picture)


def _language_layers(directory):
    """The eager model of ``directory`` and its language model's decoder layers."""
    import transformers

    model = transformers.AutoModelForImageTextToText.from_pretrained(directory, attn_implementation="eager").eval()
    return model, model.model.language_model.layers


def test_patching_with_a_picture_equals_a_plain_hook_on_the_output_projection(vlm_dirs, picture):
    """``patch_heads(..., image=)`` patches the language model's heads: each patched logit difference equals a
    corrupt run whose ``o_proj`` input gets the clean run's columns of that head (a forward pre-hook)."""
    loaded = attnviz.load_model(str(vlm_dirs["llava"]), device="cpu")
    clean, corrupt, answer, wrong = "a red cat", "a red mat", "a", "s"
    result = attnviz.patch_heads(loaded, clean=clean, corrupt=corrupt, answer=answer, wrong=wrong, image=picture)
    pair = vision_language_batch(loaded, [clean, corrupt], [picture, picture])
    model, layers = _language_layers(vlm_dirs["llava"])
    ids = [loaded.tokenizer.convert_tokens_to_ids(token) for token in (answer, wrong)]
    inputs = {name: value for name, value in pair.inputs.items()}
    clean_inputs = {name: value[:1] for name, value in inputs.items()}
    corrupt_inputs = {name: value[1:] for name, value in inputs.items()}
    heard: dict[int, torch.Tensor] = {}
    hooks = [
        layer.self_attn.o_proj.register_forward_pre_hook(lambda _, args, i=i: heard.__setitem__(i, args[0].clone()))
        for i, layer in enumerate(layers)
    ]
    with torch.no_grad():
        model(**clean_inputs)
    for hook in hooks:
        hook.remove()
    width = heard[0].shape[-1] // 4  # [1, q, 4 heads × d]
    for effect in result.heads:
        columns = slice(effect.head * width, (effect.head + 1) * width)

        def patch(_, args, clean_input=heard[effect.layer], columns=columns):
            patched = args[0].clone()
            patched[..., columns] = clean_input[..., columns]
            return (patched,)

        hook = layers[effect.layer].self_attn.o_proj.register_forward_pre_hook(patch)
        with torch.no_grad():
            logits = model(**corrupt_inputs).logits[0, -1]
        hook.remove()
        assert abs(float(logits[ids[0]] - logits[ids[1]]) - effect.patched_logit_diff) <= 1e-4
    assert result.tokens[:16] == [f"r{row}c{col}" for row in range(4) for col in range(4)]
    assert all(effect.direct_logit_attribution is not None for effect in result.heads)


def test_norm_weighting_with_a_picture_is_weight_times_the_moved_vector(vlm_dirs, picture):
    """``capture(..., image=, weighting="norm")`` is ``α_ij·‖W_O^h v_j^h‖`` of the language model's heads, with the
    value vectors read by a plain hook on ``v_proj`` (grouped-query heads share them)."""
    loaded = attnviz.load_model(str(vlm_dirs["llava"]), device="cpu")
    normed = attnviz.capture(loaded, "a red cat", image=picture, weighting="norm")
    batch = vision_language_batch(loaded, ["a red cat"], [picture])
    model, layers = _language_layers(vlm_dirs["llava"])
    values: dict[int, torch.Tensor] = {}
    hooks = [
        layer.self_attn.v_proj.register_forward_hook(lambda _, __, out, i=i: values.__setitem__(i, out[0]))
        for i, layer in enumerate(layers)
    ]
    with torch.no_grad():
        outputs = model(**batch.inputs, output_attentions=True)
    for hook in hooks:
        hook.remove()
    for index, layer in enumerate(layers):
        heads, kv_heads = 4, 2
        value = values[index].view(-1, kv_heads, 12)  # [k, kv heads, d]
        weight = layer.self_attn.o_proj.weight.detach()  # [width, heads × d]
        norms = torch.stack(
            [(value[:, head // (heads // kv_heads)] @ weight[:, head * 12 : (head + 1) * 12].T).norm(dim=-1)
             for head in range(heads)]
        )  # fmt: skip  # [h, k]
        expected = outputs.attentions[index][0] * norms[:, None, :]  # [h, q, k]
        assert float((normed.layer(index) - expected).abs().max()) <= 1e-4


def test_stats_command_reads_each_picture_inside_its_text(capsys, tmp_path, vlm_dirs):
    import json

    pictures = sample_images(2, seed=8, size=40)
    paths = []
    for index, picture in enumerate(pictures):
        paths += ["--image", tmp_path / f"{index}.png"]
        picture.save(tmp_path / f"{index}.png")
    texts = ["a red cat", "USER: <image>\nthe blue car by the sea"]
    out = tmp_path / "stats.json"
    model = vlm_dirs["llava"]
    result = run_cli(capsys, "stats", model, "--text", texts[0], "--text", texts[1], *paths, "--json", out)
    assert result.exit_code == 0, result.stderr
    assert "image share" in result.stderr
    record = json.loads(out.read_text())
    loaded = attnviz.load_model(str(model), device="cpu")
    stats = attnviz.compute_statistics(loaded, texts, images=pictures, progress=False)
    shares = {(head["layer"], head["head"]): head["image_share"] for head in record["picture"]["heads"]}
    for site, values in stats.picture.image_share.items():
        for head, value in enumerate(values.tolist()):
            assert abs(shares[(site.layer, head)] - value) <= 1e-6
    tower = tmp_path / "tower.json"  # pictures without texts: the vision tower's statistics over them
    result = run_cli(capsys, "stats", model, *paths, "--json", tower)
    assert result.exit_code == 0, result.stderr
    assert json.loads(tower.read_text())["image"]["distance_unit"] == "patches"


def test_patch_command_puts_the_picture_in_both_prompts(capsys, tmp_path, vlm_dirs, picture):
    import json

    image = tmp_path / "cat.png"
    picture.save(image)
    out = tmp_path / "patch.json"
    model = vlm_dirs["llava"]
    arguments = ("--clean", "a red cat", "--corrupt", "a red mat", "--answer", "a", "--wrong", "s")
    result = run_cli(capsys, "patch", model, *arguments, "--image", image, "--json", out)
    assert result.exit_code == 0, result.stderr
    record = json.loads(out.read_text())
    loaded = attnviz.load_model(str(model), device="cpu")
    expected = attnviz.patch_heads(loaded, clean="a red cat", corrupt="a red mat", answer="a", wrong="s", image=picture)
    assert abs(record["clean_logit_diff"] - expected.clean_logit_diff) <= 1e-5
    written = [head["patched_logit_diff"] for head in record["heads"]]
    assert written == pytest.approx([effect.patched_logit_diff for effect in expected.heads], abs=1e-5)


def test_a_picture_cut_into_tiles_is_refused_with_one_line(vlm_dirs, picture):
    """Idefics3 keeps a picture within its ``max_image_size`` whole; one its processor cuts into tiles plus a
    thumbnail (several runs of image tokens) is refused, saying how to keep it whole."""
    loaded = attnviz.load_model(str(vlm_dirs["idefics3"]), device="cpu")
    loaded.processor.image_processor.size = {"longest_edge": 64}  # resized to 64 pixels: 2×2 tiles of 32
    with pytest.raises(attnviz.AttnvizError, match="5 runs of image tokens.*do_image_splitting=False"):
        attnviz.capture(loaded, "a red cat", image=picture)


@pytest.mark.parametrize("family", ["llava", "paligemma"])
def test_a_picture_alone_shows_the_vision_towers_attention(capsys, tmp_path, vlm_dirs, picture, family):
    """``capture(vlm, picture)`` without a text: the vision tower's own attention over the patches (CLIP with its
    class token, SigLIP without), equal to the tower's eager attention; on the command line, the image overlays."""
    import transformers

    loaded = attnviz.load_model(str(vlm_dirs[family]), device="cpu")
    result = attnviz.capture(loaded, picture)
    tower = loaded.vision_tower()
    batch = tower.encode_images([picture])
    model = transformers.AutoModelForImageTextToText.from_pretrained(vlm_dirs[family], attn_implementation="eager")
    with torch.no_grad():
        outputs = model.eval().model.vision_tower(pixel_values=batch.inputs["pixel_values"], output_attentions=True)
    assert result.num_layers() == len(outputs.attentions) == 2
    for layer, reference in enumerate(outputs.attentions):
        assert float((result.layer(layer) - reference[0]).abs().max()) <= 1e-5
    assert result.tokens[0] == ("[CLS]" if family == "llava" else "r0c0") and result.image_grid.rows == 4
    image = tmp_path / "cat.png"
    picture.save(image)
    figure = tmp_path / "tower.svg"
    result = run_cli(capsys, "heatmap", "--model", vlm_dirs[family], "--image", image, "--out", figure)
    assert result.exit_code == 0, result.stderr
    assert "vision tower" in " ".join(read_svg(figure).texts)


def test_a_checkpoint_whose_own_code_stops_on_the_probe_is_one_error_line(capsys, tmp_path, vlm_dirs):
    """A vision-language directory whose config its own code cannot run (a feature layer its tower lacks) is refused
    with one line naming what stopped, from Python and on the command line, not a traceback."""
    import json
    import shutil

    broken = tmp_path / "llava-broken"
    shutil.copytree(vlm_dirs["llava"], broken)
    config = json.loads((broken / "config.json").read_text())
    config["vision_feature_layer"] = -7  # the tiny tower has 2 layers (3 hidden states)
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(attnviz.AttnvizError, match="its code stops on a grey picture and a short text.*IndexError"):
        attnviz.load_model(str(broken), device="cpu")
    result = run_cli(capsys, "heatmap", "--model", broken, "a red cat", "--out", tmp_path / "x.png")
    assert_clean_error(result, "its code stops on a grey picture")


def test_a_long_text_draws_its_first_tokens_and_says_so(vlm_dirs, picture):
    """A figure of a long text with a picture draws one overlay for each of its first MAX_WORD_PANELS written
    tokens (hundreds of panels made the layout run for minutes) and its title says how many it left out."""
    from attnviz.render.caption_overlay import MAX_WORD_PANELS

    loaded = attnviz.load_model(str(vlm_dirs["llava"]), device="cpu")
    result = attnviz.capture(loaded, " ".join(["the red cat sat on the mat"] * 12), image=picture)
    written = len(result.tokens) - (result.image_grid.start + result.image_grid.num_tokens)
    assert written > MAX_WORD_PANELS
    figure = attnviz.heatmap(result)
    overlays = [axis for axis in figure.axes if axis.get_images()][1:]  # the picture first, then one per token
    assert len(overlays) == MAX_WORD_PANELS
    title = " ".join(figure._suptitle.get_text().split())
    assert f"the first {MAX_WORD_PANELS} of {written} tokens drawn" in title
