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
_SPACE_MARKERS = ("Ġ", "▁")


def display_token(token: str) -> str:
    """A readable label for one raw token string (``Ġthe`` -> ``the``, ``Ċ`` -> ``\\n``)."""
    label = token
    for marker in _SPACE_MARKERS:
        if label.startswith(marker) and len(label) > len(marker):
            label = label[len(marker) :]
        label = label.replace(marker, " ")
    label = label.replace("Ċ", "\\n").replace("ĉ", "\\t")
    return label if label.strip() else repr(label)[1:-1] or "␣"


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
    pieces = []
    for position, index in enumerate(group):
        piece = display_token(tokens[index])
        if position > 0 and piece.startswith("##"):
            piece = piece[2:]
        pieces.append(piece)
    return "".join(pieces)


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


#: markers that start a word (byte-level BPE, SentencePiece, a line break) or continue one (WordPiece)
_WORD_START_MARKERS = ("Ġ", "▁", "Ċ")
_CONTINUATION_MARKER = "##"


def word_ids_from_markers(
    tokens: list[str], special: list[bool], last_word: int | None = None
) -> list[int | None]:
    """Word ids of tokens no tokenizer labelled (generated, or handed over), from their markers: ``Ġ``/``▁`` start
    a word, ``##`` continues one; ``last_word``: the id of the word before ``tokens`` (None: they start the text)."""
    uses_start_markers = any(t.startswith(_WORD_START_MARKERS) for t in tokens)
    word = -1 if last_word is None else last_word
    ids: list[int | None] = []
    previous_special = last_word is None
    for token, is_special in zip(tokens, special):
        if is_special:
            ids.append(None)
            previous_special = True
            continue
        if uses_start_markers:
            starts = token.startswith(_WORD_START_MARKERS) or previous_special
        else:
            starts = not token.startswith(_CONTINUATION_MARKER) or previous_special
        word += 1 if starts else 0
        ids.append(word)
        previous_special = token.strip("Ċ") == ""  # a text after a line break starts a word
    return ids
