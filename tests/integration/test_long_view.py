"""Long inputs on the attention page: each row's strongest keys, the bound on what is dropped, a bounded size.

The reference is computed from the patterns themselves: ``torch.topk`` of each row, the largest weight
outside the kept keys and the first token, and the max over each pooled block.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
import transformers
from tiny_models import tiny_config

from attnviz.captures.attention_capture import AttentionCapture, capture
from attnviz.common.errors import InputError
from attnviz.common.progress import AttnvizWarning
from attnviz.render.html_rows import LayerReducer, decode_pooled, decode_rows
from attnviz.render.html_stream import stream_attention_view
from attnviz.render.html_view import LONG_PAGE_BYTES, attention_view_payload, view_html

TOLERANCE = 1 / 255  # of the row's maximum
PAGE_LIMIT = 25_000_000  # bytes of a page of 30 layers x 9 heads at any length


def _planted(heads=3, queries=300, keys=300, causal=True, seed=0):
    """Random rows with a sink on key 0 and a few sharp keys per row: ``[head, query, key]``."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(heads, queries, keys, generator=generator)
    scores[..., 0] += 3.0
    sharp = torch.randint(0, keys, (heads, queries, 3), generator=generator)
    scores.scatter_add_(2, sharp, torch.full(sharp.shape, 4.0))
    if causal:
        scores = scores.masked_fill(~torch.ones(queries, keys, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(scores, dim=-1)


def _check_rows(pattern, rows, top):
    """The decoded rows against ``pattern`` ``[head, query, key]``: exact top keys, weights, first token, bound."""
    peak = pattern.amax(dim=-1)  # [head, query]
    kept = pattern.gather(-1, rows["indices"])  # the captured weights at the kept positions
    assert torch.all((rows["weights"] - kept).abs() <= peak[..., None] * TOLERANCE)
    expected_top = torch.topk(pattern, top, dim=-1).values  # [head, query, top]
    assert torch.allclose(kept.sort(dim=-1, descending=True).values, expected_top, atol=1e-7)
    assert torch.all((rows["first"] - pattern[..., 0]).abs() <= peak * TOLERANCE)
    dropped = pattern.clone()
    dropped.scatter_(-1, rows["indices"], 0.0)
    dropped[..., 0] = 0.0
    assert torch.all(dropped.amax(dim=-1) <= rows["dropped"] + 1e-9)  # the bound holds for every dropped weight
    assert torch.all(rows["dropped"] - dropped.amax(dim=-1) <= peak / 255 * 1.01 + 1e-9)  # and is tight


@pytest.mark.parametrize(("causal", "block", "keys"), [(True, 7, 300), (False, 64, 257), (True, 300, 1000)])
def test_reducer_keeps_each_rows_top_keys_and_bounds_the_rest(causal, block, keys):
    pattern = _planted(keys=keys, queries=300 if keys != 1000 else 1000, causal=causal)
    heads, queries, _ = pattern.shape
    reducer = LayerReducer(heads, queries, keys, top=8, grid=64)
    for start in range(0, queries, block):
        rows = pattern[:, start : start + block]
        if causal:  # the core's key-prefix blocks: only the keys the block's last query can see
            rows = rows[..., : min(keys, start + rows.shape[1])]
        reducer.add(rows, start)
    encoded = reducer.payload()
    _check_rows(pattern, decode_rows(encoded, heads, queries), 8)
    pooled = decode_pooled(encoded, heads)  # [head, Gq, Gk]
    starts_q, starts_k = encoded["queryStarts"] + [queries], encoded["keyStarts"] + [keys]
    for r, c in ((0, 0), (5, 2), (len(starts_q) - 2, len(starts_k) - 2), (len(starts_q) - 2, 0)):
        block_max = pattern[:, starts_q[r] : starts_q[r + 1], starts_k[c] : starts_k[c + 1]].amax(dim=(1, 2))
        row_peak = pattern[:, starts_q[r] : starts_q[r + 1]].amax(dim=(1, 2))
        assert torch.all((pooled[:, r, c] - block_max).abs() <= row_peak / 510 + 1e-7)


def test_a_capture_past_the_limit_becomes_a_long_page(minilm):
    result = capture(minilm, "The cat sat on the mat because it was tired.")
    with pytest.warns(AttnvizWarning, match="choose fewer layers"):  # even 4 keys per row exceed 10 kB
        payload = attention_view_payload(result, full_cells=100, byte_budget=10_000)
    assert payload["long"] is True
    stack = payload["stacks"][0]
    layer = stack["layers"][3]
    assert layer["mode"] == "rows" and layer["top"] == 4  # the fewest kept however small the budget
    heads, n = result.num_heads(), len(result.tokens)
    _check_rows(result.layer(3), decode_rows(layer, heads, n), 4)
    short = attention_view_payload(result)
    assert short["long"] is False and "codes" in short["stacks"][0]["layers"][3]


def _long_tiny_model(path, layers=2, positions=4096):
    """A sharp tiny LLaMA with SmolLM2's 9 query heads (3 key/value heads) and ``positions`` positions."""
    from attnviz.models.specs import load_model, minilm_path

    model_class, config = tiny_config("llama", sharp=True, layers=layers)
    config.max_position_embeddings = positions
    config.num_attention_heads, config.num_key_value_heads, config.hidden_size, config.head_dim = 9, 3, 36, 4
    torch.manual_seed(0)
    model_class._from_config(config, attn_implementation="eager").save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(path)
    return load_model(str(path), device="cpu")


class _RowKeeper:
    """Keeps a few query rows of every layer as the model runs (the reference, without a full capture)."""

    def __init__(self, queries):
        self.queries, self.rows = queries, {}

    def observe(self, site, pattern, query_start):
        for q in self.queries:
            if query_start <= q < query_start + pattern.shape[2]:
                self.rows[site.layer, q] = pattern[0, :, q - query_start].clone()  # [head, key]


def _payload_of(path):
    text = path.read_text(encoding="utf-8")
    return json.loads(
        re.search(r'<script type="application/json" id="attnviz-data">(.*?)</script>', text, re.DOTALL)[1]
    )


def test_long_page_in_browser_reads_back_each_rows_top_keys(tmp_path, open_page):
    """4,096 tokens through a tiny model with SmolLM2's heads: the page keeps each row's top keys exactly
    (read back through the page's own JavaScript), bounds what it drops, and stays within its share of 25 MB."""
    layers = 2
    loaded = _long_tiny_model(tmp_path / "model", layers=layers)
    text = " ".join(f"word{i % 997} w{i % 13}" for i in range(3000))
    batch = loaded.encode([text], max_length=4096)
    n = len(batch.tokens[0])
    assert n == 4096
    budget = LONG_PAGE_BYTES * layers // 30  # this page's share of a 30-layer page
    queries = [0, 1, 1500, 4095]
    keeper = _RowKeeper(queries)  # the reference rows, from the same forward pass
    payload = stream_attention_view(loaded, batch, byte_budget=budget, observers=[keeper])
    path = tmp_path / "long.html"
    path.write_text(view_html(payload), encoding="utf-8")
    assert path.stat().st_size <= PAGE_LIMIT * layers / 30
    stored = _payload_of(path)
    assert stored["long"] is True and [entry["layer"] for entry in stored["stacks"][0]["layers"]] == [0, 1]

    run = open_page(path)
    run.page.wait_for_selector("body[data-ready=true]", timeout=20_000)
    for layer_position, layer in enumerate((0, 1)):
        top = stored["stacks"][0]["layers"][layer_position]["top"]
        for q in queries:
            reference = keeper.rows[layer, q]  # [head, key]
            for head in (0, 4, 8):
                row = run.page.evaluate(f"() => attnviz.row(0, {layer_position}, {head}, {q})")
                expected = reference[head]
                peak = float(expected.max())
                keys = torch.tensor(row["keys"])
                weights = torch.tensor(row["weights"])
                count = min(top, q + 1)  # a causal row sees q + 1 keys
                strongest = torch.topk(expected, count).values
                shown = torch.sort(weights, descending=True).values[:count]
                assert torch.all((shown - strongest).abs() <= TOLERANCE * peak), (layer, q, head)
                assert torch.all((weights - expected[keys]).abs() <= TOLERANCE * peak)
                assert abs(row["first"] - float(expected[0])) <= TOLERANCE * peak
                rest = expected.clone()
                rest[keys] = 0.0
                rest[0] = 0.0
                assert float(rest.max()) <= row["dropped"] + 1e-9  # what the page says it dropped bounds the rest
    # the head view lists the strongest keys of the chosen query; the notes say what the page keeps
    assert "strongest keys" in run.page.text_content("#page-notes")
    assert run.page.locator("line.att").count() > 0
    run.assert_clean()


def test_encoder_decoder_long_page_shape_is_checked():
    """A page builder refuses to finish while a chosen layer never arrived."""
    from attnviz.render.html_view import PageBuilder

    tokens = AttentionCapture(model="m", tokens=["a", "b"], causal=False, patterns={}, special=[False] * 2)
    builder = PageBuilder(tokens, {"self": [0, 1]}, {("self", 0): 2, ("self", 1): 2})
    builder.add_layer("self", 0, torch.full((2, 2, 2), 0.5))
    with pytest.raises(ValueError, match="never arrived"):
        builder.payload()


def test_streamed_page_equals_the_captured_one(minilm, monkeypatch):
    """Built while the model runs (no capture) or from a capture: the same page, cell for cell."""
    from attnviz.render import html_stream

    text = "The cat sat on the mat because it was tired."
    captured, _ = html_stream.attention_view_of_text(minilm, text)
    monkeypatch.setattr(html_stream, "CAPTURE_BYTES", 0)
    streamed, tokens = html_stream.attention_view_of_text(minilm, text)
    assert tokens.patterns == {}  # nothing was captured
    assert streamed == captured
    with pytest.raises(InputError, match="merging words needs a capture"):
        html_stream.attention_view_of_text(minilm, text, words=True)
