"""Qwen2-VL (and the families that read pictures as it does): merged patches at a size of the processor's choosing,
flattened pixels, multimodal rotary positions, and a processor built without torchvision (its video part left
out), held to transformers' own eager attention, its own ``generate`` and plain hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zoo_reference as ref
from cli_helpers import run_cli
from figure_helpers import read_svg
from PIL import Image
from tiny_vlm import build_tiny_vlm, picture_shares

import attnviz
from attnviz.captures.vision_language import vision_language_batch

HEADS = 4
PROMPT, CORRUPT, ANSWER, WRONG = "a red cat", "a red mat", "a", "s"


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return build_tiny_vlm("qwen2_vl", tmp_path_factory.mktemp("qwen2-vl") / "model")


@pytest.fixture(scope="module")
def eager(directory):
    """transformers' own model of ``directory``, with its eager attention."""
    import transformers

    return transformers.AutoModelForImageTextToText.from_pretrained(directory, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def loaded(directory):
    """attnviz's model of ``directory`` (its processor built without torchvision)."""
    return attnviz.load_model(str(directory), device="cpu")


@pytest.fixture(scope="module")
def picture():
    """A planted 32×48 picture (no resizing: whole 16-pixel tokens): red grows along x, green along y."""
    pixels = np.zeros((32, 48, 3), np.uint8)
    pixels[..., 0] = np.arange(48)[None, :] * 5
    pixels[..., 1] = np.arange(32)[:, None] * 7
    pixels[..., 2] = 77
    return Image.fromarray(pixels)


def test_capture_equals_eager_and_maps_the_merged_patches(loaded, eager, picture):
    """Every layer's pattern and the logits equal eager; the 2×3 grid of merged 16-pixel tokens sits between the
    vision start and end tokens; the picture attnviz draws on is the planted one, patch for patch."""
    assert type(loaded.processor).__name__ == "Qwen2VLProcessor"  # built without torchvision
    result = attnviz.capture(loaded, PROMPT, image=picture)
    batch = vision_language_batch(loaded, [PROMPT], [picture])
    with torch.no_grad():
        outputs = eager(**batch.inputs, output_attentions=True)
        logits = loaded.forward(batch, logits=True).logits
    assert result.num_layers() == len(outputs.attentions) == 2
    for layer, reference in enumerate(outputs.attentions):  # [1, h, q, k]
        assert float((result.layer(layer) - reference[0]).abs().max()) <= 1e-5
    assert float((logits - outputs.logits).abs().max()) <= 1e-4
    grid = result.image_grid
    assert (grid.rows, grid.cols, grid.patch_size, grid.start) == (2, 3, (16, 16), 1)
    assert result.tokens[0] == "<|vision_start|>" and result.tokens[grid.start + grid.num_tokens] == "<|vision_end|>"
    assert result.tokens[grid.start : grid.start + 6] == [f"r{r}c{c}" for r in range(2) for c in range(3)]
    planted = torch.tensor(np.asarray(picture), dtype=torch.float32) / 255
    assert float((result.extras["image"] - planted).abs().max()) <= 1e-6


def test_a_picture_the_processor_resizes_still_fits_its_grid(loaded, eager):
    """A 40×70 picture: the processor resizes it to whole tokens of its own choosing; the grid follows the
    processor's ``image_grid_thw``, and the patterns still equal eager."""
    picture = Image.fromarray(np.random.default_rng(4).integers(0, 255, (40, 70, 3), dtype=np.uint8))
    result = attnviz.capture(loaded, PROMPT, image=picture)
    batch = vision_language_batch(loaded, [PROMPT], [picture])
    _, rows, cols = batch.inputs["image_grid_thw"][0].tolist()  # in 8-pixel patches
    assert (result.image_grid.rows, result.image_grid.cols) == (rows // 2, cols // 2)
    assert result.extras["image"].shape == (rows * 8, cols * 8, 3)
    with torch.no_grad():
        outputs = eager(**batch.inputs, output_attentions=True)
    for layer, reference in enumerate(outputs.attentions):
        assert float((result.layer(layer) - reference[0]).abs().max()) <= 1e-5


def test_writing_equals_transformers_generate_and_the_teacher_forced_capture(loaded, eager, picture):
    """``attnviz.generate`` writes the tokens transformers' greedy ``generate`` writes (multimodal rotary positions
    carried through the cache), and its capture equals one capture of the prompt and the written tokens."""
    written = attnviz.generate(loaded, PROMPT, image=picture, max_new_tokens=4)
    batch = vision_language_batch(loaded, [PROMPT], [picture])
    with torch.no_grad():
        expected = eager.generate(**batch.inputs, max_new_tokens=4, do_sample=False)
    prompt_len = batch.inputs["input_ids"].shape[1]
    assert written.token_ids == expected[0, prompt_len:].tolist()
    full = {key: value for key, value in batch.inputs.items()}
    full["input_ids"] = expected
    full["attention_mask"] = torch.ones_like(expected)
    full["mm_token_type_ids"] = torch.cat(
        [batch.inputs["mm_token_type_ids"], torch.zeros(1, 4, dtype=batch.inputs["mm_token_type_ids"].dtype)], 1
    )
    with torch.no_grad():
        forced = eager(**full, output_attentions=True)
    for layer, reference in enumerate(forced.attentions):
        assert float((written.capture.layer(layer) - reference[0]).abs().max()) <= 1e-5


def test_patching_equals_a_plain_hook_on_the_output_projection(loaded, eager, picture):
    """Each patched logit difference equals a corrupt run whose ``o_proj`` input gets the clean run's columns of
    that head (a forward pre-hook, :mod:`zoo_reference`), the picture in both prompts."""
    result = attnviz.patch_heads(loaded, clean=PROMPT, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, image=picture)
    (clean, clean_extra), (corrupt, corrupt_extra) = (
        _ids_and_rest(vision_language_batch(loaded, [text], [picture]).inputs) for text in (PROMPT, CORRUPT)
    )
    answer, wrong = (loaded.tokenizer.convert_tokens_to_ids(token) for token in (ANSWER, WRONG))
    blocks = ref.run_blocks(eager, clean, clean_extra, within=eager.model.language_model)
    heard, clean_logits = ref.head_inputs(eager, clean, blocks, clean_extra)  # [(layer, [q, h·d])]
    assert abs(float(clean_logits[-1, answer] - clean_logits[-1, wrong]) - result.clean_logit_diff) <= 1e-4
    assert len(result.heads) == 2 * HEADS
    for effect in result.heads:
        block, values = blocks[effect.layer][1], heard[effect.layer][1]
        logits = ref.patched_logits(eager, corrupt, block, 0, effect.head, HEADS, values, corrupt_extra)
        assert abs(float(logits[-1, answer] - logits[-1, wrong]) - effect.patched_logit_diff) <= 1e-4


def _ids_and_rest(inputs: dict) -> tuple[torch.Tensor, dict]:
    return inputs["input_ids"], {key: value for key, value in inputs.items() if key != "input_ids"}


def test_norm_weighting_is_weight_times_the_moved_vector(loaded, eager, picture):
    """``weighting="norm"``: ``α_ij·‖W_O^h v_j^h‖`` with the values the eager attention function reads."""
    normed = attnviz.capture(loaded, PROMPT, image=picture, weighting="norm")
    batch = vision_language_batch(loaded, [PROMPT], [picture])
    expected = ref.norm_maps(eager, dict(batch.inputs), within=eager.model.language_model)["self"]  # [[h, q, k]]
    assert len(expected) == 2
    for layer, reference in enumerate(expected):
        assert float((normed.layer(layer) - reference).abs().max()) <= 1e-4


def test_statistics_over_two_pictures_equal_their_captures(loaded, picture):
    """Each head's image share over two texts with pictures (the attention of every text query after a picture on
    its picture's tokens, averaged over all of them) equals the captures'."""
    from attnviz.core import AttentionSite

    texts, pictures = [PROMPT, "the blue dog by the sea"], [picture, picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    stats = attnviz.compute_statistics(loaded, texts, images=pictures, progress=False)
    captures = [attnviz.capture(loaded, text, image=image) for text, image in zip(texts, pictures, strict=True)]
    for layer in range(2):
        expected = picture_shares(captures, layer)  # [head, every text query after a picture]
        assert torch.allclose(stats.picture.image_share[AttentionSite("self", layer)], expected.mean(1), atol=1e-6)


def test_heatmap_command_draws_the_text_over_the_picture(capsys, tmp_path, directory, picture, open_page):
    image = tmp_path / "café.png"
    picture.save(image)
    figure = tmp_path / "qwen.svg"
    result = run_cli(capsys, "heatmap", "--model", directory, PROMPT, "--image", image, "--out", figure)
    assert result.exit_code == 0, result.stderr
    assert "the picture at positions 1–6: 2×3 patches" in result.stderr
    texts = " ".join(read_svg(figure).texts)
    assert "cat" in texts
    page = tmp_path / "written.html"
    result = run_cli(
        capsys, "heatmap", "--model", directory, "a red", "--image", image, "--generate", "2", "--out", page
    )
    assert result.exit_code == 0, result.stderr
    run = open_page(page)
    run.assert_clean()
    hint = run.page.inner_text("header p")  # the language model's own weights, not a cross-attention
    assert "the language model's attention over the picture's tokens" in hint and "goes to the text" in hint
    assert run.page.locator("#caption button").count() == 2  # the two written tokens


def test_wrap_takes_the_model_and_a_processor_built_without_its_video_part(directory, loaded, picture):
    """``attnviz.wrap(model, processor)`` with the processor the docs build without torchvision
    (``pictures_only(Qwen2VLProcessor).from_pretrained``) gives the loaded directory's numbers; saved again, the
    processor loads as the family's own class."""
    import transformers

    from attnviz.models.vlm_processor import pictures_only

    model = transformers.AutoModelForImageTextToText.from_pretrained(directory, attn_implementation="eager").eval()
    processor = pictures_only(transformers.Qwen2VLProcessor).from_pretrained(directory)
    wrapped = attnviz.capture(attnviz.wrap(model, processor), PROMPT, image=picture)
    reference = attnviz.capture(loaded, PROMPT, image=picture)
    assert wrapped.tokens == reference.tokens and wrapped.image_grid == reference.image_grid
    for layer in range(2):
        assert float((wrapped.layer(layer) - reference.layer(layer)).abs().max()) <= 1e-6
    assert model.config._attn_implementation == "eager"
    saved = directory.parent / "processor-again"
    processor.save_pretrained(saved)
    again = pictures_only(transformers.Qwen2VLProcessor).from_pretrained(saved)
    assert type(again).__name__ == "Qwen2VLProcessor" and again.video_processor is None
    first = processor(text=["<|image_pad|>a cat"], images=[[picture]], return_tensors="pt")
    second = again(text=["<|image_pad|>a cat"], images=[[picture]], return_tensors="pt")
    assert all(torch.equal(first[key], second[key]) for key in first)
