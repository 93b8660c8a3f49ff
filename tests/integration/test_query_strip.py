"""One query's attention as strips (``heatmap --query N``): the recorded rows against transformers' eager
attention, the figure's image and top-key marks against those rows (pooled by hand), the terminal view,
``--from-capture``, and bad input refused with one ``error:`` line.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy
import pytest
import torch
import transformers
from cli_helpers import run_cli
from figure_helpers import read_svg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import TEXTS

import attnviz
from attnviz.captures.attention_capture import AttentionCapture, capture
from attnviz.captures.query_rows import capture_query_rows, query_rows_of_capture
from attnviz.common.errors import InputError
from attnviz.common.selection import MEAN_OF_HEADS
from attnviz.common.tokens import display_token
from attnviz.core import attention as core_attention
from attnviz.models.specs import load_model
from attnviz.render.query_strip import query_strip

#: about 70 tokens: long enough for several blocks of queries once the block size is made small
TEXT = " ".join(TEXTS[:5])
#: the query positions checked: first, middle, last (as "last"), negative
QUERIES = [0, "middle", "last", -5]


@pytest.fixture(scope="module")
def eager(tiny_model_dirs):
    """``{family: (loaded model, eager attentions [layer][head, query, key])}`` for BERT and LLaMA (GQA)."""
    models = {}
    for family in ("bert", "llama"):
        loaded = load_model(str(tiny_model_dirs[family]), device="cpu")
        batch = loaded.encode([TEXT])
        reference = getattr(transformers, type(loaded.model).__name__).from_pretrained(
            str(tiny_model_dirs[family]), attn_implementation="eager"
        )
        with torch.no_grad():
            output = reference.eval()(**batch.inputs, output_attentions=True)
        models[family] = (loaded, [layer[0] for layer in output.attentions])
    return models


def _position(query, count: int) -> int:
    if query == "middle":
        return count // 2
    return count - 1 if query == "last" else query % count


@pytest.mark.parametrize("family", ["bert", "llama"])
@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("block_elements", [None, 8 * 70 * 6])  # all queries in one block, or blocks of ~6 queries
def test_rows_equal_eager_attention(eager, family, query, block_elements, monkeypatch):
    if block_elements is not None:
        monkeypatch.setattr(core_attention, "BLOCK_ELEMENTS", block_elements)
    loaded, reference = eager[family]
    count = reference[0].shape[1]
    rows = attnviz.query_rows(loaded, TEXT, count // 2 if query == "middle" else query)
    position = _position(query, count)
    assert rows.query == position and len(rows.key_tokens) == count
    assert rows.layers == list(range(len(reference)))
    for layer, expected in enumerate(reference):  # [head, query, key]
        assert rows.heads[layer] == list(range(expected.shape[0]))
        assert (rows.rows[layer] - expected[:, position, :]).abs().max() <= 1e-6, (family, layer)
    if loaded.causal:  # the query sees keys 0..position
        assert rows.visible is not None and rows.visible.tolist() == [k <= position for k in range(count)]
    else:
        assert rows.visible is None


class _RowsSeen:
    """Observer that notes the shape and start of every block it receives."""

    accepts_key_prefix = True

    def __init__(self) -> None:
        self.blocks: list[tuple[int, tuple[int, ...]]] = []

    def observe(self, site, pattern, query_start) -> None:
        self.blocks.append((query_start, tuple(pattern.shape)))


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_one_row_runs_the_models_fast_path(eager, family, monkeypatch):
    """With ``observed_queries`` each layer's output comes from torch's sdpa (as transformers' sdpa model gives
    it), and observers receive only the chosen row, computed apart: never the square."""
    loaded, reference = eager[family]
    count = reference[0].shape[1]
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting_sdpa(*args, **kwargs):
        calls.append(kwargs.get("is_causal", False))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting_sdpa)
    batch = loaded.encode([TEXT])
    seen = _RowsSeen()
    context = dataclasses.replace(loaded.context([seen]), observed_queries=range(7, 8))
    with torch.no_grad():
        fast = loaded.forward(batch, context).last_hidden_state
    layers = len(reference)
    assert calls == [loaded.causal] * layers  # causal models: is_causal, reading no mask
    assert seen.blocks == [(7, (1, reference[0].shape[0], 1, count))] * layers
    monkeypatch.undo()
    path = str(loaded.model.config._name_or_path)
    plain = getattr(transformers, type(loaded.model).__name__).from_pretrained(path, attn_implementation="sdpa")
    with torch.no_grad():
        expected = plain.eval().base_model(**batch.inputs).last_hidden_state
    assert (fast - expected).abs().max() <= 1e-5


def test_causal_mask_is_told_from_padding_and_windows():
    from attnviz.core.sdpa_rows import is_causal_mask

    lowest = torch.finfo(torch.float32).min
    keys = torch.arange(6)
    causal = torch.where(keys[None, :] <= keys[:, None], 0.0, lowest)[None, None]  # [1, 1, 6, 6]
    assert is_causal_mask(causal, 6, 6)
    assert is_causal_mask(causal.masked_fill(causal < 0, float("-inf")), 6, 6)
    padded = causal.clone()
    padded[..., 0] = lowest  # a padded first key
    assert not is_causal_mask(padded, 6, 6)
    window = causal.clone()
    window[..., 5, 0] = lowest  # a sliding window hides the oldest key
    assert not is_causal_mask(window, 6, 6)
    assert not is_causal_mask(torch.zeros(1, 1, 6, 6), 6, 6)  # bidirectional
    assert not is_causal_mask(None, 6, 6)


def test_chosen_layers_heads_and_mean(eager):
    loaded, reference = eager["llama"]
    rows = attnviz.query_rows(loaded, TEXT, -1, layers=[-1], heads=[2, 7])
    assert rows.layers == [1] and rows.heads == [[2, 7]]
    assert (rows.row(1, 7) - reference[1][7, -1]).abs().max() <= 1e-6
    mean = attnviz.query_rows(loaded, TEXT, 10, layers=[0], heads=MEAN_OF_HEADS)
    assert mean.labels() == ["L0 mean"]
    assert (mean.row(0) - reference[0][:, 10].mean(dim=0)).abs().max() <= 1e-6


def test_from_capture_gives_the_same_rows(eager, tmp_path, capsys):
    loaded, _ = eager["llama"]
    path = capture(loaded, TEXT).save(tmp_path / "c.safetensors")
    for query in (0, 17, "last", -3):
        live = attnviz.query_rows(loaded, TEXT, query)
        saved = attnviz.query_rows(AttentionCapture.load(path), query)
        assert saved.query == live.query and saved.key_tokens == live.key_tokens
        for mine, theirs in zip(saved.rows, live.rows):
            assert (mine - theirs).abs().max() <= 1e-6
    rows = attnviz.query_rows(AttentionCapture.load(path), 17, layers=[1], heads=[3])
    top = rows.top_keys(1)[0][0]
    result = run_cli(
        capsys, "heatmap", "--from-capture", path, "--query", "17", "--layer", "1", "--head", "3", "--terminal"
    )
    assert result.exit_code == 0, result.stderr
    assert f"{top}:{display_token(rows.key_tokens[top])}" in result.stdout  # the terminal view is the product: stdout


def _pool_by_hand(row: list[float], block: int) -> list[float]:
    return [max(row[start : start + block]) for start in range(0, len(row), block)]


@pytest.mark.parametrize("max_columns", [1024, 7])
def test_figure_shows_the_rows_and_marks_the_top_keys(eager, max_columns):
    loaded, reference = eager["llama"]
    rows = attnviz.query_rows(loaded, TEXT, 40, layers=[0, 1], heads=[1, 4, 6])
    figure = attnviz.heatmap(rows, max_columns=max_columns)
    strips_ax = figure.axes[0]
    shown = strips_ax.images[0].get_array()  # [strip, column], masked where the query sees no key
    count = len(rows.key_tokens)
    block = 1 if count <= max_columns else math.ceil(count / max_columns)
    expected = [reference[layer][head, 40].tolist() for layer in (0, 1) for head in (1, 4, 6)]  # eager rows
    assert shown.shape == (6, math.ceil(count / block))
    hidden = numpy.ma.getmaskarray(shown)
    for strip, row in enumerate(expected):
        pooled = _pool_by_hand(row, block)
        for column, value in enumerate(pooled):
            covers_visible = column * block <= 40  # a causal query at 40 sees keys 0..40
            assert bool(hidden[strip, column]) == (not covers_visible)
            if covers_visible:
                assert abs(float(shown[strip, column]) - value) <= 1e-6
    title = figure.get_suptitle()
    assert ("max-pooled" in title and f"largest weight of {block} neighbouring keys" in title) == (block > 1)

    # the top-5 marked and listed keys are the argmax-5 of each eager row
    marks = strips_ax.collections[0].get_offsets()  # (key + 0.5, a point inside the strip's row)
    marked = {(int(y), int(x)) for x, y in marks}
    listing = {text.get_gid(): text.get_text() for text in figure.axes[1].texts}
    for strip, row in enumerate(expected):
        top = torch.topk(torch.tensor(row), 5).indices.tolist()
        assert {key for s, key in marked if s == strip} == set(top)
        assert [int(key) for key in re.findall(r"(?:^|  )(\d+):", listing[f"top-keys-{strip}"])] == top


def test_first_query_of_a_causal_model_sees_one_key(eager):
    loaded, _ = eager["llama"]
    rows = attnviz.query_rows(loaded, TEXT, 0, layers=[0], heads=[0])
    assert rows.top_keys(5) == [[0]]
    assert float(rows.row(0, 0)[0]) == pytest.approx(1.0)
    shown = attnviz.heatmap(rows).axes[0].images[0].get_array()
    assert numpy.ma.getmaskarray(shown)[0].tolist() == [column != 0 for column in range(len(rows.key_tokens))]


def test_cli_figure_and_terminal(eager, tiny_model_dirs, tmp_path, capsys):
    loaded, reference = eager["bert"]
    model = str(tiny_model_dirs["bert"])
    out = tmp_path / "strip.svg"
    result = run_cli(capsys, "heatmap", TEXT, "--model", model, "--query", "-2", "--layer", "all", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == str(out)
    svg = read_svg(out).texts
    count = reference[0].shape[1]
    top = int(torch.argmax(reference[1][0, count - 2]))
    listed = f"{top}:{display_token(loaded.encode([TEXT]).tokens[0][top])} "
    assert any(text.startswith(listed) for text in svg)  # the list beside strip L1 H0 starts with its top key
    assert "L1 H3" in svg and "8 strips of 2 layers" in " ".join(result.stderr.split())

    terminal = run_cli(capsys, "heatmap", TEXT, "--model", model, "--query", "last", "--head", "2", "--terminal")
    assert terminal.exit_code == 0, terminal.stderr
    top = int(torch.argmax(reference[1][2, -1]))
    token = display_token(loaded.encode([TEXT]).tokens[0][top])
    assert f"top: {top}:{token}" in terminal.stdout and f"top: {top}:{token}" not in terminal.stderr


@pytest.mark.parametrize(
    ("query", "extra", "message"),
    [
        ("10000", [], "out of range"),
        ("abc", [], "token position"),
        ("1,2", [], "for images"),
        ("mean", [], "for images"),
        ("cls", [], "for images"),
        ("last", ["--out", "page.html"], "figure"),
        ("last", ["--view", "rollout"], "--view"),
        ("last", ["--words"], "--words"),
    ],
)
def test_bad_queries_on_text_are_refused(tiny_model_dirs, tmp_path, capsys, monkeypatch, query, extra, message):
    monkeypatch.chdir(tmp_path)
    model = str(tiny_model_dirs["bert"])
    args = ["heatmap", "The cat sat on the mat.", "--model", model, "--query", query, "--out", "strip.png", *extra]
    result = run_cli(capsys, *args)
    assert result.exit_code != 0
    assert len(result.error_lines()) == 1 and message in result.error_lines()[0], result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_library_refuses_a_query_out_of_range(eager):
    loaded, _ = eager["bert"]
    with pytest.raises(InputError, match="out of range"):
        attnviz.query_rows(loaded, "The cat sat.", 6)
    with pytest.raises(InputError, match="query position"):
        attnviz.query_rows(loaded, "The cat sat.", "first")  # type: ignore[arg-type]


def test_terminal_cells_are_the_pooled_row_in_the_colour_helpers_colours():
    """A planted row of 300 keys on 60 columns: each cell has the colour of the largest weight it covers."""
    from attnviz.captures.query_rows import QueryRows
    from attnviz.render.heatmap import FigureStyle
    from attnviz.render.strip_terminal import terminal_strip
    from attnviz.render.terminal import _colour

    keys = 300
    row = torch.full((keys,), 0.5 / (keys - 3))
    row[[0, 137, 299]] = torch.tensor([0.3, 0.15, 0.05])  # a sink, a peak in the middle, the last key
    row[150:] = 0.0  # a causal query at 149 sees keys 0..149
    row = row / row.sum()
    tokens = [f"w{index}" for index in range(keys)]
    rows = QueryRows("planted", "self", 149, tokens, tokens, [0], [[0]], [row[None, :]], torch.arange(keys) <= 149)
    group = terminal_strip(rows, width=67)  # "L0 H0 ", 60 columns of 5 keys, one column spare
    line = group.renderables[2]
    assert line.plain.startswith("L0 H0 ")
    cells = []  # the colour of each character after the label
    for span in line.spans:
        cells += [span.style.removeprefix("on ")] * (span.end - span.start)
    assert len(cells) == 60
    style = FigureStyle()
    norm, cmap = style.norm(float(row.max())), style.colour_map()
    for column in range(60):
        block = row[column * 5 : column * 5 + 5]
        expected = _colour(float(block.max()), norm, cmap) if column * 5 <= 149 else "grey23"
        assert cells[column] == expected, column
    assert "top: 0:w0 " in group.renderables[3].plain and "137:w137" in group.renderables[3].plain
    assert "each cell is the largest weight of 5 neighbouring keys" in group.renderables[-1].plain


def test_old_top_level_names_warn_and_are_the_functions_query_rows_calls():
    with pytest.deprecated_call(match=r"attnviz.query_rows\(model, text, query\)"):
        assert attnviz.capture_query_rows is capture_query_rows
    with pytest.deprecated_call(match=r"attnviz.query_rows\(capture, query\)"):
        assert attnviz.query_rows_of_capture is query_rows_of_capture
    with pytest.deprecated_call(match=r"attnviz.heatmap\(rows\)"):
        assert attnviz.query_strip is query_strip
    with pytest.deprecated_call(match="attnviz.captures.query_rows.QueryRows"):
        assert attnviz.QueryRows.__name__ == "QueryRows"


@pytest.fixture(scope="module")
def toy_capture(tmp_path_factory):
    from bad_input_helpers import TOY

    root = tmp_path_factory.mktemp("strip-fuzz")
    capture(load_model(str(TOY), device="cpu"), "a b c d").save(root / "good.safetensors")
    return root


QUERY_TEXT = st.one_of(
    st.sampled_from(["", " ", "last", "LAST", " -1 ", "-0", "+2", "1,2", "1, 2", "cls", "mean", "1e3", "0x10", "٣"]),
    st.integers(-(10**20), 10**20).map(str),
    st.text(max_size=8),
)
EXTRA = st.sampled_from([[], ["--terminal"], ["--head", "mean"], ["--layer", "all"], ["--scale", "log"], ["--words"]])


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(query=QUERY_TEXT, extra=EXTRA)
def test_any_query_gives_strips_or_one_error_line(toy_capture, capsys, monkeypatch, query, extra):
    monkeypatch.chdir(toy_capture)
    result = run_cli(
        capsys, "heatmap", "--from-capture", "good.safetensors", "--query", query, "--out", "s.png", *extra
    )
    assert "Traceback" not in result.stderr and "unexpected internal error" not in result.stderr
    if result.exit_code != 0:
        assert len(result.error_lines()) == 1, result.stderr
        assert not (toy_capture / "s.png").exists()
    (toy_capture / "s.png").unlink(missing_ok=True)


def test_last_is_the_last_token_that_is_not_whitespace():
    """A file's trailing newline (``Ċ`` in byte-level tokenizers) is not what "last" means; ``-1`` still is it."""
    from attnviz.captures.query_rows import resolve_query

    tokens = ["The", "Ġcat", "Ġsat", ".", "Ċ"]
    attentions = torch.softmax(torch.randn(2, 3, 5, 5), dim=-1)  # [layer, head, query, key]
    capture = AttentionCapture.from_attentions(attentions, tokens, causal=False)
    assert attnviz.query_rows(capture, "last").query == 3
    assert attnviz.query_rows(capture, -1).query == 4
    assert resolve_query("last", 4, ["a", "Ġb", "ĠĊ", "Ġ"]) == 1
    assert resolve_query("last", 3, ["\n", "\n", "\n"]) == 2  # nothing but whitespace: the very last
    assert resolve_query("last", 3) == 2
