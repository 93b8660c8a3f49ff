"""Pruned models keep their head numbers in figures, tables, JSON, CSV and pages; masked heads are marked."""

from __future__ import annotations

import json

import pytest
from tiny_models import TEXTS

import attnviz
from attnviz.captures.attention_capture import AttentionCapture, capture
from attnviz.core import AttentionSite
from attnviz.models.physical import prune_heads_physically
from attnviz.models.pruned_format import save_pruned_checkpoint
from attnviz.models.specs import load_model
from attnviz.render.html_view import attention_view_payload
from attnviz.stats import compute_statistics, detect_heads, stats_record
from attnviz.stats.export import csv_text
from attnviz.stats.tables import MASKED_FLAG, head_rows

S0, S1 = AttentionSite("self", 0), AttentionSite("self", 1)


@pytest.fixture(scope="module")
def pruned_llama(tiny_dirs, tiny_models, tmp_path_factory):
    """Tiny LLaMA (8 query heads, 2 key/value groups of 4): remove 1, 2 of layer 0 and 0, 1, 2, 3, 5 of layer 1."""
    loaded = tiny_models["llama"]
    removed = {S0: [1, 2], S1: [0, 1, 2, 3, 5]}
    pruned, plans = prune_heads_physically(loaded, removed)
    out = tmp_path_factory.mktemp("pruned") / "llama"
    save_pruned_checkpoint(
        out, source=str(tiny_dirs["llama"]), original=loaded, pruned=pruned, plans=plans, removed=removed
    )
    marker = json.loads((out / "attnviz-pruned.json").read_text())
    return load_model(str(out), device="cpu"), marker


def test_stats_tables_json_and_csv_use_original_numbers(pruned_llama):
    loaded, marker = pruned_llama
    stats = compute_statistics(loaded, TEXTS, progress=False)
    record = stats_record(stats, detect_heads(stats))
    for site in marker["sites"]:
        numbers = [h["head"] for h in record["heads"] if h["layer"] == site["layer"]]
        assert numbers == site["kept_heads"]
        masked = [
            h["head"] for h in record["heads"] if h["layer"] == site["layer"] and "masked-by-pruning" in h["flags"]
        ]
        assert masked == site["masked_heads"]
    assert any(site["masked_heads"] for site in marker["sites"])  # the fixture does exercise masking
    rows = head_rows(stats, detect_heads(stats))
    assert [(layer, head) for layer, head, _, _ in rows] == [
        (site["layer"], head) for site in marker["sites"] for head in site["kept_heads"]
    ]
    assert {head for layer, head, _, flags in rows if MASKED_FLAG in flags} == {
        h for site in marker["sites"] for h in site["masked_heads"]
    }
    lines = csv_text(record).splitlines()[1:]
    assert [int(line.split(",")[3]) for line in lines] == [h for s in marker["sites"] for h in s["kept_heads"]]


def test_figures_and_pages_use_original_numbers(pruned_llama, tmp_path):
    loaded, marker = pruned_llama
    result = capture(loaded, TEXTS[0])
    layer1 = marker["sites"][1]
    figure = attnviz.heatmap(result, layers=[1], heads=None)
    titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
    expected = [f"L1 H{h}" + (" (masked)" if h in layer1["masked_heads"] else "") for h in layer1["kept_heads"]]
    assert titles == expected
    stack = attention_view_payload(result)["stacks"][0]
    assert stack["layers"][1]["heads"] == layer1["kept_heads"]
    assert stack["layers"][1]["maskedHeads"] == layer1["masked_heads"]
    # the identity survives a capture file
    reloaded = AttentionCapture.load(result.save(tmp_path / "c.safetensors"))
    assert reloaded.identity.ids("self", 1, len(layer1["kept_heads"])) == layer1["kept_heads"]


def test_grid_and_figure_place_heads_at_their_original_numbers(pruned_llama):
    from attnviz.render.stats_plots import flag_matrices
    from attnviz.stats.tables import overview

    loaded, marker = pruned_llama
    stats = compute_statistics(loaded, TEXTS, progress=False)
    detection = detect_heads(stats)
    grid = stats.original_matrix("max_weight")  # [layer, original head]
    by_position = stats.matrix("max_weight")  # [layer, head in the weights]
    for row, site in enumerate(marker["sites"]):
        kept = site["kept_heads"]
        for position, original in enumerate(kept):
            assert grid[row, original] == by_position[row, position]
        removed = set(range(grid.shape[1])) - set(kept)
        assert all(grid[row, head].isnan() for head in removed)
    flags = flag_matrices(stats, detection)
    for row, site in enumerate(stats.layers()):
        for position, head_flags in enumerate(detection.flags[site]):
            for flag in head_flags:
                if flag in flags:
                    assert flags[flag][row, stats.original_ids(site)[position]]
    header = overview(stats, detection, "max_weight").plain.splitlines()[1].split()
    assert header == [str(head) for head in range(grid.shape[1])]  # columns are original head numbers


def test_heads_are_chosen_by_their_original_numbers(pruned_llama):
    from attnviz.common.errors import InputError

    loaded, marker = pruned_llama
    result = capture(loaded, TEXTS[0])
    kept = marker["sites"][1]["kept_heads"]
    last = kept[-1]  # an original number that is not a position in the pruned weights
    figure = attnviz.heatmap(result, layers=[1], heads=[kept[0], last])
    titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
    assert [title.split(" (")[0] for title in titles] == [f"L1 H{kept[0]}", f"L1 H{last}"]
    drawn = [ax.images[0].get_array() for ax in figure.axes if ax.get_title()]  # [query, key] each
    expected = result.layer(1)[kept.index(last)]  # that head's pattern, found by its original number
    assert float(abs(drawn[1].filled(0) - expected.numpy()).max()) < 1e-6
    removed = next(head for head in range(max(kept) + 1) if head not in kept)
    with pytest.raises(InputError, match=f"head {removed} was pruned"):
        attnviz.heatmap(result, layers=[1], heads=[removed])
