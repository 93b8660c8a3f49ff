"""Vision transformers: loading, capture against transformers' eager attention, overlays read back, statistics.

Tiny random ViT, DeiT, DINOv2 (with and without registers), CLIP-vision and SigLIP-vision directories
(config, image processor and weights saved with ``save_pretrained``; ``tests/tiny_vision.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_vision import EXTRA_KINDS, VISION_FAMILIES, sample_images

import attnviz
from attnviz.captures.attention_capture import AttentionCapture
from attnviz.common.errors import InputError, ModelSpecError, UnsupportedModelError
from attnviz.models.specs import load_model


@pytest.fixture(scope="module")
def vision_models(tiny_vision_dirs):
    return {family: load_model(str(path), device="cpu") for family, path in tiny_vision_dirs.items()}


def eager_attentions(path, pixel_values):
    """transformers' own eager attention weights: one ``[b, h, q, k]`` tensor per layer."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    model = getattr(transformers, config.architectures[0]).from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(pixel_values=pixel_values, output_attentions=True).attentions


@pytest.mark.parametrize("family", VISION_FAMILIES)
def test_capture_equals_eager_attention(family, vision_models, tiny_vision_dirs):
    loaded = vision_models[family]
    images = sample_images(3, seed=11)
    captures = attnviz.capture(loaded, images)
    reference = eager_attentions(tiny_vision_dirs[family], loaded.encode_images(images).inputs["pixel_values"])
    assert len(reference) == captures[0].num_layers() == 2
    for index, result in enumerate(captures):
        for layer, expected in enumerate(reference):
            assert torch.allclose(result.layer(layer), expected[index], atol=1e-6, rtol=0), (family, layer)
    # the tokens: the family's extra tokens, then the 4×4 patches row-major
    grid = captures[0].image_grid
    assert grid.extra_kinds == tuple(EXTRA_KINDS[family]) and (grid.rows, grid.cols) == (4, 4)
    patches = [f"r{row}c{col}" for row in range(4) for col in range(4)]
    assert captures[0].tokens[grid.num_extra :] == patches
    assert captures[0].special == [True] * grid.num_extra + [False] * 16
    labels = {"cls": "[CLS]", "distillation": "[DIST]"}
    expected_extras = [labels.get(kind, f"[REG{i - 1}]") for i, kind in enumerate(EXTRA_KINDS[family])]
    assert captures[0].tokens[: grid.num_extra] == expected_extras


def test_capture_file_keeps_grid_and_picture(vision_models, tmp_path):
    result = attnviz.capture(vision_models["dinov2_registers"], sample_images(1, seed=2)[0])
    path = result.save(tmp_path / "image.safetensors")
    again = AttentionCapture.load(path)
    assert again.image_grid == result.image_grid
    assert again.image_grid.extra_kinds == ("cls", "register", "register")
    assert torch.equal(again.extras["image"], result.extras["image"])
    assert again.extras["image"].shape == (32, 32, 3)
    for layer in range(2):
        assert torch.equal(again.layer(layer), result.layer(layer))


def test_picture_is_what_the_model_saw(vision_models):
    """The stored picture is the processed image with the normalisation undone (blocks of flat colour)."""
    image = sample_images(1, seed=4, size=32)[0]  # already 32×32: the processor does not resize
    result = attnviz.capture(vision_models["vit"], image)
    expected = torch.from_numpy(np.array(image)).float() / 255
    assert torch.allclose(result.extras["image"], expected, atol=1e-5)


def test_windowed_family_refused_by_name_before_loading(tmp_path):
    import transformers

    folder = tmp_path / "swin"
    transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1], num_heads=[2]).save_pretrained(
        folder
    )
    # no weights and no image processor: anything that tried to load them would fail differently
    with pytest.raises(UnsupportedModelError, match="swin.*windows"):
        load_model(str(folder), device="cpu")


def test_missing_image_processor_is_a_clear_error(tiny_vision_dirs, tmp_path):
    import shutil

    folder = tmp_path / "vit"
    shutil.copytree(tiny_vision_dirs["vit"], folder)
    (folder / "preprocessor_config.json").unlink()
    with pytest.raises(ModelSpecError, match="preprocessor_config.json"):
        load_model(str(folder), device="cpu")


def test_text_and_images_go_to_the_right_models(vision_models, minilm):
    with pytest.raises(InputError, match="vision model"):
        vision_models["vit"].encode(["a sentence"])
    with pytest.raises(InputError, match="text model"):
        attnviz.capture(minilm, sample_images(1)[0])


