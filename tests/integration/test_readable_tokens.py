"""Token labels are the text of each token, in every output; a diff of two inputs labels each side with its own.

Byte-level BPE tokenizers (GPT-2, SmolLM2) store bytes as stand-in characters (``Ã©`` for "é"); the reference for
a token's label is the tokenizer's own decoding of that token alone (``convert_tokens_to_string``), with ``␣`` for
a leading space. A character split over tokens decodes only when they are joined: it reads whole in the token where
it begins, and the tokens holding the rest of its bytes are marked ``◌``; joined into words, the text reads as typed.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from cli_helpers import run_cli
from figure_helpers import read_svg

from attnviz.captures.attention_capture import AttentionCapture, capture
from attnviz.common.tokens import PARTIAL_MARK, SPACE_MARK, display_token, readable_tokens
from attnviz.models.specs import load_model

TEXT = "Elle est fatiguée. 猫は眠い。"
#: the stand-in characters of GPT-2's byte table that would show up if bytes were printed as they are stored
GARBLE = re.compile("[ÃãģĢĤ]")


@pytest.fixture(scope="module")
def byte_level_dir(tmp_path_factory, tiny_dirs):
    """A tiny GPT-2 with a GPT-2-style byte-level BPE tokenizer trained here (Japanese characters stay split)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]
    )
    bpe.train_from_iterator(["The cat sat on the mat. Elle est fatiguée."] * 20, trainer)
    folder = tmp_path_factory.mktemp("byte-level") / "tiny-gpt2-bpe"
    shutil.copytree(tiny_dirs["gpt2"], folder)
    for old in folder.glob("*"):
        if old.name.startswith(("tokenizer", "vocab", "special_tokens")):
            old.unlink()
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>").save_pretrained(folder)
    return folder


def expected_labels(tokenizer, text: str) -> list[str]:
    """Each token decoded alone by the tokenizer; a token that does not decode alone (a split character) is None."""
    labels = []
    for token in tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"]):
        decoded = tokenizer.convert_tokens_to_string([token])
        labels.append(None if "\ufffd" in decoded else SPACE_MARK + decoded[1:] if decoded[:1] == " " else decoded)
    return labels


def check_labels(labels: list[str], expected: list[str | None], text: str) -> None:
    assert len(labels) == len(expected)
    for label, reference in zip(labels, expected, strict=True):
        assert not GARBLE.search(label), labels
        if reference is not None:
            assert label == reference, (labels, expected)
    # joined (marks of spaces and of split characters removed), the labels are the text
    joined = "".join(label.removeprefix(PARTIAL_MARK) for label in labels).replace(SPACE_MARK, " ")
    assert joined == text
    assert None not in expected or PARTIAL_MARK in "".join(labels)  # a split character is marked


def test_readable_tokens_decodes_bytes_and_marks_split_characters():
    raw = ["El", "le", "Ġfatigu", "Ã©e", "Ġ", "ç", "Į", "«", "ãģ", "¯", "Ċ", "<|endoftext|>"]
    assert [display_token(t) for t in readable_tokens(raw)] == [
        "El", "le", "␣fatigu", "ée", "␣", "猫", "◌", "◌", "は", "◌", "\\n", "<|endoftext|>",
    ]  # fmt: skip


def test_labels_of_a_byte_level_tokenizer_in_capture_page_and_figure(capsys, byte_level_dir, tmp_path):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(byte_level_dir))
    expected = expected_labels(tokenizer, TEXT)
    assert None in expected  # the Japanese characters are split over tokens by this small vocabulary
    model = str(byte_level_dir)

    saved = tmp_path / "c.safetensors"
    assert run_cli(capsys, "capture", TEXT, "--model", model, "--out", saved).exit_code == 0
    from safetensors import safe_open

    with safe_open(str(saved), "pt") as handle:
        stored = json.loads(handle.metadata()["tokens"])
    check_labels([display_token(token) for token in stored], expected, TEXT)
    check_labels(AttentionCapture.load(saved).axis_labels()[1], expected, TEXT)

    page = tmp_path / "h.html"
    assert run_cli(capsys, "heatmap", TEXT, "--model", model, "--out", page).exit_code == 0
    payload = re.search(r'id="attnviz-data">(.*?)</script>', page.read_text(encoding="utf-8"), re.DOTALL)[1]
    stack = json.loads(payload)["stacks"][0]
    check_labels(stack["keys"], expected, TEXT)
    check_labels(stack["queries"], expected, TEXT)

    figure = tmp_path / "h.svg"
    assert (
        run_cli(capsys, "heatmap", TEXT, "--model", model, "--layer", "0", "--head", "0", "--out", figure).exit_code
        == 0
    )
    texts = read_svg(figure).texts
    ticks = [text for text in texts if text in set(stack["keys"])]
    assert ticks[: len(expected)] == stack["keys"]  # the x tick labels, in order

    words = tmp_path / "w.svg"
    run = run_cli(capsys, "heatmap", TEXT, "--model", model, "--layer", "0", "--head", "0", "--words", "--out", words)
    assert run.exit_code == 0
    word_labels = capture(load_model(model), TEXT).axis_labels(words=True)[1]
    assert "".join(word_labels) == TEXT.replace(" ", "") and "fatiguée" in word_labels
    assert all(label in read_svg(words).texts for label in word_labels)


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2", device="cpu")


