"""``attnviz heatmap --out view.html``: the encoding, the page's size, and the page in a real browser."""

from __future__ import annotations

import json
import re

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli

from attnviz.captures.attention_capture import AttentionCapture, capture
from attnviz.common.tokens import merge_words
from attnviz.render.html_page import dequantize_rows, quantize_rows
from attnviz.render.html_view import attention_view_payload, write_attention_view

SENTENCE = "The cat sat on the mat because it was tired."
TOLERANCE = 1 / 255


def _payload(path):
    text = path.read_text(encoding="utf-8")
    return json.loads(
        re.search(r'<script type="application/json" id="attnviz-data">(.*?)</script>', text, re.DOTALL)[1]
    )


def test_row_quantisation_is_within_half_a_step():
    pattern = torch.softmax(torch.randn(3, 7, 11) * 3, dim=-1)  # [head, query, key]
    pattern[0, 2] = 0.0  # an all-zero row (masked everywhere) must survive
    decoded = dequantize_rows(quantize_rows(pattern), tuple(pattern.shape))
    row_max = pattern.amax(dim=-1, keepdim=True)
    assert torch.all((decoded - pattern).abs() <= row_max / 510 + 1e-7)
    assert torch.equal(decoded[0, 2], torch.zeros(11))


def test_smollm2_sized_page_stays_under_5_mb(tmp_path):
    """30 layers x 9 heads on 100 tokens of a causal model (SmolLM2's shape)."""
    n = 100
    layers = [torch.softmax(torch.randn(9, n, n), dim=-1).tril() for _ in range(30)]
    result = AttentionCapture(
        model="smollm2",
        tokens=[f"tok{i}" for i in range(n)],
        causal=True,
        patterns={"self": layers},
        special=[False] * n,
        word_ids=list(range(n)),
    )
    path = write_attention_view(tmp_path / "view.html", result)
    assert path.stat().st_size < 5_000_000
    payload = _payload(path)
    assert payload["title"] == "SmolLM2-135M-Instruct (smollm2)"
    stack = payload["stacks"][0]
    assert stack["visible"] == list(range(1, n + 1))  # query i sees keys 0..i
    decoded = dequantize_rows(stack["layers"][29], (9, n, n))
    assert torch.allclose(decoded, layers[29], atol=TOLERANCE)


def test_words_payload_matches_merge_words(minilm):
    result = capture(minilm, "Tokenization is unbelievable.")
    payload = attention_view_payload(result, words=True)
    stack = payload["stacks"][0]
    assert "tokenization" in stack["queries"] and "unbelievable" in stack["keys"]
    expected = merge_words(result.layer(3), result.word_ids, result.word_ids)  # [head, Wq, Wk]
    decoded = dequantize_rows(stack["layers"][3], tuple(expected.shape))
    assert torch.allclose(decoded, expected, atol=TOLERANCE)


@pytest.fixture(scope="module")
def minilm_page(minilm, tmp_path_factory):
    result = capture(minilm, SENTENCE)
    path = write_attention_view(tmp_path_factory.mktemp("view") / "view.html", result)
    return result, path


#: view.js draws no line below this weight unless it is within a quarter of the row's maximum
LINE_MIN = 0.02


def _ready(run):
    run.page.wait_for_selector("body[data-ready=true]")


def _choose_query(run, query):
    run.page.fill("#query-input", str(query))
    run.page.dispatch_event("#query-input", "change")
    _ready(run)


