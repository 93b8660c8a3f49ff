"""Static figures of long inputs: max-pooled cells equal the block maxima computed by hand, the figure says
how much it pooled, and tick labels stay few."""

from __future__ import annotations

import pytest
import torch

from attnviz.common.audio import time_label
from attnviz.render.heatmap import MAX_TICK_LABELS, HeatmapPanel, causal_visibility, render_heatmaps
from attnviz.render.pooling import max_pool, pool_labels, pool_panels


def _block_max_by_hand(pattern: torch.Tensor, query_width: int, key_width: int) -> torch.Tensor:
    """Each block's maximum, one block at a time in Python (small patterns)."""
    rows = -(-pattern.shape[0] // query_width)
    columns = -(-pattern.shape[1] // key_width)
    expected = torch.empty(rows, columns)
    for i in range(rows):
        for j in range(columns):
            block = pattern[i * query_width : (i + 1) * query_width, j * key_width : (j + 1) * key_width]
            expected[i, j] = max(float(value) for value in block.flatten())
    return expected


def _block_max_by_reshape(pattern: torch.Tensor, query_width: int, key_width: int) -> torch.Tensor:
    """Each block's maximum: pad with -inf to whole blocks, view ``[rows, w_q, columns, w_k]``, take the max."""
    rows, columns = -(-pattern.shape[0] // query_width), -(-pattern.shape[1] // key_width)
    padded = torch.full((rows * query_width, columns * key_width), float("-inf"))
    padded[: pattern.shape[0], : pattern.shape[1]] = pattern
    return padded.view(rows, query_width, columns, key_width).amax(dim=(1, 3))


def test_the_two_hand_computations_agree():
    pattern = torch.rand(31, 29, generator=torch.Generator().manual_seed(3))
    assert torch.equal(_block_max_by_hand(pattern, 4, 3), _block_max_by_reshape(pattern, 4, 3))


def _causal_pattern(length: int, seed: int = 0) -> torch.Tensor:
    """``[length, length]`` rows softmaxed over the visible (earlier) keys, a planted sharp weight in row 700."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(length, length, generator=generator)
    scores = scores.masked_fill(~causal_visibility(length, length), float("-inf"))
    pattern = torch.softmax(scores, dim=-1)
    pattern[700] = 0.0
    pattern[700, 333] = 1.0  # one key: a mean over blocks would hide it, the maximum keeps it
    return pattern


def test_max_pool_equals_block_maxima_with_a_shorter_last_block():
    pattern = torch.rand(103, 77, generator=torch.Generator().manual_seed(1))
    pooled = max_pool(pattern, 5, 4)
    assert pooled.shape == (21, 20)
    assert torch.equal(pooled, _block_max_by_hand(pattern, 5, 4))


def test_pooled_figure_draws_block_maxima_and_says_so():
    length = 1030  # above 512 a side: 512 bins of ⌈1030/512⌉ = 3 tokens, the last one 1 token wide
    pattern = _causal_pattern(length)
    labels = [f"t{i}" for i in range(length)]
    panel = HeatmapPanel(pattern=pattern, title="L0 H0", visible=causal_visibility(length, length))
    figure = render_heatmaps([panel], labels, labels, title="long")
    image = figure.axes[0].images[0]
    drawn = image.get_array()  # a masked array: cells no query of the block can see are masked
    expected = _block_max_by_reshape(pattern, 3, 3)
    assert drawn.shape == (344, 344)
    visible = ~drawn.mask
    assert torch.allclose(torch.from_numpy(drawn.data[visible]).float(), expected[torch.from_numpy(visible)])
    # masked exactly where every cell of the block is the causal future
    assert torch.equal(
        torch.from_numpy(visible), _block_max_by_reshape(causal_visibility(length, length).float(), 3, 3) > 0
    )
    assert drawn[700 // 3, 333 // 3] == 1.0  # the planted weight survives pooling
    assert "max-pooled: 3×3 tokens per cell" in figure._suptitle.get_text()
    axis = figure.axes[0]
    assert 2 <= len(axis.get_xticklabels()) <= MAX_TICK_LABELS
    assert 2 <= len(axis.get_yticklabels()) <= MAX_TICK_LABELS
    assert axis.get_yticklabels()[-1].get_text() == "1029 t1029"  # a pooled label: the block's first token


def test_short_patterns_are_not_pooled():
    pattern = torch.softmax(torch.randn(40, 40), dim=-1)
    labels = [str(i) for i in range(40)]
    panels, query_labels, _, pooling = pool_panels([HeatmapPanel(pattern, "x")], labels, labels, grid=False)
    assert pooling is None and panels[0].pattern is pattern and query_labels == labels
    figure = render_heatmaps([HeatmapPanel(pattern, "x")], labels, labels, title="short")
    assert "max-pooled" not in figure._suptitle.get_text()
    assert torch.equal(torch.from_numpy(figure.axes[0].images[0].get_array()).float(), pattern)


@pytest.mark.parametrize(("queries", "keys"), [(600, 2000), (2000, 600)])
def test_cross_attention_pools_each_axis_by_its_own_length(queries, keys):
    pattern = torch.rand(queries, keys, generator=torch.Generator().manual_seed(2))
    panels, query_labels, key_labels, pooling = pool_panels(
        [HeatmapPanel(pattern, "x")], [str(i) for i in range(queries)], [str(i) for i in range(keys)], grid=True
    )
    assert pooling is not None
    widths = (-(-queries // 256), -(-keys // 256))  # a grid's panels: at most 256 cells a side
    assert (pooling.query_width, pooling.key_width) == widths
    assert torch.equal(panels[0].pattern, _block_max_by_reshape(pattern, *widths))
    assert len(query_labels) == panels[0].pattern.shape[0] and len(key_labels) == panels[0].pattern.shape[1]


def test_grid_panels_are_pooled_to_256_cells_with_few_labels():
    length = 600
    labels = [f"t{i}" for i in range(length)]
    panels = [HeatmapPanel(torch.softmax(torch.randn(length, length), dim=-1), f"L{i} H0") for i in range(2)]
    figure = render_heatmaps([[panel] for panel in panels], labels, labels, title="grid")
    assert "max-pooled: 3×3 tokens per cell" in figure._suptitle.get_text()  # ⌈600/256⌉ = 3
    drawn = [axis for axis in figure.axes if axis.images]
    assert [axis.images[0].get_array().shape for axis in drawn] == [(200, 200), (200, 200)]
    for axis in drawn:
        assert len(axis.get_yticklabels()) <= MAX_TICK_LABELS // 3


def test_pooled_labels_name_each_block_by_its_first_token_and_a_time_frame_by_its_time_alone():
    tokens = [f"w{i}" for i in range(10)]
    assert pool_labels(tokens, 4) == ["0 w0", "4 w4", "8 w8"]
    frames = [time_label(0.02 * frame) for frame in range(10)]  # Whisper's 20 ms frames
    assert pool_labels(frames, 4) == ["0.00s", "0.08s", "0.16s"]
    assert pool_labels(tokens, 1) == tokens
