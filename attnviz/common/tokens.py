"""Tokens as people read them: display labels, and merging sub-word pieces into words.

Merging a ``[..., query, key]`` pattern into words follows what attention means:
attention *to* a word is the sum of the attention to its pieces (columns are
added), attention *from* a word is the mean over its pieces (rows are
averaged). Rows therefore still sum to 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

# Markers that tokenizers put on pieces: byte-level BPE (GPT-2, LLaMA-3, SmolLM2) marks a leading
# space with "Ġ" and a newline with "Ċ"; SentencePiece (T5, LLaMA-2) marks a leading space with "▁";
# WordPiece (BERT) marks a continuation with "##".
SPACE_MARKERS = ("Ġ", "▁")
#: a piece starting with one of these begins a new word (byte-level BPE, SentencePiece; a line break)
WORD_START_MARKERS = (*SPACE_MARKERS, "Ċ")
#: a WordPiece piece starting with this continues the word before it
CONTINUATION_MARKER = "##"


def display_token(token: str) -> str:
    """A readable label for one raw token string (``Ġthe`` -> ``the``, ``Ċ`` -> ``\\n``)."""
    label = token
    for marker in SPACE_MARKERS:
        if label.startswith(marker) and len(label) > len(marker):
            label = label[len(marker) :]
        label = label.replace(marker, " ")
    label = label.replace("Ċ", "\\n").replace("ĉ", "\\t")
    return label if label.strip() else repr(label)[1:-1] or "␣"


#: what byte-level and SentencePiece tokenizers write for whitespace (a space, a newline, a tab, a carriage return)
_WHITESPACE_STAND_INS = {"Ġ": " ", "▁": " ", "Ċ": "\n", "ĉ": "\t", "č": "\r"}


def is_whitespace_token(token: str) -> bool:
    """Whether ``token`` (a raw tokenizer string) stands for nothing but whitespace (``Ċ``, ``ĠĊ``, ``\\n``)."""
    text = token
    for stand_in, character in _WHITESPACE_STAND_INS.items():
        text = text.replace(stand_in, character)
    return bool(text) and not text.strip()


def last_content_position(tokens: Sequence[str]) -> int:
    """The position of the last token that is not whitespace (a text's trailing newline is skipped); the last
    position when every token is whitespace."""
    for position in range(len(tokens) - 1, -1, -1):
        if not is_whitespace_token(tokens[position]):
            return position
    return len(tokens) - 1


def word_groups(word_ids: Sequence[int | None]) -> list[list[int]]:
    """Token indices of each word, in order. Special tokens (word id None) stay alone."""
    groups: list[list[int]] = []
    previous: int | None = None
    for index, word in enumerate(word_ids):
        if word is not None and word == previous and groups:
            groups[-1].append(index)
        else:
            groups.append([index])
        previous = word
    return groups


def word_label(tokens: Sequence[str], group: Sequence[int]) -> str:
    """Join a word's pieces: ``["play", "##ing"]`` -> ``playing``."""
    return "".join(word_piece(tokens, index, position) for position, index in enumerate(group))


def word_piece(tokens: Sequence[str], index: int, position: int) -> str:
    """The text token ``index`` adds to its word, being its word's ``position``-th piece (``##ing`` -> ``ing``)."""
    piece = display_token(tokens[index])
    return piece[len(CONTINUATION_MARKER) :] if position > 0 and piece.startswith(CONTINUATION_MARKER) else piece


def piece_starts_word(token: str, start_markers: bool) -> bool:
    """Whether raw ``token`` begins a word: by a start marker (``start_markers``: the tokenizer uses them),
    else unless it carries WordPiece's continuation marker."""
    return token.startswith(WORD_START_MARKERS) if start_markers else not token.startswith(CONTINUATION_MARKER)


def _aggregation(groups: list[list[int]], length: int, average: bool) -> Tensor:
    """``[words, tokens]`` matrix: 1 (or 1/len) where a token belongs to a word."""
    matrix = torch.zeros(len(groups), length)
    for row, group in enumerate(groups):
        matrix[row, group] = 1.0 / len(group) if average else 1.0
    return matrix


def merge_words(
    pattern: Tensor,
    query_word_ids: Sequence[int | None],
    key_word_ids: Sequence[int | None],
) -> Tensor:
    """Merge ``[..., query, key]`` token attention into ``[..., query_words, key_words]``."""
    query_groups, key_groups = word_groups(query_word_ids), word_groups(key_word_ids)
    rows = _aggregation(query_groups, pattern.shape[-2], average=True).to(pattern)  # [Wq, q]
    columns = _aggregation(key_groups, pattern.shape[-1], average=False).to(pattern).T  # [k, Wk]
    return rows @ pattern @ columns  # [..., Wq, Wk]


def merge_visibility(
    visible: Tensor, query_word_ids: Sequence[int | None], key_word_ids: Sequence[int | None]
) -> Tensor:
    """Word-level ``[Wq, Wk]`` visibility: a word may see a word if any of their pieces may."""
    merged = merge_words(visible.float(), query_word_ids, key_word_ids)
    return merged > 0


def word_ids_from_markers(tokens: list[str], special: list[bool], last_word: int | None = None) -> list[int | None]:
    """Word ids of tokens no tokenizer labelled (generated, or handed over), from their markers: ``Ġ``/``▁`` start
    a word, ``##`` continues one; ``last_word``: the id of the word before ``tokens`` (None: they start the text)."""
    uses_start_markers = any(t.startswith(WORD_START_MARKERS) for t in tokens)
    word = -1 if last_word is None else last_word
    ids: list[int | None] = []
    previous_special = last_word is None
    for token, is_special in zip(tokens, special):
        if is_special:
            ids.append(None)
            previous_special = True
            continue
        starts = piece_starts_word(token, uses_start_markers) or previous_special
        word += 1 if starts else 0
        ids.append(word)
        previous_special = token.strip("Ċ") == ""  # a text after a line break starts a word
    return ids