def test_text_tools_refuse_vision_models(vision_models):
    from attnviz.heads.alignment import align_heads

    loaded = vision_models["vit"]
    with pytest.raises(UnsupportedModelError, match="vision model.*text tool"):
        loaded.probe_batches(10, 2, seed=0, batch_size=2)
    with pytest.raises(UnsupportedModelError, match="vision model.*text tool"):
        align_heads(loaded, [])
    loaded.check_objective()  # a classifier: prune judges it by its own predictions (test_vision_prune.py)
    with pytest.raises(UnsupportedModelError, match="has no classifier"):
        vision_models["clip"].check_objective()


# -- overlays, read back from the pixels -----------------------------------------------------------------


def hottest_drawn_patch(figure, axes_index: int, grid) -> int:
    """The patch whose centre is brightest in the drawn figure (the picture below is black)."""
    from attnviz.render.image_overlay import overlay_patch_centres

    figure.canvas.draw()
    pixels = np.asarray(figure.canvas.buffer_rgba())[..., :3].astype(float)  # [H, W, 3]
    height = pixels.shape[0]
    ax = figure.axes[axes_index]
    luminance = []
    for x, y in overlay_patch_centres(ax, grid):
        r, g, b = pixels[round(height - y), round(x)]
        luminance.append(0.2126 * r + 0.7152 * g + 0.0722 * b)  # viridis grows brighter with the weight
    return int(np.argmax(luminance))


@pytest.mark.parametrize(
    ("family", "query", "view"),
    [
        ("vit", None, "heads"),
        ("deit", (2, 1), "heads"),
        ("siglip", None, "heads"),
        ("dinov2_registers", None, "rollout"),
    ],
)
def test_overlay_hottest_patch_is_the_patterns(family, query, view, vision_models):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from attnviz.heads.propagation import rollout

    result = attnviz.capture(vision_models[family], sample_images(1, seed=5)[0])
    result.extras["image"] = torch.zeros_like(result.extras["image"])  # black: only the overlay shows
    grid = result.image_grid
    figure = attnviz.heatmap(result, layers=[-1], heads=[2] if view == "heads" else None, query=query, view=view)
    FigureCanvasAgg(figure)
    pattern = rollout(result) if view == "rollout" else result.layer(-1)[2]  # [query, key]
    if query is None and family == "siglip":  # no class token: the mean over patch queries
        row = pattern[grid.num_extra :].mean(0)
        assert "mean over patches (the model has no class token)" in figure._suptitle.get_text()
    else:
        row = pattern[0 if query is None else grid.patch_token(*query)]
    expected = int(row[grid.num_extra :].argmax())
    assert hottest_drawn_patch(figure, 1, grid) == expected  # axes 0: the input panel


def test_overlay_shows_every_extra_token(vision_models):
    result = attnviz.capture(vision_models["dinov2_registers"], sample_images(1)[0])
    figure = attnviz.heatmap(result, layers=[0], heads=[1])
    strips = [child for ax in figure.axes for child in ax.child_axes]  # the cells beside the image
    labels = [label.get_text() for strip in strips for label in strip.get_yticklabels()]
    weights = result.layer(0)[1, 0, :3]  # the class token's attention to [CLS], [REG0], [REG1]
    for name, weight in zip(["[CLS]", "[REG0]", "[REG1]"], weights):
        assert f"{name} {float(weight):.2f}" in labels


# -- statistics over images --------------------------------------------------------------------------------


