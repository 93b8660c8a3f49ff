"""``attnviz diff`` and ``compare_models`` / ``compare_inputs``: divergences against independent references.

References: the JS divergence and total variation recomputed in float64 from ``attnviz capture`` files
(the naive entropy form, per query, pooled over every query of every text); ``attnviz stats`` for the
statistics; a pruned copy whose untouched layers must agree; the difference of two captures.
"""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli
from figure_helpers import read_svg
from tiny_models import TEXTS

from attnviz.captures.attention_capture import AttentionCapture, capture
from attnviz.compare import compare_inputs, compare_models, query_divergences
from attnviz.core import AttentionSite
from attnviz.models.base import PrunedCopy
from attnviz.models.specs import load_model
from attnviz.stats.compute import compute_statistics
from attnviz.stats.definitions import STATISTIC_NAMES
from attnviz.toy import checkpoint_series

#: heads removed from MiniLM: layer 2 is the first layer that loses a head
REMOVED = {AttentionSite("self", 2): [1, 5], AttentionSite("self", 4): [0, 3, 7]}
SHORT_TEXTS = TEXTS[:3]


def reference_divergence(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row JS (nats) and TV in float64, the textbook way: H(m) − ½ H(p) − ½ H(q)."""
    p, q = p.double(), q.double()
    m = (p + q) / 2

    def entropy(x):
        return -(torch.special.xlogy(x, x)).sum(-1)

    return entropy(m) - entropy(p) / 2 - entropy(q) / 2, (p - q).abs().sum(-1) / 2


@pytest.fixture(scope="module")
def pruned_minilm_dir(tmp_path_factory, minilm):
    """MiniLM without the heads of :data:`REMOVED`, written as ``attnviz prune`` writes it."""
    out = tmp_path_factory.mktemp("pruned") / "pruned-minilm"
    pruned, plans = minilm.remove_heads(REMOVED)
    minilm.save_pruned(out, PrunedCopy(pruned, REMOVED, plans), source="minilm", transformers_copy=False)
    return out


# -- the divergence itself -------------------------------------------------------------------------------------


def test_query_divergences_match_float64_reference():
    generator = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 7, 9, generator=generator) * 3, -1)
    q = torch.softmax(torch.randn(4, 7, 9, generator=generator) * 3, -1)
    p[0, 0] = torch.tensor([1.0] + [0.0] * 8)  # disjoint supports: ln 2
    q[0, 0] = torch.tensor([0.0] * 8 + [1.0])
    q[1, 1, 4:] = 0  # zeros in one row only
    q[1, 1] /= q[1, 1].sum()
    js, tv = query_divergences(p, q)
    expected_js, expected_tv = reference_divergence(p, q)
    assert torch.allclose(js.double(), expected_js, atol=1e-6)
    assert torch.allclose(tv.double(), expected_tv, atol=1e-6)
    assert js[0, 0].item() == pytest.approx(math.log(2), abs=1e-6)
    same_js, same_tv = query_divergences(p, p.clone())
    assert same_js.abs().max().item() == 0.0 and same_tv.abs().max().item() == 0.0
    # a tiny perturbation: JS ≈ TV²-order, far below float32 rounding of the entropies, still positive
    close = torch.softmax(torch.log(p[2]) + 1e-3 * torch.randn(7, 9, generator=generator), -1)
    tiny_js, _ = query_divergences(p[2], close)
    assert torch.allclose(tiny_js.double(), reference_divergence(p[2], close)[0], rtol=1e-2, atol=1e-10)


# -- two models ------------------------------------------------------------------------------------------------


def test_model_against_itself_is_zero_and_statistics_equal_stats(tiny_model_dirs):
    a = load_model(str(tiny_model_dirs["gpt2"]), device="cpu")
    b = load_model(str(tiny_model_dirs["gpt2"]), device="cpu")
    result = compare_models(a, b, TEXTS, progress=False, batch_size=4)
    assert {h.status for h in result.heads} == {"matched"}
    assert all(h.js_divergence == 0.0 and h.total_variation == 0.0 for h in result.heads)
    stats = compute_statistics(a, TEXTS, progress=False, batch_size=4)
    for site, numbers in stats.sites.items():
        for position in range(numbers.num_heads):
            entry = result.head(site.stack, site.layer, position)
            for index, name in enumerate(STATISTIC_NAMES):
                assert entry.a[name] == pytest.approx(float(numbers.mean[index, position]), abs=1e-6)
                assert entry.delta[name] == 0.0
    assert result.stats_a.num_tokens == stats.num_tokens


def test_encoder_decoder_stacks_compare(tiny_model_dirs):
    a = load_model(str(tiny_model_dirs["bart"]), device="cpu")
    b = load_model(str(tiny_model_dirs["bart"]), device="cpu", dtype="bfloat16")
    result = compare_models(a, b, SHORT_TEXTS, progress=False)
    assert set(result.stacks) == set(a.stacks())
    encoder = [h.js_divergence for h in result.heads if h.site.stack in ("encoder", "cross")]
    assert len(encoder) == 16 and all(0 < v < 1e-3 for v in encoder)
    # without targets the decoder reads its start token alone: one key, nothing to diverge
    assert all(h.js_divergence == 0.0 for h in result.heads if h.site.stack == "decoder")


def test_pruned_minilm_matches_by_identity(minilm, pruned_minilm_dir):
    pruned = load_model(str(pruned_minilm_dir), device="cpu")
    result = compare_models(minilm, pruned, TEXTS, progress=False)
    expected = sorted(("self", site.layer, head) for site, heads in REMOVED.items() for head in heads)
    assert sorted(result.only("only_a")) == expected
    assert result.only("only_b") == []
    by_layer = {row["layer"]: row for row in result.layer_means()}
    for entry in result.heads:
        if entry.status != "matched":
            assert entry.js_divergence is None and entry.delta is None
        elif entry.site.layer <= 2:  # inputs unchanged up to and including the first layer that lost a head
            assert entry.js_divergence <= 1e-6
    for layer in (3, 4, 5):
        assert by_layer[layer]["js_divergence"] > 1e-4
    assert by_layer[2]["only_a"] == 2 and by_layer[2]["matched"] == 10


def test_divergence_equals_reference_from_capture_files(capsys, minilm, pruned_minilm_dir, tmp_path):
    """JS and TV of MiniLM against its pruned copy equal a float64 recomputation from `attnviz capture` files."""
    texts = SHORT_TEXTS
    pruned = load_model(str(pruned_minilm_dir), device="cpu")
    result = compare_models(minilm, pruned, texts, progress=False, batch_size=2)
    sums: dict[tuple[int, int], list[float]] = {}
    queries = 0
    for number, text in enumerate(texts):
        files = []
        for spec in ("minilm", str(pruned_minilm_dir)):
            path = tmp_path / f"{number}-{len(files)}.safetensors"
            outcome = run_cli(capsys, "capture", text, "--model", spec, "--out", str(path))
            assert outcome.exit_code == 0, outcome.stderr
            files.append(AttentionCapture.load(path))
        first, second = files
        queries += len(first.tokens)
        for layer in range(first.num_layers()):
            ids = second.identity.ids("self", layer, second.num_heads("self", layer))
            for position, head in enumerate(ids):
                js, tv = reference_divergence(first.layer(layer)[head], second.layer(layer)[position])
                total = sums.setdefault((layer, head), [0.0, 0.0])
                total[0] += float(js.sum())
                total[1] += float(tv.sum())
    assert len(sums) == sum(1 for h in result.heads if h.status == "matched")
    for (layer, head), (js_sum, tv_sum) in sums.items():
        entry = result.head("self", layer, head)
        assert entry.js_divergence == pytest.approx(js_sum / queries, abs=1e-5)
        assert entry.total_variation == pytest.approx(tv_sum / queries, abs=1e-5)


def test_float32_against_bfloat16_is_small_and_not_zero(minilm):
    half = load_model("minilm", device="cpu", dtype="bfloat16")
    result = compare_models(minilm, half, SHORT_TEXTS, progress=False)
    values = torch.tensor([h.js_divergence for h in result.heads])
    assert (values > 0).all() and (values < 1e-2).all()


def test_different_layouts_are_refused_unless_by_statistics(tiny_model_dirs, minilm):
    tiny = load_model(str(tiny_model_dirs["bert"]), device="cpu")
    with pytest.raises(Exception, match="different attention layouts .* --by-statistics"):
        compare_models(minilm, tiny, SHORT_TEXTS, progress=False)
    result = compare_models(minilm, tiny, SHORT_TEXTS, progress=False, by_statistics=True)
    assert result.mode == "statistics"
    assert all(h.js_divergence is None for h in result.heads)
    matched = [h for h in result.heads if h.status == "matched"]
    assert len(matched) == 2 * 4  # the tiny model's 2 layers × 4 heads, by position
    assert len(result.only("only_a")) == 6 * 12 - 8
    expected = compute_statistics(tiny, SHORT_TEXTS, progress=False).sites[AttentionSite("self", 1)].mean
    assert result.head("self", 1, 3).b["entropy"] == pytest.approx(float(expected[0, 3]), abs=1e-9)


def test_different_tokenizers_compare_only_where_tokens_agree(tiny_model_dirs, tmp_path):
    """A cased copy of the same model splits capitalised words differently: those texts are left out."""
    cased = tmp_path / "cased"
    shutil.copytree(tiny_model_dirs["bert"], cased)
    tokenizer = json.loads((cased / "tokenizer.json").read_text())
    tokenizer["normalizer"]["lowercase"] = False
    (cased / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((cased / "tokenizer_config.json").read_text())
    config["do_lower_case"] = False
    (cased / "tokenizer_config.json").write_text(json.dumps(config))
    a = load_model(str(tiny_model_dirs["bert"]), device="cpu")
    b = load_model(str(cased), device="cpu")
    texts = ["the cat sat on the mat.", "The Dog Ran Home.", "a bird sang in the tree."]
    with pytest.warns(UserWarning, match="1 of 3 texts were left out"):
        result = compare_models(a, b, texts, progress=False)
    assert result.texts_compared == 2 and result.texts_skipped == 1
    assert all(h.js_divergence == 0.0 for h in result.heads)
    with pytest.raises(Exception, match="split none of the 1 text into the same tokens"):
        compare_models(a, b, ["The Dog Ran Home."], progress=False)


def test_toy_checkpoints_over_training(capsys, tmp_path):
    out = tmp_path / "toy-copy"
    trained = run_cli(
        capsys,
        "train", "copy", "--out", str(out), "--steps", "6", "--checkpoint-every", "3", "--width", "16", "--heads", "2",
        "--layers", "2", "--lengths", "2:4", "--batch-size", "8", "--eval-examples", "20",
    )  # fmt: skip
    assert trained.exit_code == 0, trained.stderr
    specs = [str(checkpoint_series(out)[0][1]), str(out)]  # step 3, step 6
    report, figure = tmp_path / "evolution.json", tmp_path / "evolution.png"
    args = ["diff", *specs, "--toy-examples", "16", "--json", report]
    two = run_cli(capsys, *args)
    assert two.exit_code == 0, two.stderr
    record = json.loads(report.read_text())
    assert record["kind"] == "models" and all(h["js_divergence"] > 0 for h in record["heads"])
    three = run_cli(
        capsys, "diff", specs[0], specs[0], specs[1], "--toy-examples", "16", "--json", report, "--out", figure
    )
    assert three.exit_code == 0, three.stderr
    record = json.loads(report.read_text())
    assert record["kind"] == "checkpoints" and len(record["consecutive"]) == 2 and len(record["from_first"]) == 2
    assert all(h["js_divergence"] == 0.0 for h in record["consecutive"][0]["heads"])  # a checkpoint against itself
    assert record["from_first"][1]["heads"] == record["consecutive"][1]["heads"]  # same pair, other route
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- two inputs ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2", device="cpu")


def test_against_equals_difference_of_two_captures(smollm2):
    text_a, text_b = "The keys to the cabinet are", "The keys to the cabinet is"
    result = compare_inputs(smollm2, text_a, text_b)
    assert result.alignment == "tokens"
    first, second = capture(smollm2, text_a), capture(smollm2, text_b)
    for layer in (0, 5, smollm2.num_layers() - 1):
        expected = second.layer(layer) - first.layer(layer)  # [h, q, k]
        assert torch.allclose(result.difference("self", layer), expected, atol=1e-6)
        js, _ = result.query_divergence("self", layer)
        reference, _ = reference_divergence(first.layer(layer), second.layer(layer))
        assert torch.allclose(js.double(), reference, atol=1e-5)
    assert result.difference("self", 5)[:, :-1].abs().max() < 1e-5  # a causal model: only the last row changes


def test_against_with_different_lengths_aligns_words(minilm):
    result = compare_inputs(minilm, "The cat sat on the mat", "The big cat sat on the mat")
    assert result.alignment == "words"
    assert result.labels_a == result.labels_b == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    rows = result.patterns_b[AttentionSite("self", 0)].sum(-1)  # renormalised over the shared words
    assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5)
    apart = compare_inputs(minilm, "alpha beta", "gamma delta epsilon")
    assert apart.alignment in ("words", "statistics")


# -- the command's files ---------------------------------------------------------------------------------------


def test_cli_json_csv_svg_and_html(capsys, browser, minilm, pruned_minilm_dir, tmp_path):
    from browser import PageRun

    report, table, figure, page = (tmp_path / name for name in ("d.json", "d.csv", "d.svg", "d.html"))
    base = ["diff", "minilm", str(pruned_minilm_dir), "--text", TEXTS[0], "--text", TEXTS[1]]
    result = run_cli(capsys, *base, "--json", report, "--csv", table, "--out", figure)
    assert result.exit_code == 0, result.stderr
    assert "only in A: L2 H1, L2 H5, L4 H0" in result.stderr.replace("\n", " ")
    record = json.loads(report.read_text())
    assert record["format"] == "attnviz-diff" and record["model_a"] == "minilm"
    assert record["num_tokens_a"] == record["num_tokens_b"] > 0
    head = record["heads"][0]
    assert set(head) == {"stack", "layer", "head", "status", "js_divergence", "total_variation", "a", "b", "delta"}
    assert set(head["delta"]) == set(STATISTIC_NAMES)
    assert {row["layer"] for row in record["layers"]} == set(range(6))
    rows = table.read_text().splitlines()
    assert len(rows) == 1 + 72 and rows[0].startswith("model_a,model_b,stack,layer,head,status,js_divergence")
    # the SVG's cell labels are the JSON's divergences in 10⁻³ nats, row by row (then total variation)
    svg = read_svg(figure)
    matched = [h for h in record["heads"] if h["status"] == "matched"]
    written = svg.annotations()
    assert written[: len(matched)] == pytest.approx([round(h["js_divergence"] * 1000, 2) for h in matched], abs=0.006)
    assert svg.texts.count("A") == 2 * 5  # the removed heads, in both panels
    # the page: grid cells carry the JSON's values; sorting by a column orders the table
    result = run_cli(capsys, *base, "--out", page)
    assert result.exit_code == 0, result.stderr
    run = PageRun(browser, page)
    try:
        values = run.page.eval_on_selector_all("#diff-grid td[data-value]", "cells => cells.map(c => +c.dataset.value)")
        assert values == pytest.approx([h["js_divergence"] for h in matched], abs=1e-9)
        assert run.page.eval_on_selector_all("#diff-grid td[data-status=only_a]", "c => c.length") == 5
        first = run.page.eval_on_selector("#heads-table tr:nth-child(2)", "r => r.dataset.head")
        largest = max(matched, key=lambda h: h["js_divergence"])
        assert first == f"self.{largest['layer']}.{largest['head']}"
        run.assert_clean()
    finally:
        run.close()


def test_cli_against_page_shows_a_b_and_difference(capsys, browser, smollm2, tmp_path):
    from browser import PageRun

    page = tmp_path / "pair.html"
    text_a, text_b = "The keys to the cabinet are", "The keys to the cabinet is"
    result = run_cli(capsys, "diff", "smollm2", "--text", text_a, "--against", text_b, "--out", page)
    assert result.exit_code == 0, result.stderr
    run = PageRun(browser, page)
    try:
        run.page.select_option("#layer-select", "5")
        run.page.select_option("#head-select", "8")
        panels = run.page.eval_on_selector_all(
            "table.diff-panel", "ts => ts.map(t => [...t.querySelectorAll('td')].map(c => +c.dataset.value))"
        )
        run.assert_clean()
    finally:
        run.close()
    first, second = capture(smollm2, text_a).layer(5)[8], capture(smollm2, text_b).layer(5)[8]
    n = first.shape[0]
    assert torch.tensor(panels[0]).view(n, n) == pytest.approx(first, abs=2e-6)
    assert torch.tensor(panels[2]).view(n, n) == pytest.approx(second - first, abs=3e-6)


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["minilm"], ["give two model specs"]),
        (["minilm", "smollm2", "--against", "x", "--text", "y"], ["give one model spec"]),
        (["minilm", "--against", "x"], ["exactly one --text"]),
        (["minilm", "minilm", "--out", "grid.txt"], [".txt"]),
        (["minilm", "minilm", "--json", "-", "--csv", "-"], ["only one of --json and --csv"]),
    ],
)
def test_bad_input_is_one_error_line(capsys, args, fragments):
    result = run_cli(capsys, "diff", *args)
    assert_clean_error(result, *fragments)


def test_outputs_never_overwrite_inputs(capsys, tmp_path):
    data = tmp_path / "texts.txt"
    data.write_text("The cat sat.\nA dog ran.\n")
    before = data.read_bytes()
    result = run_cli(capsys, "diff", "minilm", "minilm", "--data", data, "--json", data)
    assert result.exit_code != 0 and result.error_lines()
    assert data.read_bytes() == before


def test_pruned_toy_heads_keep_their_identity(tmp_path):
    """A pruned toy model records its removals in its metadata: the remaining heads keep their numbers."""
    from attnviz.models.identity import model_identity

    toy = load_model("toy-induction", device="cpu")
    removed = {AttentionSite("self", 0): [1, 2]}
    pruned, _ = toy.remove_heads(removed)
    again, _ = pruned.remove_heads({AttentionSite("self", 0): [1]})  # position 1 is now original head 3
    assert model_identity(again).ids("self", 0, 1) == [0]
    result = compare_models(toy, pruned, progress=False, toy_examples=16)
    assert sorted(result.only("only_a")) == [("self", 0, 1), ("self", 0, 2)]
    layer0 = [h for h in result.heads if h.site.layer == 0 and h.status == "matched"]
    assert [h.head for h in layer0] == [0, 3] and all(h.js_divergence <= 1e-6 for h in layer0)
    assert all(h.js_divergence > 1e-4 for h in result.heads if h.site.layer == 1)


def test_ranked_divergences_print_distinct_and_in_order(capsys, tiny_dirs, tmp_path):
    """float32 against bfloat16: every JS is below 10⁻⁴ nats, yet the ranked rows read as different numbers."""
    model = str(tiny_dirs["bert"])
    record = tmp_path / "d.json"
    texts = [word for text in SHORT_TEXTS for word in ("--text", text)]
    result = run_cli(capsys, "diff", model, model, "--dtype-b", "bfloat16", *texts, "--json", record, "--limit", "8")
    assert result.exit_code == 0, result.stderr
    assert "JS (10⁻³ nats)" in result.stderr
    rows = [re.match(r"\s+(\d+)\s+(\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s", line) for line in result.stderr.splitlines()]
    printed = [(int(m[1]), int(m[2]), m[3]) for m in rows if m]
    heads = {(h["layer"], h["head"]): h["js_divergence"] for h in json.loads(record.read_text())["heads"]}
    ranked = sorted(heads.values(), reverse=True)[:8]
    assert len(printed) == 8 and max(ranked) < 1e-4 and len(set(ranked)) == 8
    values = [float(text) for _, _, text in printed]
    assert len({text for _, _, text in printed}) == 8  # distinct where the divergences are
    assert values == sorted(values, reverse=True)
    for (layer, head, text), value in zip(printed, values, strict=True):
        decimals = len(text.split(".")[1])
        assert value == pytest.approx(heads[layer, head] * 1000, abs=10**-decimals, rel=1e-3)