def _head_view_weights(run, layer, head, query, expected):
    """Select ``layer``, show only ``head``, choose ``query``; check the lines and blocks against ``expected``
    (the captured ``[key]`` row) and return the weights the page holds for that row."""
    page = run.page
    _ready(run)
    page.select_option("#layer-select", str(layer))
    _ready(run)
    page.click("#heads-none")
    page.click(f'.head-toggle[data-head="{head}"]')
    _choose_query(run, query)
    assert page.get_attribute("#head-readout", "data-query") == str(query)
    lines = page.eval_on_selector_all(
        "line.att",
        "nodes => nodes.map(n => [+n.dataset.head, +n.dataset.key, +n.dataset.weight, +n.getAttribute('stroke-width')])",
    )
    assert {h for h, _, _, _ in lines} <= {head}
    _check_lines([(0, key, weight) for _, key, weight, _ in lines], expected[None])
    widths = sorted((weight, width) for _, _, weight, width in lines)
    assert [w for _, w in widths] == sorted(w for _, w in widths)  # thicker lines for larger weights
    blocks = page.eval_on_selector_all(f'rect.block[data-head="{head}"]', "nodes => nodes.map(n => +n.dataset.key)")
    assert len(blocks) == len(expected)  # one block beside every key
    row = page.evaluate(f"() => attnviz.row({_stack_index(run)}, {layer}, {head}, {query})")
    return dict(zip(row["keys"], row["weights"], strict=True))


def _check_lines(lines, expected):
    """``lines``: (head, key, weight) drawn; ``expected``: ``[head, key]`` captured weights of the query.
    Every line carries its captured weight, and every weight clearly above the threshold has its line."""
    assert lines
    drawn = {(head, key) for head, key, _ in lines}
    for head, key, weight in lines:
        assert abs(weight - float(expected[head, key])) <= TOLERANCE
        assert weight >= min(LINE_MIN, float(expected[head].max()) / 4) - TOLERANCE
    for head, key in (expected >= LINE_MIN + TOLERANCE).nonzero().tolist():
        assert (head, key) in drawn, (head, key)


def _stack_index(run):
    return run.page.evaluate(
        "() => document.getElementById('stack-select') ? +document.getElementById('stack-select').value : 0"
    )


def test_head_view_opens_on_the_last_layer_with_lines_drawn(minilm_page, open_page):
    result, path = minilm_page
    run = open_page(path)
    _ready(run)
    assert run.page.input_value("#layer-select") == str(result.num_layers() - 1)
    assert run.page.get_attribute("#head-readout", "data-query") == "0"  # the first token, [CLS]
    lines = run.page.eval_on_selector_all(
        "line.att", "nodes => nodes.map(n => [+n.dataset.head, +n.dataset.key, +n.dataset.weight])"
    )
    _check_lines(lines, result.layer(-1)[:, 0])  # [head, key] of the first token
    assert run.page.locator("#top-keys tr[data-head]").count() == result.num_heads()
    run.assert_clean()


def _point_at_cell(run, query, key):
    canvas = run.page.locator("#detail canvas.heatmap")
    data = canvas.evaluate("c => [+c.dataset.left, +c.dataset.top, +c.dataset.cell]")
    left, top, cell = data
    canvas.hover(position={"x": left + (key + 0.5) * cell, "y": top + (query + 0.5) * cell})
    return run.page.locator("#detail .readout").get_attribute("data-weight")


def test_model_view_in_browser_opens_a_head_and_reads_weights(minilm_page, open_page):
    result, path = minilm_page
    run = open_page(path)
    _ready(run)
    run.page.click("#tab-model")
    _ready(run)
    assert run.page.locator("#model-grid td.cell").count() == 6 * 12
    run.page.click('#model-grid td.cell[data-layer="4"][data-head="7"]')
    assert "layer 4" in run.page.text_content("#detail .heatmap-title")
    for query, key in ((0, 0), (3, 9), (12, 5)):
        shown = float(_point_at_cell(run, query, key))
        assert abs(shown - float(result.layer(4)[7, query, key])) <= TOLERANCE
    run.assert_clean()


def _causal_capture(n=9):
    torch.manual_seed(0)
    scores = torch.randn(2, 3, n, n).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    layers = list(torch.softmax(scores, dim=-1))  # per layer [head, query, key]
    return AttentionCapture(
        model="causal-test",
        tokens=[f"w{i}" for i in range(n)],
        causal=True,
        patterns={"self": layers},
        special=[False] * n,
        word_ids=list(range(n)),
    )


