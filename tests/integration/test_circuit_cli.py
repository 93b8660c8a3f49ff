"""``attnviz circuit`` from the command line: the JSON contract, pairs, the page and the figure, bad input."""

from __future__ import annotations

import json

import pytest
from cli_helpers import assert_clean_error, run_cli

CLEAN = "when mary and john went to the store, john gave a drink to"
CORRUPT = "when mary and john went to the store, mary gave a drink to"
PAIR = ["--clean", CLEAN, "--corrupt", CORRUPT, "--answer", " mary", "--wrong", " john"]
TOP_KEYS = {"method", "clean_logit_diff", "corrupt_logit_diff", "nodes", "edges", "faithfulness_curve", "circuit"}


def test_json_follows_the_schema_and_pairs_average(capsys, tmp_path, tiny_dirs):
    json_path, figure = tmp_path / "circuit.json", tmp_path / "circuit.svg"
    result = run_cli(
        capsys, "circuit", tiny_dirs["gpt2"], *PAIR, "--edges", "all", "--json", json_path, "--out", figure
    )
    assert result.exit_code == 0, result.stderr
    record = json.loads(json_path.read_text())
    assert set(record) == TOP_KEYS and record["method"] == "eap"
    assert [(n["kind"], n["layer"], n["head"]) for n in record["nodes"]][:6] == [
        ("embed", None, None),
        *[("head", 0, h) for h in range(4)],
        ("mlp", 0, None),
    ]
    senders = 1 + 2 * 5  # embeddings, then per layer 4 heads and an MLP
    receivers = 2 * (3 * 4 + 1) + 1  # per layer q, k, v of 4 heads and an MLP, then the logits
    edges = record["edges"]
    assert len(edges) == sum(1 for s in range(senders) for r in range(receivers) if _edge(s, r))
    assert [abs(e["score"]) for e in edges] == sorted((abs(e["score"]) for e in edges), reverse=True)
    assert {e["receiver"]["input"] for e in edges} == {"q", "k", "v", None}
    curve = record["faithfulness_curve"]
    assert curve[0][0] == 0 and curve[-1] == [len(edges), pytest.approx(1.0, abs=1e-5)]
    assert record["circuit"]["faithfulness"] >= 0.8
    assert figure.read_text().startswith("<?xml")

    # the same pair twice in a file: the same scores (an average over identical pairs)
    pairs = tmp_path / "pairs.jsonl"
    line = json.dumps({"clean": CLEAN, "corrupt": CORRUPT, "answer": " mary", "wrong": " john"})
    pairs.write_text(line + "\n" + line + "\n")
    again = tmp_path / "pairs.json"
    result = run_cli(capsys, "circuit", tiny_dirs["gpt2"], "--pairs", pairs, "--edges", "5", "--json", again)
    assert result.exit_code == 0, result.stderr
    averaged = json.loads(again.read_text())
    assert [e["score"] for e in averaged["edges"]] == pytest.approx([e["score"] for e in edges[:5]], abs=1e-6)


