"""Display width: how many terminal columns a text takes, for every table attnviz lays out by hand.

``len`` counts code points; a terminal gives an East Asian wide character (``東``, ``苹``) or an emoji two
columns and a combining mark (the accent of ``é`` written as ``e`` + U+0301) none. Views that line up
columns of token labels measure, cut and pad with these helpers, never with ``len``/``ljust``/``rjust``.
"""

from __future__ import annotations

import unicodedata

__all__ = ["characters", "display_width", "fit", "pad_left", "pad_right", "wrap_spans"]

_ZERO_WIDTH_JOINER = "\u200d"
_EMOJI_PRESENTATION = "\ufe0f"


def _attaches(character: str) -> bool:
    """Whether ``character`` belongs to the character before it on screen (a mark, a joiner, a selector)."""
    code = ord(character)
    return (
        unicodedata.combining(character) != 0
        or unicodedata.category(character) in ("Mn", "Me")
        or character in (_ZERO_WIDTH_JOINER, _EMOJI_PRESENTATION, "\ufe0e")
        or 0x1F3FB <= code <= 0x1F3FF  # skin-tone modifiers
    )


def characters(text: str) -> list[str]:
    """``text`` as the characters a reader sees: a base with its combining marks, an emoji sequence joined
    by U+200D, each kept whole (``"e\\u0301t"`` -> ``["é", "t"]``)."""
    clusters: list[str] = []
    joined = False  # the cluster before ended with a zero-width joiner: the next character is part of it
    for character in text:
        if clusters and (joined or _attaches(character)):
            clusters[-1] += character
        else:
            clusters.append(character)
        joined = character == _ZERO_WIDTH_JOINER
    return clusters


def _cluster_width(cluster: str) -> int:
    base = cluster[0]
    if unicodedata.category(base) in ("Cc", "Cf") or _attaches(base):
        return 0  # a control character, or a mark with nothing before it
    if unicodedata.east_asian_width(base) in ("W", "F") or _EMOJI_PRESENTATION in cluster:
        return 2
    return 1


def display_width(text: str) -> int:
    """The number of terminal columns ``text`` takes (``"東京"`` -> 4, ``"é"`` as e + U+0301 -> 1)."""
    return sum(_cluster_width(cluster) for cluster in characters(text))


def fit(text: str, width: int, *, ellipsis: str = "…") -> str:
    """``text`` cut to at most ``width`` columns, ending with ``ellipsis`` when cut; whole characters only."""
    if display_width(text) <= width:
        return text
    room = width - display_width(ellipsis)
    kept, used = "", 0
    for cluster in characters(text):
        size = _cluster_width(cluster)
        if used + size > room:
            break
        kept, used = kept + cluster, used + size
    return kept + ellipsis if room >= 0 else ""


def pad_left(text: str, width: int) -> str:
    """``text`` right-aligned in ``width`` columns (``str.rjust`` by display width)."""
    return " " * max(0, width - display_width(text)) + text


def pad_right(text: str, width: int) -> str:
    """``text`` left-aligned in ``width`` columns (``str.ljust`` by display width)."""
    return text + " " * max(0, width - display_width(text))


#: characters of a formula: a space next to one of them is no place to break a line (``logit('c') − logit('x')``)
_OPERATORS = frozenset("−-+×÷/=≈<>≤≥→")


def _break_points(line: str) -> list[int]:
    """Offsets of the spaces of ``line`` where it may break: not inside a quoted token (``' bière'``), not
    beside an operator of a formula nor inside a parenthesised operand of one, not at the line's start."""
    import re

    quoted = [match.span() for match in re.finditer(r"(?<!\w)'[^']*'(?!\w)", line)]
    # a parenthesised operand of a formula stays whole with it: "16 × (2 × 8 random tokens)"
    quoted += [match.span(1) for match in re.finditer(r"[−+×÷/=≈<>≤≥→]\s*(\([^()]*\))", line)]
    points = []
    for offset, character in enumerate(line):
        if character != " " or offset == 0 or any(start < offset < end for start, end in quoted):
            continue
        before, after = line[:offset].rstrip(" ")[-1:], line[offset + 1 :].lstrip(" ")[:1]
        if before in _OPERATORS or after in _OPERATORS:
            continue
        points.append(offset)
    return points


def wrap_spans(line: str, width: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each line of ``line`` wrapped at ``width`` display columns, breaking only at
    :func:`_break_points` (a quoted token or a formula stays whole; one longer than ``width`` gets a line
    of its own). The spaces at a break belong to no line."""
    atoms: list[tuple[int, int]] = []  # the pieces between break points, without their spaces
    start = 0
    for point in [*_break_points(line), len(line)]:
        if line[start:point].strip(" "):
            atoms.append((start, len(line[:point].rstrip(" "))))
        start = point
        while start < len(line) and line[start] == " ":
            start += 1
    spans: list[tuple[int, int]] = []
    for atom_start, atom_end in atoms:
        if spans and display_width(line[spans[-1][0] : atom_end]) <= width:
            spans[-1] = (spans[-1][0], atom_end)
        else:
            spans.append((atom_start, atom_end))
    return spans or [(0, 0)]
