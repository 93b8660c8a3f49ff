"""Terminal views read without colour (a file, a pager) and laid out by display width (CJK, emoji, accents)."""

from __future__ import annotations

import io
import unicodedata

import torch
from rich.console import Console
from rich.table import Table

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.captures.query_rows import QueryRows
from attnviz.cli.console import StderrConsole
from attnviz.common.cells import characters, display_width, fit, pad_left, wrap_spans
from attnviz.render.strip_terminal import terminal_strip
from attnviz.render.terminal import SHADES, terminal_heatmap


def _capture(tokens: list[str], pattern: torch.Tensor, causal: bool = False) -> AttentionCapture:
    return AttentionCapture(
        model="tiny",
        tokens=tokens,
        causal=causal,
        patterns={"self": [pattern[None]]},  # [layer][head, query, key]
        special=[False] * len(tokens),
        word_ids=list(range(len(tokens))),
    )


def _plain(renderable, width: int) -> list[str]:
    """What ``> file`` receives: no colour system, at ``width`` columns."""
    console = Console(record=True, width=width, color_system=None, force_terminal=False, file=io.StringIO())
    console.print(renderable)
    return console.export_text().splitlines()


def test_display_width_counts_terminal_columns():
    assert display_width("東京") == 4 and display_width("e\u0301t") == 2 and display_width("😀a") == 3
    assert characters("e\u0301t👍🏽") == ["e\u0301", "t", "👍🏽"]
    assert fit("東京は日本", 5) == "東京…" and display_width(fit("東京は日本", 5)) == 3 + 0 + 2
    assert pad_left("東", 4) == "  東" and fit("abc", 3) == "abc"


def test_redirected_heatmap_carries_each_weight_as_a_shade():
    # planted weights: row 0 on key 0 (1.0); row 1 split 0.5/0.5; row 2 a quarter each on keys 0-3
    pattern = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 0.0, 1.0]])
    lines = _plain(terminal_heatmap(_capture(["a", "b", "c", "d"], pattern), layer=0, head=0, colour=False), 60)
    # linear scale, top 1.0: 1.0 -> █, 0.5 -> ▒ (level 2 of 4), 0.25 -> ░ (rounds to level 1), 0 -> blank
    assert lines[2:] == [
        "  a b c d ",
        "a ██      ",
        "b ▒▒▒▒    ",
        "c ░░░░░░░░",
        "d       ██",
        "  blank <0.12 ░ <0.38 ▒ <0.62 ▓ <0.88 █ ≤1 (linear scale)",
    ]


def test_redirected_heatmap_marks_masked_cells():
    pattern = torch.tensor([[1.0, 0.0], [0.3, 0.7]])
    lines = _plain(terminal_heatmap(_capture(["a", "b"], pattern, causal=True), layer=0, head=0, colour=False), 60)
    # top 1.0: 0.3 is level 1.2 (░), 0.7 level 2.8 (▓); the masked key of row a is a dot
    assert lines[3:5] == ["a ██ ·", "b ░░▓▓"]
    assert lines[-1] == "   · masked: the query cannot see this key"


def test_wide_characters_keep_columns_in_80_cells():
    tokens = list("東京は日本の首都です。我喜欢苹果。") + ["e\u0301té", "😀"]
    n = len(tokens)
    pattern = torch.eye(n)
    lines = _plain(terminal_heatmap(_capture(tokens, pattern), layer=0, head=0, width=80, colour=False), 80)
    assert max(display_width(line) for line in lines) <= 80
    # key labels downwards, one 2-column cell each (a wide character fills it; é keeps its accent)
    assert lines[2] == "    東京は日本の首都です。我喜欢苹果。e\u0301 😀"
    assert lines[3:5] == [" " * 38 + "t   ", " " * 38 + "é   "]
    body = [line for line in lines if "██" in line]
    label = 4  # the widest label, "e\u0301té", is 3 columns, and a space
    assert [line[:3] for line in body[:2]] == [" 東 ", " 京 "]
    for index, line in enumerate(body):  # the diagonal: row i's block at column label + 2 i
        before = line[: line.index("██")]
        assert display_width(before) == label + 2 * index, (index, line)
    accent = next(line for line in body if "e\u0301" in line)
    assert unicodedata.normalize("NFC", accent.split()[0]) == "été"


def test_redirected_strip_carries_each_weight():
    rows = QueryRows(
        model="tiny",
        stack="self",
        key_tokens=["東", "京", "é", "end"],
        query=3,
        query_tokens=["東", "京", "é", "end"],
        layers=[0],
        heads=[[0]],
        rows=[torch.tensor([[0.0, 0.25, 0.25, 0.5]])],
        visible=None,
    )
    lines = _plain(terminal_strip(rows, width=60, colour=False), 60)
    strip = next(line for line in lines if line.startswith("L0 H0 "))
    cells = strip[len("L0 H0 ") :]  # 3 columns a key: 0 -> blank, 0.25 of top 0.5 -> ▒, 0.5 -> █
    assert cells == "   " + SHADES[2] * 6 + SHADES[4] * 3
    assert lines[lines.index(strip) + 1] == "      top: 3:end 0.50  2:é 0.25  1:京 0.25  0:東 0.00"
    assert "  blank <0.062 ░ <0.19 ▒ <0.31 ▓ <0.44 █ ≤0.5 (linear scale)" in lines


