"""Fonts for text the default font cannot draw (Japanese, Chinese, Korean, Thai, … in token labels and titles).

matplotlib draws every label in one font (DejaVu Sans by default), which has no CJK glyphs: it would draw empty boxes
and emit a ``UserWarning: Glyph … missing from font(s)`` per character. Before a figure is drawn,
:func:`fit_fonts` gives each text whose characters its font lacks an installed font that has them (found
through matplotlib's font manager, or among the system's font files), on that text only: no rcParams change. When no installed font has
them, the text is drawn as it is and the reporter gets one notice saying which font to install; matplotlib's own
warnings about those glyphs are not shown.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from attnviz.common.progress import notice

#: fonts known to cover many scripts, tried first (then every other installed font)
PREFERRED_FONTS = (
    "Noto Sans CJK JP",
    "Noto Sans CJK SC",
    "Noto Sans CJK KR",
    "Noto Sans JP",
    "Source Han Sans",
    "IPAexGothic",
    "IPAGothic",
    "TakaoGothic",
    "WenQuanYi Zen Hei",
    "Droid Sans Fallback",
    "Arial Unicode MS",
    "Noto Sans",
)
#: matplotlib's warning for a character its font has no glyph for
_MISSING_GLYPH = r"Glyph .* missing from (current )?font"


@functools.cache
def _characters_of(path: str) -> frozenset[int]:
    """Code points the font file at ``path`` has glyphs for (its first face)."""
    from matplotlib.ft2font import FT2Font

    try:
        return frozenset(FT2Font(path).get_charmap())
    except (OSError, RuntimeError, ValueError):
        return frozenset()


def _font_path(properties: Any) -> str:
    from matplotlib import font_manager

    return font_manager.findfont(properties, fallback_to_default=True)


@functools.cache
def _system_font_files() -> tuple[str, ...]:
    """Font files installed on the system (matplotlib's cached list may predate a font installed since)."""
    from matplotlib import font_manager

    return tuple(sorted(font_manager.findSystemFonts()))


def fallback_font(characters: str) -> str | None:
    """The file of an installed font with a glyph for every character of ``characters``, or None.

    Fonts named in :data:`PREFERRED_FONTS` first, then the others matplotlib knows, then the system's font files.
    matplotlib's "Last Resort" font draws every character as a box, so it never counts.
    """
    from matplotlib import font_manager

    needed = {ord(character) for character in characters}
    known = [entry for entry in font_manager.fontManager.ttflist if "last resort" not in entry.name.lower()]
    known.sort(key=lambda e: PREFERRED_FONTS.index(e.name) if e.name in PREFERRED_FONTS else len(PREFERRED_FONTS))
    candidates = dict.fromkeys([entry.fname for entry in known] + list(_system_font_files()))
    return next((path for path in candidates if needed <= _characters_of(path)), None)


def missing_characters(text: Any) -> str:
    """The characters of a matplotlib text artist that its font has no glyph for (in order, once each)."""
    content = text.get_text()
    if not content or content.isascii():
        return ""
    covered = _characters_of(_font_path(text.get_fontproperties()))
    return "".join(dict.fromkeys(ch for ch in content if not ch.isspace() and ord(ch) not in covered))


def _named(characters: str, most: int = 60) -> str:
    """Every character of ``characters`` (up to ``most``, then how many more), and how many there are."""
    count = len(characters)
    shown = characters if count <= most else f"{characters[:most]} and {count - most} more"
    return f"{count} character{'s' if count != 1 else ''} ({shown})"


def fit_fonts(figure: Any) -> None:
    """Give each text of ``figure`` that its font cannot draw a fallback font that can (see the module docstring)."""
    from matplotlib.text import Text

    lacking: dict[Any, str] = {}
    for text in figure.findobj(Text):
        missing = missing_characters(text)
        if missing:
            lacking[text] = missing
    if not lacking:
        return
    everything = "".join(dict.fromkeys("".join(lacking.values())))
    family = fallback_font(everything)
    if family is None:
        if getattr(figure, "_attnviz_font_notice", False):
            return
        figure._attnviz_font_notice = True  # one notice per figure, however often it is drawn
        notice(
            f"no installed font has glyphs for {_named(everything)}: the figure shows them as empty boxes "
            "(install a font for this script, e.g. fonts-noto-cjk, for Chinese, Japanese and Korean)"
        )
        return
    for text in lacking:  # this text only, in the same size, weight and style: no rcParams change
        properties = text.get_fontproperties().copy()
        properties.set_file(family)
        text.set_fontproperties(properties)


@contextmanager
def quiet_missing_glyphs() -> Iterator[None]:
    """matplotlib's warnings about missing glyphs are left out (:func:`fit_fonts` says it once, through the
    reporter)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_MISSING_GLYPH, category=UserWarning)
        yield
