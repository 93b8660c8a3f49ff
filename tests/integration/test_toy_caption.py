"""The shipped toy captioner on images drawn here, independently of attnviz's own task code: it must caption them
and, when it writes the k-th colour word, its last decoder layer's cross-attention (max over heads) must peak on
that word's patch."""

from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import assert_clean_error, run_cli
from figure_helpers import read_svg

COLOURS = {"red": (230, 25, 25), "green": (25, 200, 25), "blue": (25, 25, 230), "yellow": (230, 230, 25)}


def independent_images(count: int, seed: int):
    """``count`` task images built with numpy's generator (not the task module): PIL images, captions, patches."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    examples = []
    for _ in range(count):
        grey = int(rng.integers(64, 193))
        pixels = np.full((32, 32, 3), grey, dtype=np.uint8)
        marked = int(rng.integers(1, 4))
        patches = sorted(rng.choice(16, size=marked, replace=False).tolist())
        words = rng.choice(list(COLOURS), size=marked, replace=False).tolist()
        for patch, word in zip(patches, words):
            row, col = divmod(patch, 4)
            pixels[row * 8 : row * 8 + 8, col * 8 : col * 8 + 8] = COLOURS[word]
        examples.append((Image.fromarray(pixels, "RGB"), " ".join(words), patches))
    return examples


@pytest.fixture(scope="module")
def toy_caption():
    from attnviz.models.specs import load_model

    return load_model("toy-caption", device="cpu")


def test_shipped_captioner_writes_and_looks_at_each_colour(toy_caption, one_torch_thread):
    import attnviz
    from attnviz.render.caption_overlay import peak_patches

    examples = independent_images(300, seed=2024)
    right = hits = words = 0
    for image, caption, patches in examples:
        written = attnviz.generate(toy_caption, image, max_new_tokens=10)
        right += written.text == caption
        peaks = peak_patches(written.capture)  # (word, (row, col)) for each written token
        for k, patch in enumerate(patches):
            words += 1
            hits += k < len(peaks) and peaks[k][1] == divmod(patch, 4)
    assert right / len(examples) >= 0.95, right
    assert hits / words >= 0.90, (hits, words)


def test_toy_caption_through_the_command_line(capsys, tmp_path):
    image, caption, _ = independent_images(1, seed=5)[0]
    path = tmp_path / "shapes.png"
    image.save(path)
    result = run_cli(capsys, "heatmap", "--image", path, "--model", "toy-caption", "--generate", "4", "--out",
                     tmp_path / "caption.svg")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert f"'{caption}'" in result.stderr
    texts = read_svg(tmp_path / "caption.svg").texts
    assert [text for text in texts if text in COLOURS] == caption.split()


def test_terminal_on_an_image_says_the_real_reason_first(capsys, tmp_path):
    image, _, _ = independent_images(1, seed=5)[0]
    path = tmp_path / "shapes.png"
    image.save(path)
    base = ("heatmap", "--image", path, "--model", "toy-caption", "--generate", "5", "--terminal")
    for extra in ((), ("--head", "mean"), ("--layer", "0,1")):  # no advice to pick a head or a layer first
        result = run_cli(capsys, *base, *extra)
        assert_clean_error(result, "--terminal does not apply to an image: an image is drawn as overlays")
        assert len(result.error_lines()) == 1
    assert_clean_error(run_cli(capsys, *base, "--words"), "--terminal and --words do not apply to an image")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shapes.png"]


def test_captioner_statistics_count_each_side_and_measure_no_positions_across(toy_caption, one_torch_thread):
    import math

    from attnviz.stats.detect import detect_heads
    from attnviz.stats.images import compute_image_statistics
    from attnviz.stats.tables import head_rows, head_table

    images = [image for image, _, _ in independent_images(2, seed=7)]
    stats = compute_image_statistics(toy_caption, images, progress=False)
    grid = stats.image.grid
    assert stats.stack_tokens("encoder") == 2 * grid.num_tokens == stats.num_tokens  # 17 image tokens each
    captions = stats.stack_tokens("decoder")
    assert captions == stats.stack_tokens("cross") and 2 * 2 <= captions <= 2 * 6  # start + words + end, per image
    for site, head, values in stats.heads():
        positional = [values[name] for name in ("diagonal", "previous_token", "local_ratio", "mean_distance")]
        assert all(math.isnan(value) for value in positional) == (site.stack == "cross"), (site, values)
    detection = detect_heads(stats)
    cross_flags = [
        flag for site, heads in detection.flags.items() if site.stack == "cross" for h in heads for flag in h
    ]
    assert not {"diagonal", "previous_token", "local"} & set(cross_flags)
    title = head_table(stats, head_rows(stats, detection, stack="decoder"), stack="decoder").title
    assert title.endswith(f"2 examples, {captions} tokens")
    encoder = head_table(stats, head_rows(stats, detection, stack="encoder"), stack="encoder")
    assert encoder.title.endswith(f"2 examples, {2 * grid.num_tokens} image tokens")
    assert "dist mean distance (patches on the grid)" in encoder.caption


def test_unknown_caption_words_are_named(capsys, tmp_path):
    image, _, _ = independent_images(1, seed=5)[0]
    image.save(tmp_path / "shapes.png")
    args = ("heatmap", "--image", tmp_path / "shapes.png", "--model", "toy-caption", "--out", tmp_path / "c.png")
    result = run_cli(capsys, *args, "--target", "purple cat")
    assert_clean_error(
        result,
        "toy-caption does not know the words 'purple', 'cat' of the caption (each would be read as <unk>): "
        "it knows blue, green, red, yellow",
    )
    assert not (tmp_path / "c.png").exists()


def test_overlay_colour_is_the_weight_alone(toy_caption, one_torch_thread):
    """A patch of weight 0 looks the same over a red shape as over the grey ground, and the subtitle fits."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    import attnviz
    from attnviz.render.caption_overlay import caption_heatmap, caption_rows

    image, caption, patches = independent_images(1, seed=5)[0]
    capture = attnviz.capture(toy_caption, image, target=caption)
    figure = caption_heatmap(capture)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    pixels = np.asarray(canvas.buffer_rgba())[..., :3].astype(int)
    height = pixels.shape[0]
    compared = 0
    for index, panel in enumerate(caption_rows(capture)[0].panels):
        box = figure.axes[1 + index].get_window_extent()  # the word's overlay (axes[0] is the picture)

        def colour(patch: int, box=box):
            row, col = divmod(patch, 4)
            x = int(box.x0 + (col + 0.5) * box.width / 4)
            y = int(height - (box.y1 - (row + 0.5) * box.height / 4))
            return pixels[y, x]

        zero = [p for p in range(16) if float(panel.patches.flatten()[p]) < 0.005]
        plain = [p for p in zero if p not in patches]
        for patch in (p for p in zero if p in patches and plain):  # a coloured shape under a cell of weight 0 ...
            # ... within a few levels of a cell of weight 0 over the grey ground: the picture's hue does not show
            assert np.abs(colour(patch) - colour(plain[0])).max() <= 16, (panel.title, patch)
            compared += 1
    assert compared
    title = figure._suptitle.get_window_extent(renderer=canvas.get_renderer())
    assert title.x0 >= 0 and title.x1 <= figure.bbox.width  # not cut at either edge


def test_a_captioner_whose_processor_and_encoder_disagree_on_the_size_says_so(capsys, tmp_path):
    import json
    import shutil

    from attnviz.common.texts import sample_data_path

    folder = tmp_path / "captioner"
    shutil.copytree(sample_data_path("toy", "caption"), folder)
    settings = json.loads((folder / "preprocessor_config.json").read_text())
    settings["size"] = {"height": 64, "width": 64}
    (folder / "preprocessor_config.json").write_text(json.dumps(settings))
    image, _, _ = independent_images(1, seed=5)[0]
    image.save(tmp_path / "shapes.png")
    result = run_cli(capsys, "heatmap", "--image", tmp_path / "shapes.png", "--model", folder, "--generate", "2",
                     "--out", tmp_path / "c.png")  # fmt: skip
    assert_clean_error(
        result,
        "its image processor makes 64×64 pictures (preprocessor_config.json) but its encoder takes 32×32 "
        "(image_size in config.json): make the two agree",
    )
    assert "cannot load model" not in result.stderr and not (tmp_path / "c.png").exists()
