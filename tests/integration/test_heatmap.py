"""Heatmap rendering from tensors, and sub-word merging."""

from __future__ import annotations

import struct

import pytest
import torch

import attnviz
from attnviz.captures.attention_capture import AttentionCapture, capture
from attnviz.common.errors import InputError, OutputError
from attnviz.common.tokens import display_token, merge_words, word_groups, word_label
from attnviz.render.heatmap import causal_visibility, save_figure
from attnviz.render.selection import MEAN_OF_HEADS


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    return struct.unpack(">II", data[16:24])


def test_merge_words_by_hand():
    # tokens: [CLS] play ##ing now [SEP]  -> words: [CLS] playing now [SEP]
    word_ids = [None, 0, 0, 1, None]
    pattern = torch.tensor(
        [
            [0.2, 0.2, 0.2, 0.2, 0.2],
            [0.1, 0.3, 0.2, 0.3, 0.1],
            [0.5, 0.1, 0.1, 0.1, 0.2],
            [0.0, 0.5, 0.5, 0.0, 0.0],
            [0.2, 0.2, 0.2, 0.2, 0.2],
        ]
    )
    merged = merge_words(pattern, word_ids, word_ids)
    assert word_groups(word_ids) == [[0], [1, 2], [3], [4]]
    expected_playing_row = [(0.1 + 0.5) / 2, (0.3 + 0.2 + 0.1 + 0.1) / 2, (0.3 + 0.1) / 2, (0.1 + 0.2) / 2]
    torch.testing.assert_close(merged[1], torch.tensor(expected_playing_row))
    torch.testing.assert_close(merged[2], torch.tensor([0.0, 1.0, 0.0, 0.0]))  # "now" looks at "playing"
    torch.testing.assert_close(merged.sum(-1), torch.ones(4))
    assert word_label(["[CLS]", "play", "##ing"], [1, 2]) == "playing"
    assert display_token("Ġthe") == "␣the" and display_token("▁cat") == "␣cat" and display_token("the") == "the"


def test_words_rows_still_sum_to_one_on_a_real_split_sentence(minilm):
    result = capture(minilm, "Tokenization of unbelievably antidisestablishmentarianism words.")
    assert len(result.tokens) > len({w for w in result.word_ids if w is not None}) + 2  # some words were split
    merged = merge_words(result.layer(0), result.word_ids, result.word_ids)
    n_words = len(word_groups(result.word_ids))
    assert merged.shape == (12, n_words, n_words)
    torch.testing.assert_close(merged.sum(-1), torch.ones(12, n_words), atol=1e-5, rtol=0)


def test_causal_visibility():
    assert causal_visibility(3, 3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_render_formats(minilm, tmp_path, suffix):
    result = capture(minilm, "The cat sat on the mat because it was tired.")
    path = save_figure(attnviz.heatmap(result, layers=[0], heads=[3]), tmp_path / f"head{suffix}")
    data = path.read_bytes()
    if suffix == ".png":
        width, height = png_size(path)
        assert 600 < width < 6000 and 600 < height < 6000
    elif suffix == ".svg":
        assert b"<svg" in data[:2000] and len(data) > 20_000
        assert b"[CLS]" in data or b"CLS" in data  # tick labels are text
    else:
        assert data.startswith(b"%PDF")


def test_grid_and_long_inputs_stay_bounded(tmp_path):
    n = 300
    pattern = torch.softmax(torch.randn(2, 4, n, n), dim=-1)
    result = AttentionCapture(
        model="synthetic",
        tokens=[f"t{i}" for i in range(n)],
        causal=True,
        patterns={"self": list(pattern)},
        special=[False] * n,
        word_ids=list(range(n)),
    )
    width, height = png_size(
        save_figure(attnviz.heatmap(result, layers=None, heads=MEAN_OF_HEADS), tmp_path / "grid.png")
    )
    assert width <= 30 * 150 and height <= 30 * 150


def test_bad_selection_and_paths(minilm, tmp_path):
    result = capture(minilm, "Hello there.")
    with pytest.raises(InputError, match="out of range"):
        attnviz.heatmap(result, layers=[7])
    with pytest.raises(InputError, match="out of range"):
        attnviz.heatmap(result, heads=[12])
    with pytest.raises(OutputError, match="unsupported output file type"):
        save_figure(attnviz.heatmap(result, layers=[0], heads=[0]), tmp_path / "x.jpg")
    with pytest.raises(OutputError, match="does not exist"):
        save_figure(attnviz.heatmap(result, layers=[0], heads=[0]), tmp_path / "missing" / "x.png")


def test_every_layer_and_head_is_laid_out_one_row_per_layer():
    """No panel cap: SmolLM2's 30 x 9 heads give 30 rows of 9 panels (issue 10: the cap failed after loading)."""
    pattern = torch.softmax(torch.randn(30, 9, 4, 4), dim=-1)
    result = AttentionCapture(model="synthetic", tokens=list("abcd"), causal=True, patterns={"self": list(pattern)})
    figure = attnviz.heatmap(result, layers=None, heads=None)
    panels = [ax for ax in figure.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels[:10]] == [f"L0 H{h}" for h in range(9)] + ["L1 H0"]
    rows = {round(ax.get_position().y0, 3) for ax in panels}
    assert len(panels) == 270 and len(rows) == 30
