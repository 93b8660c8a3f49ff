"""``attnviz report``: the head atlas page, its numbers, and the page in a real browser."""

from __future__ import annotations

import json
import re

import pytest
from cli_helpers import assert_clean_error, run_cli

from attnviz.atlas.build import build_head_atlas, example_captures
from attnviz.stats import compute_statistics, detect_heads
from attnviz.stats.carriers import CARRIER_FIELDS
from attnviz.stats.definitions import STATISTIC_NAMES

TEXTS = ["The cat sat on the mat.", "Bees can dance.", "The capital of France is Paris.", "It rained all day."]
TOLERANCE = 1 / 255


def _payload(path):
    text = path.read_text(encoding="utf-8")
    return json.loads(
        re.search(r'<script type="application/json" id="attnviz-data">(.*?)</script>', text, re.DOTALL)[1]
    )


@pytest.fixture(scope="module")
def atlas(tmp_path_factory):
    root = tmp_path_factory.mktemp("atlas")
    prune = root / "prune.json"
    importance = [
        {"stack": "self", "layer": layer, "head": head, "score": layer + head / 100}
        for layer in range(6)
        for head in range(12)
    ]
    prune.write_text(
        json.dumps({"format": "attnviz-prune-report", "version": 1, "model": "minilm", "importance": importance})
    )
    extra = {"function": {("self", 0, 2): "previous-token"}}
    path = build_head_atlas(
        "minilm",
        root / "atlas.html",
        texts=TEXTS,
        prune_report=prune,
        extra_columns=extra,
        examples=2,
        device="cpu",
        progress=False,
    )
    return path


def test_atlas_numbers_match_stats(atlas, minilm):
    payload = _payload(atlas)
    names = [c["name"] for c in payload["columns"]]
    assert names == [*STATISTIC_NAMES, *CARRIER_FIELDS, "importance", "function"]
    stats = compute_statistics(minilm, TEXTS, progress=False)
    detection = detect_heads(stats)
    assert len(payload["heads"]) == 72
    for row in payload["heads"][::7]:
        for index, name in enumerate(STATISTIC_NAMES):
            expected = float(stats.matrix(name)[row["layer"], row["head"]])
            assert row["values"][index] == pytest.approx(expected, abs=1e-5), (row["layer"], row["head"], name)
        for index, name in enumerate(CARRIER_FIELDS, start=len(STATISTIC_NAMES)):  # what each token carries
            expected = float(stats.carriers.matrix(name)[row["layer"], row["head"]])
            assert row["values"][index] == pytest.approx(expected, rel=1e-4, abs=1e-6), (row["layer"], name)
        assert row["values"][-2] == pytest.approx(row["layer"] + row["head"] / 100)
        assert row["flags"] == list(detection.head_flags(row["layer"], row["head"]))
    assert payload["heads"][2]["values"][-1] == "previous-token" and payload["heads"][3]["values"][-1] is None
    assert payload["title"] == "all-MiniLM-L6-v2 (minilm)" and len(payload["examples"]) == 2


def test_atlas_in_browser_sorts_filters_and_shows_patterns(atlas, open_page, minilm):
    run = open_page(atlas, viewport=(1400, 1000))
    page = run.page
    assert page.locator("#heads-table tr[data-layer]").count() == 72
    # sort by max_weight, descending
    column = STATISTIC_NAMES.index("max_weight")
    page.click(f'#heads-table th[data-sort="{column}"]')
    values = page.eval_on_selector_all(
        f"#heads-table tr[data-layer] td:nth-child({column + 2})", "cells => cells.map(c => +c.dataset.value)"
    )
    assert values == sorted(values, reverse=True) and len(values) == 72
    # filter by layer
    page.fill("#filter", "L3")
    layers = page.eval_on_selector_all("#heads-table tr[data-layer]", "rows => rows.map(r => +r.dataset.layer)")
    assert set(layers) == {3} and len(layers) == 12
    page.fill("#filter", "")
    # the grid switches statistic
    page.select_option("#grid-stat", str(STATISTIC_NAMES.index("first_token")))
    assert "first_token by layer and head" in page.text_content("#grid-box h2")
    # click a head: its pattern on the first example, read back under the pointer
    page.click('#atlas-grid td.cell[data-layer="1"][data-head="4"]')
    assert page.text_content("#detail-title") == "layer 1, head 4"
    examples = example_captures(minilm, TEXTS, 2)
    canvas = page.locator('#head-detail [data-example="0"] canvas.heatmap')
    left, top, cell = canvas.evaluate("c => [+c.dataset.left, +c.dataset.top, +c.dataset.cell]")
    for query, key in ((0, 0), (2, 5), (len(examples[0].tokens) - 1, 1)):
        canvas.hover(position={"x": left + (key + 0.5) * cell, "y": top + (query + 0.5) * cell})
        shown = float(page.locator('#head-detail [data-example="0"] .readout').get_attribute("data-weight"))
        assert abs(shown - float(examples[0].layer(1)[4, query, key])) <= TOLERANCE
    run.assert_clean()


def test_toy_encoder_decoder_atlas_has_every_stack(tmp_path, open_page):
    path = build_head_atlas(
        "sample_data/toy/reverse", tmp_path / "toy.html", toy_examples=16, examples=2, device="cpu", progress=False
    )
    payload = _payload(path)
    assert [s["name"] for s in payload["stacks"]] == ["encoder", "decoder", "cross"]
    assert {row["stack"] for row in payload["heads"]} == {"encoder", "decoder", "cross"}
    run = open_page(path)
    run.page.select_option("#stack-select", "cross")
    run.page.click('#atlas-grid td.cell[data-layer="0"][data-head="1"]')
    assert run.page.locator("#head-detail canvas.heatmap").count() == 2
    run.assert_clean()


def test_report_cli(tmp_path, capsys):
    out = tmp_path / "r.html"
    result = run_cli(capsys, "report", "minilm", "--text", "Hello there.", "--out", str(out), "--examples", "1")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == str(out) and len(_payload(out)["examples"]) == 1
    assert_clean_error(run_cli(capsys, "report", "--out", str(tmp_path / "r.png")), "unsupported output file type")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert_clean_error(
        run_cli(capsys, "report", "--prune-report", str(bad), "--out", str(out)), "not an attnviz prune report"
    )
    assert_clean_error(
        run_cli(capsys, "report", "--prune-report", str(tmp_path / "none.json"), "--out", str(out)), "does not exist"
    )


def test_a_vision_model_is_refused_for_what_it_is_first(capsys, tmp_path):
    for extra in ((), ("--weighting", "norm")):  # the atlas's reason, not the norm weighting's or an image's
        result = run_cli(capsys, "report", "toy-odd-patch", *extra, "--out", tmp_path / "atlas.html")
        assert_clean_error(
            result,
            "toy-odd-patch is a vision model: the head atlas is drawn for text and token-toy models; measure its heads "
            "on images with attnviz stats toy-odd-patch (--images DIR)",
        )
        assert len(result.error_lines()) == 1 and "statistics ·" not in result.stderr  # refused before measuring
    assert list(tmp_path.iterdir()) == []
