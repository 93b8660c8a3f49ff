"""Legible figures and the terminal view: colour scales, label thinning, masked legend, fonts, names."""

from __future__ import annotations

import itertools
import re

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli
from rich.console import Console

import attnviz
from attnviz.captures.attention_capture import AttentionCapture, capture
from attnviz.common.errors import InputError
from attnviz.render.heatmap import MASKED_LABEL, FigureStyle, label_positions, save_figure
from attnviz.render.selection import MEAN_OF_HEADS
from attnviz.render.terminal import terminal_heatmap


def _synthetic(n=12, causal=True, layers=2, heads=3, model="smollm2"):
    torch.manual_seed(0)
    scores = torch.randn(layers, heads, n, n)
    if causal:
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return AttentionCapture(
        model=model,
        tokens=[f"t{i}" for i in range(n)],
        causal=causal,
        patterns={"self": list(torch.softmax(scores, dim=-1))},
        special=[False] * n,
        word_ids=list(range(n)),
    )


def test_thinned_labels_keep_first_and_last():
    assert label_positions(10, 20) == list(range(10))
    positions = label_positions(353, 60)
    assert positions[0] == 0 and positions[-1] == 352 and len(positions) <= 61
    gaps = {b - a for a, b in itertools.pairwise(positions[:-1])}
    assert gaps == {6}  # evenly spaced apart from the final label


def test_scales_map_weights_as_documented():
    assert FigureStyle("sqrt").norm(1.0)(0.25) == pytest.approx(0.5)
    assert FigureStyle("log").norm(1.0)(0.01) == pytest.approx(1 / 3)  # two decades above the bottom of three
    assert FigureStyle("linear").norm(0.5)(0.25) == pytest.approx(0.5)
    with pytest.raises(InputError, match="colour map"):
        FigureStyle(cmap="no-such-map").check()


def test_figure_draws_the_pattern_with_vmax_and_masked_legend():
    result = _synthetic()
    figure = attnviz.heatmap(result, layers=[1], heads=[2], style=FigureStyle(scale="sqrt", vmax=0.3))
    image = figure.axes[0].images[0]
    drawn = image.get_array()  # [query, key], masked above the diagonal
    assert bool(drawn.mask[0, 1]) and not bool(drawn.mask[1, 0])
    assert torch.allclose(torch.from_numpy(drawn.filled(0.0)).float(), result.layer(1)[2], atol=1e-6)
    assert image.norm.vmax == 0.3 and image.norm(0.3 * 0.25) == pytest.approx(0.5)
    assert [t.get_text() for t in figure.legends[0].get_texts()] == [MASKED_LABEL]
    assert figure._suptitle.get_text().startswith("SmolLM2-135M-Instruct (smollm2)")
    bidirectional = attnviz.heatmap(_synthetic(causal=False), layers=[0], heads=[0])
    assert bidirectional.legends == []


def test_pdf_uses_truetype_and_svg_keeps_text(tmp_path):
    result = _synthetic(causal=False, model="tiny")
    pdf = save_figure(attnviz.heatmap(result, layers=[0], heads=[1]), tmp_path / "h.pdf").read_bytes()
    assert b"/FontFile2" in pdf and b"/Type3" not in pdf  # TrueType outlines (Type 42), no Type 3 fonts
    svg = save_figure(attnviz.heatmap(result, layers=[0], heads=[1]), tmp_path / "h.svg").read_text()
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert "t0" in texts and "t11" in texts


def test_terminal_view_fits_and_says_what_is_left_out():
    result = _synthetic(n=40, causal=True)
    console = Console(record=True, width=60, color_system="truecolor", force_terminal=True)
    console.print(terminal_heatmap(result, layer=0, head=1, width=60))
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 60
    assert "left out to fit: keys 27–39 (13 of 40)" in " ".join(text.split())
    assert MASKED_LABEL in text
    # the strongest visible cell of the first shown row is drawn with the top colour of the map
    import matplotlib

    top = matplotlib.colormaps["viridis"](1.0)
    hex_colour = "#" + "".join(f"{int(channel * 255):02x}" for channel in top[:3])
    console = Console(record=True, width=60, color_system="truecolor", force_terminal=True)
    console.print(terminal_heatmap(result, layer=0, head=1, width=60, style=FigureStyle(vmax=1e-6)))
    assert f"background-color: {hex_colour}" in console.export_html(inline_styles=True)


def test_terminal_cli_on_minilm(minilm, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "90")
    result = run_cli(capsys, "heatmap", "The cat sat on the mat.", "--layer", "0", "--head", "3", "--terminal")
    assert result.exit_code == 0, result.stderr
    # the view is the product (stdout: `> file` keeps it); the summary line stays on stderr
    assert "all-MiniLM-L6-v2 (minilm) · layer 0, head 3" in result.stdout
    # redirected, the colours are gone: every row of cells carries its weights as shades, a legend says which
    rows = [line for line in result.stdout.splitlines() if line.startswith(("[CLS] ", "  the ", "[SEP] "))]
    assert len(rows) == 4 and all(set(line[6:]) - {" "} <= set("░▒▓█") and line[6:].strip() for line in rows)
    assert "(linear scale)" in result.stdout and "█ ≤" in result.stdout
    assert "layer 0, head 3" not in result.stderr and "minilm (bidirectional)" in " ".join(result.stderr.split())
    assert_clean_error(run_cli(capsys, "heatmap", "Hi.", "--terminal", "--layer", "all"), "one layer at a time")
    assert_clean_error(run_cli(capsys, "heatmap", "Hi.", "--terminal", "--head", "0,1"), "one head at a time")
    assert_clean_error(run_cli(capsys, "heatmap", "Hi.", "--cmap", "nope"), "unknown colour map")


def test_real_capture_title_names_the_model(minilm):
    figure = attnviz.heatmap(capture(minilm, "Hello there."), layers=None, heads=MEAN_OF_HEADS)
    assert figure._suptitle.get_text().startswith("all-MiniLM-L6-v2 (minilm) · layers 0–5")
