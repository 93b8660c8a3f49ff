"""Alignment error rate: the formula by hand, Pharaoh parsing, word mapping, and the shipped toy reverse model."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli
from figure_helpers import read_svg

from attnviz.common.errors import InputError, UnsupportedModelError
from attnviz.heads.alignment import (
    AlignmentPair,
    GoldAlignment,
    align_heads,
    alignment_error_rate,
    parse_alignment,
    predicted_links,
    read_alignment_pairs,
    whitespace_word_ids,
)

REVERSE = Path(__file__).resolve().parents[2] / "sample_data" / "toy" / "reverse"


def _reverse_pairs(count: int, seed: int) -> list[dict]:
    """Random digit sequences and their reversal; gold: source word n−1−j ↔ target word j (anti-diagonal)."""
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        n = rng.randint(3, 7)
        items = [str(rng.randint(0, 9)) for _ in range(n)]
        links = " ".join(f"{n - 1 - j}-{j}" for j in range(n))
        records.append({"source": " ".join(items), "target": " ".join(reversed(items)), "alignment": links})
    return records


@pytest.fixture(scope="module")
def reverse_model():
    from attnviz.models.specs import load_model

    return load_model(str(REVERSE), device="cpu")


def test_aer_by_hand():
    gold = parse_alignment("0-0 1-1 2?1 2-2")  # S = {00, 11, 22}, P = S ∪ {21}
    assert gold.sure == {(0, 0), (1, 1), (2, 2)}
    assert gold.possible == {(0, 0), (1, 1), (2, 1), (2, 2)}
    # A = {00, 21, 12}: |A∩S| = 1, |A∩P| = 2, |A| = 3, |S| = 3 -> 1 − 3/6
    assert alignment_error_rate({(0, 0), (2, 1), (1, 2)}, gold) == pytest.approx(0.5)
    assert alignment_error_rate({(0, 0), (1, 1), (2, 2)}, gold) == 0.0
    assert alignment_error_rate(set(), gold) == 1.0
    # only a possible link predicted: 1 − (0 + 1) / (1 + 3)
    assert alignment_error_rate({(2, 1)}, gold) == pytest.approx(0.75)


def test_pharaoh_notations_for_possible_links():
    for text in ("0-0 1?2", "0-0 1-2?", "0-0 1p2", "0s0 1-2-P", "0-0-S 1P2"):
        gold = parse_alignment(text)
        assert gold.sure == {(0, 0)} and gold.possible == {(0, 0), (1, 2)}, text
    with pytest.raises(InputError, match="Pharaoh"):
        parse_alignment("0-0 1:2")


def test_links_from_word_weights():
    weights = torch.tensor([[0.1, 0.7, 0.2], [0.45, 0.1, 0.45], [0.0, 0.0, 1.0]])  # [target word, source word]
    assert predicted_links(weights, None) == {(1, 0), (0, 1), (2, 2)}  # (source, target); a tie takes the first
    assert predicted_links(weights, 0.4) == {(1, 0), (0, 1), (2, 1), (2, 2)}


def test_tokens_map_to_whitespace_words(minilm):
    batch = minilm.encode(["The cat sat on the mat."])
    tokens, word_ids = batch.tokens[0], batch.word_ids[0]  # [CLS] the cat sat on the mat . [SEP]
    assert whitespace_word_ids(tokens, word_ids, "The cat sat on the mat.", "x") == [None, 0, 1, 2, 3, 4, 5, 5, None]
    batch = minilm.encode(["Tokenization is unbelievable."])
    mapped = whitespace_word_ids(batch.tokens[0], batch.word_ids[0], "Tokenization is unbelievable.", "x")
    assert mapped[0] is None and mapped[-1] is None
    assert [mapped[1], mapped[-2]] == [0, 2] and max(w for w in mapped if w is not None) == 2


def test_reading_the_data_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"source": "a b", "target": "b a", "alignment": "0-1 1-0"}\n\n')
    [pair] = read_alignment_pairs(path)
    assert pair.gold.sure == {(0, 1), (1, 0)}
    path.write_text('{"source": "a b", "target": "b a", "alignment": "0-2"}\n')
    with pytest.raises(InputError, match=r"pairs.jsonl:1: link 0-2 is out of range"):
        read_alignment_pairs(path)
    path.write_text('{"source": "a b", "target": "b a"}\n')
    with pytest.raises(InputError, match="alignment"):
        read_alignment_pairs(path)


def test_reverse_toy_known_cross_head_aligns_and_layer_zero_and_random_heads_do_not(reverse_model):
    records = _reverse_pairs(60, seed=0)
    pairs = [AlignmentPair(r["source"], r["target"], parse_alignment(r["alignment"])) for r in records]
    result = align_heads(reverse_model, pairs)
    assert result.head(1, 2).aer <= 0.1  # the known cross head (cross.1 head 2)
    assert result.head(1, None).aer <= 0.1
    assert all(result.head(0, h).aer > 0.5 for h in range(4))  # layer 0 does not align yet
    assert result.heads[0].layer == 1  # best first
    assert [h.aer for h in result.heads] == sorted(h.aer for h in result.heads)
    # a head with random attention: AER near 1 − 1/(mean length), far above the known head
    generator = torch.Generator().manual_seed(0)
    from attnviz.heads.alignment import LinkCounts

    counts = LinkCounts()
    for pair in pairs:
        n = len(pair.source.split())
        counts.add(predicted_links(torch.rand(n, n, generator=generator), None), pair.gold)
    assert counts.aer > 0.6
    grid = result.aer_grid()
    assert grid.shape == (2, 5) and grid[1, 2] == result.head(1, 2).aer


def test_align_refuses_models_without_cross_attention(minilm):
    pairs = [AlignmentPair("a b", "b a", GoldAlignment(frozenset({(0, 1)}), frozenset({(0, 1)})))]
    with pytest.raises(UnsupportedModelError, match="encoder-decoder"):
        align_heads(minilm, pairs)


def test_align_on_a_tiny_hugging_face_encoder_decoder(tiny_model_dirs):
    from attnviz.models.hf import load_hf_model

    bart = load_hf_model(str(tiny_model_dirs["bart"]), name="bart")
    pairs = [AlignmentPair("The cat sat.", "Le chat assis.", parse_alignment("0-0 1-1 2-2"))]
    result = align_heads(bart, pairs, rows="reading")
    assert len(result.heads) == 2 * (4 + 1)
    assert all(0.0 <= h.aer <= 1.0 for h in result.heads)


def test_cli_align_table_json_plot_and_stdin(tmp_path, capsys, monkeypatch):
    import io

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _reverse_pairs(20, seed=1)))
    out_json, out_plot = tmp_path / "align.json", tmp_path / "align.svg"
    result = run_cli(capsys, "align", REVERSE, "--data", data, "--json", out_json, "--plot", out_plot)
    assert result.exit_code == 0, result.stderr
    record = json.loads(out_json.read_text())
    assert record["format"] == "attnviz-align" and record["pairs"] == 20
    known = next(h for h in record["heads"] if h["layer"] == 1 and h["head"] == 2)
    assert known["aer"] <= 0.1
    # the plot: one cell per (layer, head) and the layer mean, annotated with the JSON's error rates
    figure = read_svg(out_plot)
    aer = {(h["layer"], h["head"]): h["aer"] for h in record["heads"]}
    expected = [aer[layer, head] for layer in (0, 1) for head in (0, 1, 2, 3, None)]
    assert figure.annotations() == pytest.approx(expected, abs=0.005)
    assert "cross-attention AER" in " ".join(figure.texts)
    assert "AER" in result.stderr
    monkeypatch.setattr("sys.stdin", io.StringIO(data.read_text()))
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    result = run_cli(capsys, "align", REVERSE, "--data", "-", "--limit", "2")
    assert result.exit_code == 0, result.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"source": "1 2", "target": "2 1", "alignment": "0-x"}\n')
    assert_clean_error(run_cli(capsys, "align", REVERSE, "--data", bad), "bad.jsonl:1", "Pharaoh")
    same = tmp_path / "same.json"  # JSON Lines under a .json name: the reader does not mind the suffix
    same.write_text(data.read_text())
    assert_clean_error(run_cli(capsys, "align", REVERSE, "--data", same, "--json", same), "would overwrite")
    assert_clean_error(run_cli(capsys, "align", REVERSE, "--data", tmp_path / "none.jsonl"), "does not exist")