def test_causal_page_masks_the_future(tmp_path, open_page):
    result = _causal_capture()
    path = write_attention_view(tmp_path / "causal.html", result)
    run = open_page(path)
    _ready(run)
    assert run.page.get_attribute("#head-readout", "data-query") == "8"  # causal: opens on the last query
    weights = _head_view_weights(run, 1, 2, 4, result.layer(1)[2, 4])
    assert sorted(weights) == [0, 1, 2, 3, 4]  # query 4 sees keys 0..4 only
    for key, weight in weights.items():
        assert abs(weight - float(result.layer(1)[2, 4, key])) <= TOLERANCE
    run.page.click("#tab-model")
    run.page.click('#model-grid td.cell[data-layer="1"][data-head="2"]')
    assert _point_at_cell(run, 2, 6) == "masked"
    assert abs(float(_point_at_cell(run, 6, 2)) - float(result.layer(1)[2, 6, 2])) <= TOLERANCE
    assert "masked" in run.page.text_content("#detail .legend")
    run.assert_clean()


def test_encoder_decoder_page_has_every_stack(tmp_path, open_page):
    from attnviz.models.specs import load_model

    loaded = load_model("sample_data/toy/reverse", device="cpu")
    result = capture(loaded, "3 1 4 1 5", target="5 1 4 1 3")
    path = write_attention_view(tmp_path / "reverse.html", result)
    run = open_page(path)
    _ready(run)
    labels = run.page.eval_on_selector_all("#stack-select option", "nodes => nodes.map(n => n.textContent)")
    assert labels == ["encoder self-attention", "decoder self-attention", "cross-attention (decoder → encoder)"]
    assert run.page.input_value("#stack-select") == "2"  # opens on cross-attention
    assert run.page.input_value("#layer-select") == str(result.num_layers("cross") - 1)
    assert run.page.locator("line.att").count() > 0
    queries = run.page.eval_on_selector_all(".tok.q", "nodes => nodes.map(n => n.textContent)")
    keys = run.page.eval_on_selector_all(".tok.k", "nodes => nodes.map(n => n.textContent)")
    assert queries == ["<bos>", "5", "1", "4", "1", "3"] and keys == ["3", "1", "4", "1", "5", "<eos>"]
    weights = _head_view_weights(run, 1, 3, 2, result.layer(1, "cross")[3, 2])
    for key, weight in weights.items():
        assert abs(weight - float(result.layer(1, "cross")[3, 2, key])) <= TOLERANCE
    run.assert_clean()


def test_cli_writes_html_and_refuses_bad_output(tmp_path, capsys):
    out = tmp_path / "view.html"
    result = run_cli(capsys, "heatmap", "Hello there.", "--out", str(out), "--words")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == str(out)
    payload = _payload(out)
    assert payload["words"] is True and len(payload["stacks"][0]["layers"]) == 6
    assert_clean_error(run_cli(capsys, "heatmap", "Hello.", "--out", str(tmp_path / "x.htm5")), "unsupported output")


def test_strongest_keys_show_weights_below_a_hundredth(tmp_path, open_page):
    """A row spread over 400 keys (cross-attention over audio frames or patches looks like this): the strongest keys'
    weights keep two significant digits instead of reading 0.00."""
    n = 400
    row = torch.full((n,), (1 - 0.011) / (n - 2))  # ≈ 0.0025 each
    row[7], row[8] = 0.006, 0.005
    result = AttentionCapture(
        model="spread-test",
        tokens=[f"w{i}" for i in range(n)],
        causal=False,
        patterns={"self": [row.expand(1, n, n).clone()]},  # one layer: [head, query, key]
        special=[False] * n,
        word_ids=list(range(n)),
    )
    run = open_page(write_attention_view(tmp_path / "spread.html", result))
    _ready(run)
    assert "w7 0.0060, w8 0.0050, " in run.page.text_content("table")
    run.assert_clean()
