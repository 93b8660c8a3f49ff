"""Image captioners (VisionEncoderDecoderModel): every stack against transformers' eager attention, teacher-forced
and generated, through the command line; the figure, the page, statistics, bad input; vision checkpoints saved
without a pooler."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli
from figure_helpers import read_svg
from tiny_vision import build_tiny_captioner, build_tiny_vision_model, sample_images

import attnviz
from attnviz.captures.attention_capture import AttentionCapture
from attnviz.models.specs import load_model

STACKS = {"encoder": "encoder_attentions", "decoder": "decoder_attentions", "cross": "cross_attentions"}


@pytest.fixture(scope="module")
def captioners(tmp_path_factory):
    """``{name: directory}``: ViT + GPT-2 and DeiT + BERT captioners, saved with image processor and tokenizer."""
    root = tmp_path_factory.mktemp("captioners")
    return {
        "vit-gpt2": build_tiny_captioner(root / "vit-gpt2"),
        "deit-bert": build_tiny_captioner(root / "deit-bert", encoder="deit", decoder="bert", pooler=True),
    }


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    path = tmp_path_factory.mktemp("caption-images") / "photo.png"
    sample_images(1, seed=4)[0].save(path)
    return path


def eager_outputs(directory, picture_path, decoder_ids: list[int]):
    """transformers' own eager attention of the captioner on the picture and the decoder inputs ``decoder_ids``."""
    import transformers
    from PIL import Image

    model = transformers.VisionEncoderDecoderModel.from_pretrained(directory, attn_implementation="eager").eval()
    processor = transformers.AutoImageProcessor.from_pretrained(directory)
    pixels = processor(images=[Image.open(picture_path).convert("RGB")], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return model(pixel_values=pixels, decoder_input_ids=torch.tensor([decoder_ids]), output_attentions=True)


def written_ids(loaded, picture_path, count: int) -> list[int]:
    """The start token and the ids the captioner writes greedily (captures keep readable tokens, not ids)."""
    return [loaded.start_id, *attnviz.generate(loaded, picture_path, max_new_tokens=count).token_ids]


def assert_equal_to_eager(capture: AttentionCapture, outputs, *, layers=None, heads=None) -> None:
    for stack, attribute in STACKS.items():
        reference = getattr(outputs, attribute)
        assert len(capture.patterns[stack]) == len(reference)
        for layer, expected in enumerate(reference):  # [1, h, q, k]
            if layers is not None and layer not in layers:
                assert capture.patterns[stack][layer].shape[0] == 0
                continue
            kept = expected[0] if heads is None else expected[0, heads]
            assert capture.patterns[stack][layer].shape == kept.shape
            torch.testing.assert_close(capture.patterns[stack][layer], kept, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["vit-gpt2", "deit-bert"])
def test_teacher_forced_capture_equals_eager(capsys, tmp_path, captioners, picture, name):
    out = tmp_path / "caption.safetensors"
    caption = "a red cat sits on the mat"
    result = run_cli(
        capsys, "capture", "--image", picture, "--model", captioners[name], "--target", caption, "--out", out
    )
    assert result.exit_code == 0, result.stderr
    capture = AttentionCapture.load(out)
    loaded = load_model(str(captioners[name]), device="cpu")
    ids = [loaded.start_id, *loaded.tokenizer(caption, add_special_tokens=False)["input_ids"]]
    from attnviz.common.tokens import token_strings

    assert capture.target_tokens == token_strings(loaded.tokenizer, ids)
    grid = capture.image_grid
    assert capture.tokens[grid.num_extra :] == [f"r{r}c{c}" for r in range(4) for c in range(4)]
    assert capture.tokens[: grid.num_extra] == (["[CLS]"] if name == "vit-gpt2" else ["[CLS]", "[DIST]"])
    assert_equal_to_eager(capture, eager_outputs(captioners[name], picture, ids))


@pytest.mark.parametrize("name", ["vit-gpt2", "deit-bert"])
def test_generated_capture_equals_eager(capsys, tmp_path, captioners, picture, name):
    out = tmp_path / "written.safetensors"
    result = run_cli(
        capsys, "capture", "--image", picture, "--model", captioners[name], "--generate", "6", "--out", out
    )
    assert result.exit_code == 0, result.stderr
    capture = AttentionCapture.load(out)
    loaded = load_model(str(captioners[name]), device="cpu")
    from attnviz.common.tokens import token_strings

    # the capture keeps readable tokens (byte-level ones decoded), so the ids come from the same greedy run in Python
    ids = written_ids(loaded, picture, 6)
    assert capture.target_tokens == token_strings(loaded.tokenizer, ids) and capture.generated_from == 1
    outputs = eager_outputs(captioners[name], picture, ids)
    # greedy: every written token is the argmax of eager logits at the step before it
    assert ids[1:] == outputs.logits[0, :-1].argmax(-1).tolist()
    assert_equal_to_eager(capture, outputs)


def test_generate_lets_the_captioner_write_as_eager_attention_reads_it(captioners, picture):
    loaded = load_model(str(captioners["vit-gpt2"]), device="cpu")
    written = attnviz.generate(loaded, picture, max_new_tokens=5)
    assert isinstance(written, attnviz.Generation) and written.capture.generated_from == 1
    assert written.text == loaded.tokenizer.decode(written.token_ids, skip_special_tokens=True)
    ids = [loaded.start_id, *written.token_ids]
    outputs = eager_outputs(captioners["vit-gpt2"], picture, ids)
    assert written.token_ids == outputs.logits[0, :-1].argmax(-1).tolist()  # greedy
    assert_equal_to_eager(written.capture, outputs)
    last = len(outputs.decoder_attentions) - 1
    part = attnviz.generate(loaded, picture, max_new_tokens=5, layers=[-1], heads=[1])
    assert part.token_ids == written.token_ids
    assert_equal_to_eager(part.capture, outputs, layers=[last], heads=[1])
    with pytest.raises(attnviz.AttnvizError, match="give the image as x"):
        attnviz.generate(loaded, "a cat", image=picture, max_new_tokens=2)
    with pytest.raises(attnviz.AttnvizError, match="at least 1"):
        attnviz.generate(loaded, picture, max_new_tokens=0)


def test_layer_head_and_stack_keep_only_what_is_asked(capsys, tmp_path, captioners, picture):
    directory = captioners["vit-gpt2"]
    for extra in (["--target", "a blue car"], ["--generate", "4"]):
        out = tmp_path / "part.safetensors"
        result = run_cli(
            capsys, "capture", "--image", picture, "--model", directory, *extra, "--layer", "-1", "--head", "1,3",
            "--out", out,
        )  # fmt: skip
        assert result.exit_code == 0, result.stderr
        capture = AttentionCapture.load(out)
        loaded = load_model(str(directory), device="cpu")
        if extra[0] == "--target":
            ids = [loaded.start_id, *loaded.tokenizer(extra[1], add_special_tokens=False)["input_ids"]]
        else:
            ids = written_ids(loaded, picture, 4)
        assert_equal_to_eager(capture, eager_outputs(directory, picture, ids), layers=[1], heads=[1, 3])
        out.unlink()
    result = run_cli(
        capsys, "capture", "--image", picture, "--model", directory, "--target", "a cat", "--stack", "cross",
        "--out", tmp_path / "cross.safetensors",
    )  # fmt: skip
    capture = AttentionCapture.load(tmp_path / "cross.safetensors")
    assert capture.stacks == ["cross"] and capture.recorded_layers("cross") == [0, 1]


def test_heatmap_draws_one_overlay_per_written_word(capsys, tmp_path, captioners, picture):
    from attnviz.render.caption_overlay import caption_rows

    directory = captioners["vit-gpt2"]
    out = tmp_path / "caption.svg"
    result = run_cli(capsys, "heatmap", "--image", picture, "--model", directory, "--target", "a cat", "--out", out)
    assert result.exit_code == 0, result.stderr
    figure = read_svg(out)
    loaded = load_model(str(directory), device="cpu")
    capture = attnviz.capture(loaded, picture, target="a cat")
    assert capture.target_tokens[1:] == ["a", "Ġc", "at"]  # every caption token after the start token
    # one panel title each, the leading space marked as on every label
    assert [text for text in figure.texts if text in {"a", "␣c", "at"}] == ["a", "␣c", "at"]
    # what is averaged, said once (the subtitle wraps to the figure's width)
    assert "layer 1: mean over its 4 heads" in " ".join(" ".join(figure.texts).split())
    assert figure.images == 1 + 3 + 3 + 1  # the picture, 3 overlays, 3 [CLS] cells, the colour bar
    # the numbers behind each overlay: the cross-attention row of the step that wrote the word, mean of heads
    rows = caption_rows(capture)
    cross = capture.layer(-1, "cross")  # [head, query, key]
    for position, panel in enumerate(rows[0].panels):
        torch.testing.assert_close(panel.patches.flatten(), cross[:, position, 1:].mean(0))
    # --head picks heads: one row each, no average
    result = run_cli(
        capsys, "heatmap", "--image", picture, "--model", directory, "--generate", "3", "--layer", "0",
        "--head", "2", "--out", tmp_path / "head.svg",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert any("one head per row" in text for text in read_svg(tmp_path / "head.svg").texts)


def test_caption_page_in_the_browser(capsys, tmp_path, captioners, picture, open_page):
    directory = captioners["vit-gpt2"]
    page_path = tmp_path / "caption.html"
    result = run_cli(
        capsys, "heatmap", "--image", picture, "--model", directory, "--target", "a cat", "--out", page_path
    )
    assert result.exit_code == 0, result.stderr
    run = open_page(page_path)
    page = run.page
    assert page.locator("button.word").count() == 3  # a, c, at
    page.locator("button.word").nth(1).click()
    assert page.locator("body").get_attribute("data-word") == "␣c"
    assert page.locator("#thumbs canvas").count() == 2 * (4 + 1)  # every layer × (each head + the mean)
    capture = attnviz.capture(load_model(str(directory), device="cpu"), picture, target="a cat")
    row = capture.layer(-1, "cross")[:, 1, 1:].mean(0)  # the step that wrote "c": query 1 ("a"), mean of heads
    hottest = page.locator("body").get_attribute("data-hottest")
    assert float(row[capture.tokens.index(hottest) - 1]) >= float(row.max()) * (1 - 2 / 255)  # 8-bit page codes
    run.assert_clean()


def test_notebook_shows_the_caption_page(captioners, picture):
    import attnviz

    capture = attnviz.capture(load_model(str(captioners["vit-gpt2"]), device="cpu"), picture, target="a cat")
    view = attnviz.show(capture)
    assert view.title == "attention: caption view" and '"words":["a","␣c","at"]' in view.html
    assert capture._repr_html_().startswith("<iframe")


def test_statistics_over_the_captions_it_writes(capsys, tmp_path, captioners):
    import json

    folder = tmp_path / "images"
    folder.mkdir()
    for index, image in enumerate(sample_images(2, seed=7)):
        image.save(folder / f"{index}.png")
    directory = captioners["vit-gpt2"]
    result = run_cli(capsys, "stats", directory, "--images", folder, "--json", tmp_path / "stats.json", "--no-table")
    assert result.exit_code == 0, result.stderr
    record = json.loads((tmp_path / "stats.json").read_text())
    assert set(record["stacks"]) == {"encoder", "decoder", "cross"}
    # max_weight of each cross head, by hand: the mean over every caption query of its row maximum
    loaded = load_model(str(directory), device="cpu")
    rows = []
    for path in sorted(folder.iterdir()):
        capture = attnviz.generate(loaded, path, max_new_tokens=32).capture
        rows.append(torch.stack(capture.patterns["cross"]).amax(-1))  # [layer, head, query]
    expected = torch.cat(rows, dim=-1).mean(-1)  # [layer, head]
    for head in (row for row in record["heads"] if row["stack"] == "cross"):
        assert head["max_weight"] == pytest.approx(float(expected[head["layer"], head["head"]]), abs=1e-5)
        assert head["mean_distance"] is None  # a word has no place on the picture


def test_bad_input_gives_one_error_line(capsys, tmp_path, captioners, picture, tiny_model_dirs, tiny_vision_dirs):
    directory = captioners["vit-gpt2"]
    cases = [
        (["--image", picture, "--model", tiny_model_dirs["gpt2"], "--target", "a cat"], "is a text model"),
        (["--image", picture, "--model", directory, "--target", "a cat " * 20], "decoder allows 24"),
        (["--image", picture, "--model", tiny_vision_dirs["vit"], "--target", "a cat"], "is an image encoder"),
        (["--image", picture, "--model", tiny_vision_dirs["vit"], "--generate", "3"], "is an image encoder"),
    ]
    text = tmp_path / "text.png"
    text.write_text("not an image")
    cases.append((["--image", text, "--model", directory, "--target", "a cat"], "not an image"))
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    for arguments, fragment in cases:
        for command, suffix in (("capture", ".safetensors"), ("heatmap", ".png")):
            result = run_cli(capsys, command, *arguments, "--out", outputs / f"out{suffix}")
            assert_clean_error(result, fragment)
            assert len(result.error_lines()) == 1
    assert list(outputs.iterdir()) == []


def test_other_image_to_text_families_are_refused_by_name(capsys, tmp_path, picture):
    import transformers

    for config in (transformers.BlipConfig(), transformers.GitConfig()):
        directory = tmp_path / config.model_type
        config.save_pretrained(directory)  # no weights: the refusal comes before any is read
        result = run_cli(capsys, "capture", "--image", picture, "--model", directory, "--target", "a cat",
                         "--out", tmp_path / "x.safetensors")  # fmt: skip
        assert_clean_error(result, f"is a {config.model_type} model, which attnviz cannot show")
        assert len(result.error_lines()) == 1


@pytest.mark.parametrize("family", ["vit", "deit"])
def test_vision_checkpoint_without_pooler_loads_and_equals_eager(tmp_path, family):
    import transformers
    from tiny_vision import tiny_vision_config

    _, config, processor = tiny_vision_config(family)
    model_class = {"vit": transformers.ViTModel, "deit": transformers.DeiTModel}[family]
    torch.manual_seed(0)
    model_class(config, add_pooling_layer=False).save_pretrained(tmp_path / family)
    processor.save_pretrained(tmp_path / family)
    loaded = load_model(str(tmp_path / family), device="cpu")
    assert loaded.model.pooler is None  # built as saved
    image = sample_images(1, seed=2)[0]
    capture = attnviz.capture(loaded, image)
    reference = model_class.from_pretrained(tmp_path / family, attn_implementation="eager").eval()
    pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        outputs = reference(pixel_values=pixels, output_attentions=True)
    for layer, expected in enumerate(outputs.attentions):
        torch.testing.assert_close(capture.layer(layer), expected[0], atol=1e-6, rtol=0)


def test_missing_attention_weights_stay_refused(tmp_path, capsys, picture):
    from safetensors.torch import load_file, save_file

    directory = build_tiny_vision_model("vit", tmp_path / "vit")
    weights = load_file(directory / "model.safetensors")
    damaged = {name: tensor for name, tensor in weights.items() if "layer.1.attention.attention.query" not in name}
    save_file(damaged, directory / "model.safetensors", metadata={"format": "pt"})
    result = run_cli(capsys, "capture", "--image", picture, "--model", directory, "--out", tmp_path / "x.safetensors")
    assert_clean_error(result, "lack 2 tensor(s)", "attention.q_proj")


def test_captioner_whose_encoder_has_no_pooler(captioners):
    loaded = load_model(str(captioners["vit-gpt2"]), device="cpu")
    assert loaded.model.encoder.pooler is None
    assert load_model(str(captioners["deit-bert"]), device="cpu").model.encoder.pooler is not None
