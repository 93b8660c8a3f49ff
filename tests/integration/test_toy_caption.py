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
    from attnviz.captures.captioning import caption_capture
    from attnviz.render.caption_overlay import peak_patches

    examples = independent_images(300, seed=2024)
    right = hits = words = 0
    for image, caption, patches in examples:
        written = caption_capture(toy_caption, image, max_new_tokens=10)
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