def test_smollm2_labels_are_the_decoded_text(smollm2, capsys, tmp_path):
    expected = expected_labels(smollm2.tokenizer, TEXT)
    result = capture(smollm2, TEXT)
    check_labels(result.axis_labels()[1], expected, TEXT)
    assert "ée" in result.axis_labels()[1]
    assert "fatiguée." in "".join(result.axis_labels(words=True)[1])
    figure = tmp_path / "s.svg"
    assert (
        run_cli(capsys, "heatmap", TEXT, "--model", "smollm2", "-l", "0", "--head", "0", "--out", figure).exit_code == 0
    )
    texts = read_svg(figure).texts
    assert all(label in texts for label in result.axis_labels()[1])
    assert not any(GARBLE.search(text) for text in texts)


def test_diff_of_two_inputs_labels_each_side_with_its_own_tokens(capsys, browser, tmp_path):
    from browser import PageRun

    text_a, text_b = "The keys to the cabinet are", "The keys to the cabinet is"
    page, figure, record = tmp_path / "pair.html", tmp_path / "pair.svg", tmp_path / "pair.json"
    for out in (page, figure):
        args = ["diff", "smollm2", "--text", text_a, "--against", text_b, "--out", out, "--layer", "5", "--head", "8"]
        result = run_cli(capsys, *args, *(["--json", record] if out == page else []))
        assert result.exit_code == 0, result.stderr
    grid = json.loads(record.read_text())
    assert grid["grid_a"][-1] == "␣are" and grid["grid_b"][-1] == "␣is" and grid["grid_a"][:-1] == grid["grid_b"][:-1]

    texts = read_svg(figure).texts
    assert texts.count("␣are") == 2 and texts.count("␣is") == 2  # A's panel (x and y ticks), B's panel
    assert texts.count("␣are/␣is") == 2  # the difference names both

    run = PageRun(browser, page)
    try:
        heads = run.page.eval_on_selector_all(
            "table.diff-panel",
            "ts => ts.map(t => [...t.querySelector('tr').querySelectorAll('th')].map(c => c.textContent))",
        )
        rows = run.page.eval_on_selector_all(
            "table.diff-panel",
            "ts => ts.map(t => [...t.querySelectorAll('tr')].slice(1).map(r => r.querySelector('th').textContent))",
        )
        run.assert_clean()
    finally:
        run.close()
    assert [panel[1:] for panel in heads] == [grid["grid_a"], grid["grid_b"], [*grid["grid_a"][:-1], "␣are/␣is"]]
    assert rows == [panel[1:] for panel in heads]


def test_an_id_past_the_tokenizers_vocabulary_gets_a_label(byte_level_dir):
    """A model whose embedding table is padded past its tokenizer's vocabulary can write such an id: it is labelled
    by its number (``<id 301>``), not a crash."""
    from transformers import AutoTokenizer

    from attnviz.common.tokens import token_strings

    tokenizer = AutoTokenizer.from_pretrained(byte_level_dir)
    beyond = len(tokenizer) + 1
    ids = [*tokenizer("The cat", add_special_tokens=False)["input_ids"], beyond]
    assert token_strings(tokenizer, ids) == ["The", "Ġcat", f"<id {beyond}>"]


def test_control_characters_are_shown_escaped():
    """A byte no font draws (a random model can write ``\\x1a``) is labelled as its escape, in figures and pages."""
    assert display_token("a\x1ab") == "a\\x1ab"
    assert display_token("\x00") == "\\x00"
    assert display_token("Ġcat\x7f") == SPACE_MARK + "cat\\x7f"
