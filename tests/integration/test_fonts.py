"""Labels in scripts the default font lacks: an installed font that has them, else one notice and no warnings.

Both paths run on any machine: the font lookup (``attnviz.render.fonts.fallback_font``) is replaced where the
test needs one outcome; the test with a real CJK font runs where one is installed (``fonts-noto-cjk``).
"""

from __future__ import annotations

import io
import warnings

import pytest
from cli_helpers import run_cli

from attnviz.common.progress import Reporter, use_reporter
from attnviz.render import fonts
from attnviz.render.figures import subplots

JAPANESE = "猫は眠い"


class Notices(Reporter):
    def __init__(self) -> None:
        self.notices: list[str] = []

    def notice(self, message: str) -> None:
        self.notices.append(message)


def _figure():
    figure, ax = subplots(figsize=(3, 3))
    ax.set_xticks(range(4))
    ax.set_xticklabels(list(JAPANESE))
    title = ax.set_title(f"The cat: {JAPANESE}")
    return figure, title


def _draw(figure) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # drawn twice (a notebook, then a file): still one notice
            figure.savefig(io.BytesIO(), format="png")
    return list(caught)


def test_without_a_font_for_the_script_one_notice_and_no_warning(monkeypatch):
    monkeypatch.setattr(fonts, "fallback_font", lambda characters: None)
    figure, _ = _figure()
    with use_reporter(Notices()) as reporter:
        caught = _draw(figure)
    assert [str(w.message) for w in caught] == []
    assert len(reporter.notices) == 1 and all(ch in reporter.notices[0] for ch in JAPANESE)
    assert "fonts-noto-cjk" in reporter.notices[0]


def test_the_found_font_is_given_to_the_texts_that_need_it_only(monkeypatch):
    chosen = fonts._font_path(_figure()[1].get_fontproperties())  # stands in for a found font on any machine
    asked: list[str] = []
    monkeypatch.setattr(fonts, "fallback_font", lambda characters: asked.append(characters) or chosen)
    figure, title = _figure()
    ax = figure.axes[0]
    _draw(figure)
    assert set(asked[0]) == set(JAPANESE)  # one lookup for every character the figure lacks
    assert title.get_fontproperties().get_file() == chosen
    assert all(label.get_fontproperties().get_file() == chosen for label in ax.get_xticklabels())
    assert ax.xaxis.label.get_fontproperties().get_file() is None  # an ASCII label keeps the default font


def test_an_installed_cjk_font_draws_the_glyphs_without_warnings():
    found = fonts.fallback_font(JAPANESE)
    if found is None:
        pytest.skip("no installed font has Japanese glyphs (install fonts-noto-cjk)")
    from matplotlib.ft2font import FT2Font

    assert {ord(ch) for ch in JAPANESE} <= set(FT2Font(found).get_charmap())
    figure, title = _figure()
    with use_reporter(Notices()) as reporter:
        caught = _draw(figure)
    assert caught == [] and reporter.notices == []
    assert title.get_fontproperties().get_file() == found


def test_cli_prints_no_python_warning_for_missing_glyphs(capsys, monkeypatch, tiny_dirs, tmp_path):
    monkeypatch.setattr(fonts, "fallback_font", lambda characters: None)
    out = tmp_path / "j.png"
    result = run_cli(
        capsys, "heatmap", "猫は眠いです。", "--model", tiny_dirs["bert"], "-l", "0", "--head", "0", "--out", out
    )
    assert result.exit_code == 0, result.stderr
    assert "Warning" not in result.stderr and "Glyph" not in result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: no installed font")]
    assert len(notes) == 1, result.stderr


def test_picture_overlays_fit_their_fonts_too(monkeypatch):
    """The grid of picture overlays (image heads, captions, written words) is made like every other figure: a word
    its font cannot draw gives one notice and no warnings, and the figure shows inline as PNG."""
    from attnviz.common.images import ImageGrid
    from attnviz.render.image_overlay import overlay_grid

    monkeypatch.setattr(fonts, "fallback_font", lambda characters: None)
    figure, axes = overlay_grid(1, 2, ImageGrid(2, 2, (), (8, 8)), panel=1.5, extra_room=0.4, label_room=0.3,
                                title_room=0.4)  # fmt: skip
    axes[0][1].set_title(JAPANESE)
    with use_reporter(Notices()) as reporter:
        caught = _draw(figure)
    assert [str(w.message) for w in caught] == []
    assert len(reporter.notices) == 1
    assert figure._repr_png_().startswith(b"\x89PNG")