def test_image_statistics_match_a_hand_computation(vision_models):
    from attnviz.stats.images import sink_patch_count

    loaded = vision_models["deit"]
    images = sample_images(5, seed=7)
    stats = attnviz.compute_statistics(loaded, images, batch_size=2, progress=False)
    captures = attnviz.capture(loaded, images)
    grid = captures[0].image_grid
    coordinates = torch.tensor([[p // 4, p % 4] for p in range(16)], dtype=torch.float64)
    distance = torch.cdist(coordinates, coordinates)  # [16, 16] patches
    for layer in range(2):
        patterns = torch.stack([c.layer(layer) for c in captures]).double()  # [images, h, q, k]
        to_patches = patterns[:, :, grid.num_extra :, grid.num_extra :]  # patch queries -> patch keys
        per_query = (to_patches * distance).sum(-1) / to_patches.sum(-1)  # [images, h, 16]
        assert torch.allclose(stats.matrix("mean_distance")[layer], per_query.mean(dim=(0, 2)), atol=1e-5)
        reach = distance.amax(1)  # [16]
        assert torch.allclose(
            stats.matrix("normalized_distance")[layer], (per_query / reach).mean(dim=(0, 2)), atol=1e-5
        )
        extra = patterns[..., : grid.num_extra].sum(-1).mean(dim=(0, 2))  # [h] over every query
        assert torch.allclose(stats.matrix("special_tokens")[layer], extra, atol=1e-5)
        received = patterns[..., grid.num_extra :].sum(2)  # [images, h, 16]
        sinks = received.sum(1).topk(sink_patch_count(16), dim=-1).indices  # [images, s]
        share = torch.stack([received[i][:, sinks[i]].sum(-1) for i in range(5)]) / grid.num_tokens  # [images, h]
        site = next(s for s in stats.image.sink_patches if s.layer == layer)
        assert torch.allclose(stats.image.sink_patches[site], share.mean(0), atol=1e-5)
    assert stats.num_examples == 5 and stats.num_tokens == 5 * 18


def test_a_sink_head_is_flagged(vision_models):
    """A planted pattern: head 0 gives 0.9 of every query's attention to patch r1c2, head 1 attends evenly."""
    from attnviz.core import AttentionSite
    from attnviz.stats.images import ImageGridAccumulator, flag_sink_heads

    batch = vision_models["vit"].encode_images(sample_images(2))
    grid = batch.image_grid
    tokens, sink = grid.num_tokens, grid.patch_token(1, 2)
    pattern = torch.full((2, 2, tokens, tokens), 1.0 / tokens)  # [b, h, q, k]
    pattern[:, 0] = 0.1 / (tokens - 1)
    pattern[:, 0, :, sink] = 0.9
    accumulator = ImageGridAccumulator()
    accumulator.begin_batch(batch)
    site = AttentionSite("self", 0)
    accumulator.observe(site, pattern[:, :, :7], 0)  # two query blocks, as the core may send them
    accumulator.observe(site, pattern[:, :, 7:], 7)
    accumulator.flush()
    shares, _ = accumulator.sink[site].mean_std()
    assert torch.allclose(shares, torch.tensor([0.9, 1.0 / tokens], dtype=torch.float64), atol=1e-6)
    assert flag_sink_heads({site: shares}) == [(site, 0)]
    # distance of head 1 (even attention): the mean grid distance from each patch to every patch, by hand
    coordinates = torch.tensor([[p // 4, p % 4] for p in range(16)], dtype=torch.float64)
    mean_distance = torch.cdist(coordinates, coordinates).mean()
    assert abs(float(accumulator.distance[site].mean_std()[0][1]) - float(mean_distance)) < 1e-5


def test_an_image_processor_failing_without_a_message_still_says_why(vision_models, monkeypatch):
    """A bare ``MemoryError()`` from the processor: the line says "out of memory", never ends in a dangling colon."""
    model = vision_models["vit"]

    def out_of_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(model, "processor", out_of_memory)
    with pytest.raises(InputError) as raised:
        model.encode_images(sample_images(1))
    assert str(raised.value).endswith("cannot read this image: out of memory")


def test_an_empty_reason_leaves_no_dangling_separator():
    assert (
        str(InputError("x's image processor cannot read this image: ")) == "x's image processor cannot read this image"
    )
    assert (
        str(InputError("a.png is a damaged image (): give an intact file"))
        == "a.png is a damaged image: give an intact file"
    )


def test_the_first_panel_is_the_image_the_model_saw_and_the_docs_odd_patch_is_where_it_is():
    """docs/vision.md: the first panel is the input; the seed-3 image's odd patch is r0c0, where heads 2 and 3 look."""
    from attnviz.toy.odd_patch import GRID, odd_patch_images

    images, labels = odd_patch_images(1, seed=3)
    assert divmod(labels[0], GRID) == (0, 0)  # r0c0, as the docs say
    capture = attnviz.capture(load_model("toy-odd-patch", device="cpu"), images[0])
    figure = attnviz.heatmap(capture)
    titles = [ax.get_title() for ax in figure.axes]
    assert titles[0] == "input 32×32 · 4×4 patches" and titles[1:5] == [f"layer 1 · head {h}" for h in range(4)]
    shown = figure.axes[0].get_images()[0].get_array()
    assert numpy_allclose(shown, capture.extras["image"].numpy())
    # the class token of heads 2 and 3 peaks on the odd patch: row 0, column 0 of the grid
    last = capture.layer(-1)[:, 0, 1:]  # [head, patch]
    assert last[2].argmax().item() == 0 and last[3].argmax().item() == 0


def numpy_allclose(a, b) -> bool:
    return bool(np.allclose(np.asarray(a), b, atol=1e-6))