FOOTER = (
    "logit difference: clean 16.966, corrupt -16.756 · denoising output patching at every position; "
    "logit(' Mary') − logit(' John') at position 15 ('␣to')"
)


def test_wrapping_keeps_quoted_tokens_and_formulas_whole():
    for width in (20, 30, 45, 60, 80):
        lines = [FOOTER[start:end] for start, end in wrap_spans(FOOTER, width)]
        assert " ".join(lines) == FOOTER
        assert any("logit(' Mary') − logit(' John')" in line for line in lines)  # the formula on one line
        assert all(display_width(line) <= width for line in lines if "logit(" not in line)
    assert [FOOTER[a:b] for a, b in wrap_spans(FOOTER, 80)] == [
        "logit difference: clean 16.966, corrupt -16.756 · denoising output patching at",
        "every position; logit(' Mary') − logit(' John') at position 15 ('␣to')",
    ]


def test_wrapping_keeps_a_product_whole():
    title = "toy-induction · self attention · probes: 16 × (2 × 8 random tokens) · corpus: 351 examples"
    for width in (30, 40, 50, 60):
        lines = [title[start:end] for start, end in wrap_spans(title, width)]
        assert any("16 × (2 × 8 random tokens)" in line for line in lines), (width, lines)
    assert [title[a:b] for a, b in wrap_spans(title, 60)] == [
        "toy-induction · self attention · probes:",
        "16 × (2 × 8 random tokens) · corpus: 351 examples",
    ]


def test_table_captions_wrap_at_the_terminal_and_stay_one_line_in_a_log():
    table = Table(title="the heads that make ' Mary' over ' John'", caption=FOOTER)
    table.add_column("head")
    table.add_row("L1 H1")
    terminal = StderrConsole(file=io.StringIO(), force_terminal=True, width=60, color_system=None)
    terminal.print(table)
    lines = terminal.file.getvalue().splitlines()
    assert lines[0] == "the heads that make ' Mary' over ' John'"  # not folded at the table's 9 columns
    assert lines[-3:] == [
        "logit difference: clean 16.966, corrupt -16.756 · denoising",
        "output patching at every position;",
        "logit(' Mary') − logit(' John') at position 15 ('␣to')",
    ]
    log = StderrConsole(file=io.StringIO(), force_terminal=False, width=80)
    log.print(table)
    lines = log.file.getvalue().splitlines()
    assert lines[-1] == FOOTER and lines[0] == "the heads that make ' Mary' over ' John'"
    assert all(line == line.rstrip() for line in lines)  # no padding in a log


def test_the_missing_font_notice_names_every_missing_character():
    import warnings

    from matplotlib.figure import Figure

    from attnviz.common.progress import AttnvizNotice
    from attnviz.render.fonts import fit_fonts

    private = "".join(chr(0xE000 + index) for index in range(20))  # private-use code points: no font draws them
    figure = Figure()
    figure.text(0.1, 0.5, private[:12])
    figure.text(0.1, 0.2, private[12:] + "abc")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_fonts(figure)
    notices = [str(w.message) for w in caught if issubclass(w.category, AttnvizNotice)]
    assert notices == [
        (
            f"no installed font has glyphs for 20 characters ({private}): the figure shows them as empty boxes "
            "(install a font for this script, e.g. fonts-noto-cjk, for Chinese, Japanese and Korean)"
        )
    ]


def test_help_examples_wider_than_the_terminal_continue_with_a_backslash(capsys, monkeypatch):
    from cli_helpers import run_cli

    monkeypatch.setenv("COLUMNS", "80")
    text = run_cli(capsys, "patch", "--help").stdout
    examples = text[text.index("Examples:") : text.index("╭")].splitlines()
    commands = [line.rstrip() for line in examples if line.strip()][1:]
    assert commands == [
        "   attnviz patch smollm2 --clean \\",
        '       "When Mary and John went to the store, John gave a drink to" --corrupt \\',
        '       "When Mary and John went to the store, Mary gave a drink to" --answer \\',
        '       " Mary" --wrong " John" --out patch.png',
        "   attnviz patch smollm2 --clean ... --corrupt ... --answer ... --wrong ... \\",
        "       --ablate mean --data notes.txt --json patch.json --out patch.html",
    ]
    stats = run_cli(capsys, "stats", "--help").stdout
    stats_lines = [line.rstrip() for line in stats.splitlines()]
    assert "   torchrun --standalone --nproc-per-node 4 -m attnviz stats smollm2 --data \\" in stats_lines
