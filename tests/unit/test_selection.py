"""Selections: the CLI parses the text, the library checks integers against the capture, render draws them."""

from __future__ import annotations

import pytest
import torch

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.cli.errors import error_message
from attnviz.cli.selection import check_one_pattern, parse_head_option, parse_layer_option
from attnviz.common.errors import InputError, ParameterError
from attnviz.render.capture_view import capture_panels
from attnviz.render.selection import MEAN_OF_HEADS, resolve_heads, resolve_layers


def test_cli_text_becomes_typed_selections():
    assert parse_layer_option("all") is None and parse_layer_option(" ALL ") is None
    assert parse_layer_option("-1") == [-1]
    with pytest.raises(InputError, match="empty entry"):  # a left-out entry is refused, not skipped
        parse_layer_option("0, 3,")
    assert parse_head_option("all") is None
    assert parse_head_option("Mean") is MEAN_OF_HEADS
    assert parse_head_option("2,-1") == [2, -1]
    with pytest.raises(InputError, match="--layer 'x' is not a number"):
        parse_layer_option("0,x")
    with pytest.raises(InputError, match="--head '1.5' is not a number"):
        parse_head_option("1.5")
    with pytest.raises(InputError, match="no layer given"):
        parse_layer_option(" , ")


def test_terminal_takes_one_layer_and_one_head():
    assert check_one_pattern([-1], [3]) == (-1, 3)
    assert check_one_pattern([0], MEAN_OF_HEADS) == (0, MEAN_OF_HEADS)
    with pytest.raises(InputError, match="one layer at a time"):
        check_one_pattern(None, [0])
    with pytest.raises(InputError, match="one head at a time"):
        check_one_pattern([0], [0, 1])
    with pytest.raises(InputError, match="one head at a time"):
        check_one_pattern([0], None)


def test_library_resolves_integers_and_names_its_parameter():
    assert resolve_layers(None, 4) == [0, 1, 2, 3]
    assert resolve_layers([-1, 0], 4) == [3, 0]
    with pytest.raises(ParameterError) as caught:
        resolve_layers([4], 4)
    assert caught.value.parameter == "layers"
    assert str(caught.value) == "layers: layer 4 is out of range: the model has 4 layers (0–3, or -1 for the last)"
    assert error_message(caught.value).startswith("--layer: layer 4 is out of range")  # the CLI's wording
    assert resolve_heads(None, range(3)) == [0, 1, 2]
    assert resolve_heads([-1], range(3)) == [2]
    assert resolve_heads(MEAN_OF_HEADS, range(3)) is MEAN_OF_HEADS
    with pytest.raises(ParameterError, match="head -4 is out of range"):
        resolve_heads([-4], range(3))


def test_pruned_heads_are_chosen_by_their_original_numbers():
    kept = [0, 2, 5]  # original numbers of the heads left in the layer's weights
    assert resolve_heads([5, 0], kept) == [2, 0]  # positions in the pattern tensor
    assert resolve_heads([-1], kept) == [2]  # the last original head, 5
    assert resolve_heads(None, kept) == [0, 1, 2]
    with pytest.raises(ParameterError, match="head 3 was pruned from this layer: it keeps heads 0, 2, 5"):
        resolve_heads([3], kept)


def test_panels_draw_the_selected_patterns():
    patterns = torch.softmax(torch.randn(3, 4, 5, 5, generator=torch.Generator().manual_seed(0)), dim=-1)
    capture = AttentionCapture(model="synthetic", tokens=list("abcde"), causal=False, patterns={"self": list(patterns)})
    rows, _, _, title = capture_panels(capture, layers=[-1], heads=[1, -1])
    assert [panel.title for panel in rows[0]] == ["L2 H1", "L2 H3"]
    assert torch.equal(rows[0][0].pattern, patterns[2, 1]) and torch.equal(rows[0][1].pattern, patterns[2, 3])
    rows, _, _, title = capture_panels(capture, layers=None, heads=MEAN_OF_HEADS)
    assert len(rows) == 3 and all(len(row) == 1 for row in rows)
    assert torch.allclose(rows[1][0].pattern, patterns[1].mean(dim=0))  # [query, key]
    assert title.endswith("layers 0–2")
