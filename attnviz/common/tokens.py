"""Tokens as people read them: display labels, and merging sub-word pieces into words.

Merging a ``[..., query, key]`` pattern into words follows what attention means:
attention *to* a word is the sum of the attention to its pieces (columns are
added), attention *from* a word is the mean over its pieces (rows are
averaged). Rows therefore still sum to 1.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Any

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


#: the visible mark of a leading space in every token label (figures, pages, the terminal): ``Ġthe`` -> ``␣the``
SPACE_MARK = "␣"
#: the mark of a token whose first bytes finish a character begun in the token before it (byte-level BPE splits
#: a character of two to four UTF-8 bytes over tokens): that character is shown whole in the token where it begins
PARTIAL_MARK = "◌"


def display_token(token: str) -> str:
    """A readable label for one token string (``Ġthe`` -> ``␣the``, ``Ċ`` -> ``\\n``, ``##ing`` stays).

    Byte-level tokens are decoded by :func:`readable_tokens` first (the models do it as they encode).
    """
    label = token
    for marker in SPACE_MARKERS:
        label = label.replace(marker, " ")
    label = label.replace("Ċ", "\\n").replace("ĉ", "\\t")
    # control characters (a random or odd model can write any byte) are shown escaped: no font draws them
    label = "".join(
        repr(character)[1:-1] if unicodedata.category(character) == "Cc" else character for character in label
    )
    if not label.strip(" "):
        return SPACE_MARK * max(len(label), 1)
    if not label.strip():
        return repr(label)[1:-1]
    return SPACE_MARK + label[1:] if label.startswith(" ") else label


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table of the printable character that stands for each byte in a byte-level BPE token."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


#: byte -> its stand-in character; stand-in -> byte
BYTE_CHARACTERS = _bytes_to_unicode()
CHARACTER_BYTES = {character: byte for byte, character in BYTE_CHARACTERS.items()}
#: characters written back as the markers the rest of attnviz reads (a leading space starts a word)
_MARKED = {" ": "Ġ", "\n": "Ċ", "\t": "ĉ"}


def is_byte_level(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` is a byte-level BPE (GPT-2, SmolLM2, LLaMA-3): its fast backend decodes or splits
    with ``ByteLevel``, or (a slow GPT-2 tokenizer) it has a byte encoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    parts = (getattr(backend, "decoder", None), getattr(backend, "pre_tokenizer", None)) if backend else ()
    return any("ByteLevel" in repr(part) for part in parts if part is not None) or hasattr(tokenizer, "byte_encoder")


def token_strings(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """The tokens of ``ids`` as attnviz keeps them: the tokenizer's own strings, byte-level ones decoded
    (:func:`readable_tokens`). Every model encodes through this, so captures, figures and pages agree."""
    ids = list(ids)
    tokens = tokenizer.convert_ids_to_tokens(ids)
    # an id past the tokenizer's vocabulary (a model whose embedding table is padded beyond it can write one)
    tokens = [f"<id {token_id}>" if token is None else token for token, token_id in zip(tokens, ids, strict=True)]
    return readable_tokens(tokens) if is_byte_level(tokenizer) else tokens


def readable_tokens(tokens: Sequence[str]) -> list[str]:
    """Byte-level BPE tokens decoded to text: ``Ã©`` -> ``é``, ``ãģ¯`` -> ``は``, keeping ``Ġ``/``Ċ`` markers.

    A character whose bytes are split over several tokens is shown whole in the token where it begins; each
    later token that holds the rest of its bytes starts with :data:`PARTIAL_MARK` (joined into words, the
    character reads once). Tokens that are not byte-level strings (added special tokens) stay as they are.
    """
    owners: list[int] = []  # the token of each byte
    data = bytearray()
    for index, token in enumerate(tokens):
        if all(character in CHARACTER_BYTES for character in token):
            data.extend(CHARACTER_BYTES[character] for character in token)
            owners.extend([index] * len(token))
    decoded = ["" for _ in tokens]
    continues = [False for _ in tokens]
    position = 0
    while position < len(data):
        length = _utf8_length(data[position])
        chunk = bytes(data[position : position + length])
        try:
            character = chunk.decode("utf-8")
        except UnicodeDecodeError:  # not UTF-8 (a stray byte): its value, visibly
            character, length = f"\\x{data[position]:02x}", 1
        owner = owners[position]
        decoded[owner] += _MARKED.get(character, character)
        for byte in range(position + 1, position + length):
            if owners[byte] != owner and not decoded[owners[byte]]:
                continues[owners[byte]] = True
        position += length
    return [
        (PARTIAL_MARK if continues[index] else "") + decoded[index]
        if all(character in CHARACTER_BYTES for character in token)
        else token
        for index, token in enumerate(tokens)
    ]


def decoded_if_byte_level(tokens: Sequence[str]) -> list[str]:
    """``tokens`` handed over by a user (``tokenizer.convert_ids_to_tokens``), decoded by :func:`readable_tokens`
    when they are byte-level BPE stand-ins (``Ġbi``, ``Ã¨re`` -> ``Ġbi``, ``ère``), else as they are.

    They are byte-level when the tokens made only of stand-in characters hold a stand-in beyond Latin-1 (``Ġ``,
    ``Ċ``) or a byte beyond ASCII, and their bytes, in order, are valid UTF-8: ``café`` from a WordPiece
    tokenizer is one byte ``é`` that no UTF-8 text holds alone, so it stays as written."""
    data = bytearray()
    marked = False
    for token in tokens:
        if token and all(character in CHARACTER_BYTES for character in token):
            data.extend(CHARACTER_BYTES[character] for character in token)
            marked = marked or any(ord(character) > 0xFF for character in token)
    if not (marked or any(byte > 0x7F for byte in data)):
        return list(tokens)
    try:
        bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return list(tokens)
    return readable_tokens(tokens)


def _utf8_length(lead: int) -> int:
    """Bytes of the UTF-8 character that begins with byte ``lead`` (1 for a byte no character begins with)."""
    if lead >= 0xF0:
        return 4
    if lead >= 0xE0:
        return 3
    if lead >= 0xC0:
        return 2
    return 1


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
    word = "".join(word_piece(tokens, index, position) for position, index in enumerate(group))
    return word.strip(SPACE_MARK) or word  # a space token of its own before the word is no part of it


def word_piece(tokens: Sequence[str], index: int, position: int) -> str:
    """The text token ``index`` adds to its word, being its word's ``position``-th piece (``##ing`` -> ``ing``;
    a word's leading space mark and the mark of a split character's remaining bytes are left out)."""
    piece = display_token(tokens[index]).removeprefix(PARTIAL_MARK)
    if piece.strip(SPACE_MARK):  # a piece of spaces only is kept: it is what the word holds
        piece = piece.removeprefix(SPACE_MARK)
    return piece.removeprefix(CONTINUATION_MARKER) if position > 0 else piece


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