def _edge(sender: int, receiver: int) -> bool:
    """GPT-2 tiny graph: sender stage (embed −1, layer l heads 2l, MLP 2l+1) before the receiver's read."""
    stage = -1 if sender == 0 else 2 * ((sender - 1) // 5) + (1 if (sender - 1) % 5 == 4 else 0)
    if receiver == 26:
        return True
    layer, slot = divmod(receiver, 13)
    return stage < 2 * layer + (1 if slot == 12 else 0)


def test_html_page_slider_and_head_links(capsys, tmp_path, tiny_dirs, open_page):
    page_path = tmp_path / "circuit.html"
    result = run_cli(capsys, "circuit", tiny_dirs["llama"], *PAIR, "--out", page_path)
    assert result.exit_code == 0, result.stderr
    run = open_page(page_path)
    run.assert_clean()
    slider = run.page.locator("#circuit-slider")
    slider.fill("7")
    assert run.page.locator("#circuit-graph line").count() == 7
    assert run.page.locator("#circuit-kept").inner_text().startswith("7 edges kept")
    link = run.page.locator("#circuit-graph a.patch-head").nth(9)  # layer 1, head 1
    layer, head = link.get_attribute("data-layer"), link.get_attribute("data-head")
    link.click()
    assert run.page.locator("#layer-select option:checked").inner_text() == f"layer {layer}"
    assert run.page.locator(".head-toggle.on").all_inner_texts() == [f"H{head}"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--answer", " marigold"], "--answer must be one token"),
        (["--corrupt", CORRUPT + " now"], "the clean prompt has 16 tokens and the corrupt prompt 17"),
        (["--method", "acdc"], "method"),
        (["--metric", "loss"], "metric"),
        (["--target", "1.5"], "--target is a faithfulness between 0 and 1"),
        (["--edges", "many"], "--edges must be a number of edges or all"),
        (["--pairs", "missing.jsonl"], "give --pairs or --clean"),
        (["--out", "circuit.txt"], "unsupported output file type"),
    ],
)
def test_bad_input_is_one_error_line(capsys, tmp_path, monkeypatch, tiny_dirs, args, fragment):
    monkeypatch.chdir(tmp_path)
    values = dict(zip(PAIR[::2], PAIR[1::2]))
    values.update(dict(zip(args[::2], args[1::2])))
    result = run_cli(capsys, "circuit", tiny_dirs["llama"], *[part for pair in values.items() for part in pair])
    assert_clean_error(result, fragment)
    assert len(result.error_lines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_bad_pairs_files_and_unsupported_models(capsys, tmp_path, tiny_dirs, tiny_model_dirs):
    broken = tmp_path / "pairs.jsonl"
    broken.write_text('{"clean": "a", "corrupt": "b", "answer": " c"}\n')
    result = run_cli(capsys, "circuit", tiny_dirs["llama"], "--pairs", broken)
    assert_clean_error(result, "line 1: the pair has no text for wrong")
    broken.write_text("not json\n")
    assert_clean_error(run_cli(capsys, "circuit", tiny_dirs["llama"], "--pairs", broken), "line 1: not JSON")
    assert_clean_error(run_cli(capsys, "circuit", tiny_dirs["bert"], *PAIR), "has no language-model head")
    assert_clean_error(run_cli(capsys, "circuit", tiny_model_dirs["bart"], *PAIR), "encoder-decoder")
    assert_clean_error(run_cli(capsys, "circuit", tiny_dirs["llama"], "--clean", CLEAN), "give --corrupt")


def test_the_result_displays_inline_in_a_notebook(tiny_models):
    from attnviz.circuit import find_circuit

    result = find_circuit(tiny_models["llama"], clean=CLEAN, corrupt=CORRUPT, answer=" mary", wrong=" john")
    shown = result._repr_html_()
    assert shown.startswith("<iframe") and 'sandbox="allow-scripts"' in shown
    assert "circuit-slider" in shown and "circuit-data" in shown and "data:image/png;base64," in shown


@pytest.mark.slow  # three launches of the command line in subprocesses, two of them under torchrun
def test_torchrun_pairs_equal_one_process(tmp_path, tiny_dirs):
    """Two processes share the pairs (two token lengths) and their sums: the same scores and curve as one process."""
    pairs = tmp_path / "pairs.jsonl"
    lines = [
        (CLEAN, CORRUPT),
        (CLEAN.replace("store", "park"), CORRUPT.replace("store", "park")),
        ("when mary and john went home, john gave a book to", "when mary and john went home, mary gave a book to"),
    ]
    pairs.write_text(
        "".join(json.dumps({"clean": c, "corrupt": k, "answer": " mary", "wrong": " john"}) + "\n" for c, k in lines)
    )
    records = {}
    for processes in (1, 2):
        out = tmp_path / f"circuit-{processes}.json"
        args = ["circuit", str(tiny_dirs["gpt2"]), "--pairs", str(pairs), "--edges", "all", "--json", str(out)]
        result = run_cli(None, *args, subprocess=True, processes=processes, cwd=tmp_path)
        assert result.exit_code == 0, result.stderr[-3000:]
        records[processes] = json.loads(out.read_text())
    one, two = records[1], records[2]
    assert one["clean_logit_diff"] == pytest.approx(two["clean_logit_diff"], rel=1e-5)
    assert [n["attribution"] for n in one["nodes"]] == pytest.approx(
        [n["attribution"] for n in two["nodes"]], rel=1e-4, abs=1e-6
    )
    scores = {json.dumps([e["sender"], e["receiver"]]): e["score"] for e in two["edges"]}
    assert [e["score"] for e in one["edges"]] == pytest.approx(
        [scores[json.dumps([e["sender"], e["receiver"]])] for e in one["edges"]], rel=1e-4, abs=1e-6
    )
    assert [value for _, value in one["faithfulness_curve"]] == pytest.approx(
        [value for _, value in two["faithfulness_curve"]], abs=1e-4
    )
