"""A toy tokenizer: one token per symbol, so heatmap labels are the symbols themselves.

Vocabulary: four special tokens (``<pad>``, ``<bos>``, ``<eos>``, ``<sep>``)
followed by the task's symbols (digits such as ``3`` or letters such as ``a``).
Text is split on whitespace (``"3 1 4 1 5"``); text without whitespace is split
into characters when every symbol is one character (``"31415"``, ``"abcabc"``).
"""

from __future__ import annotations

from collections.abc import Sequence

from attnviz.common.errors import InputError

PAD, BOS, EOS, SEP = "<pad>", "<bos>", "<eos>", "<sep>"
SPECIAL_TOKENS = (PAD, BOS, EOS, SEP)


class ToyTokenizer:
    """Maps symbols to ids and back; ids ``0 … 3`` are the special tokens."""

    def __init__(self, symbols: Sequence[str]):
        symbols = list(symbols)
        if not symbols:
            raise InputError("a toy tokenizer needs at least one symbol")
        if len(set(symbols)) != len(symbols):
            raise InputError("toy tokenizer symbols must be distinct")
        for symbol in symbols:
            if (
                not isinstance(symbol, str)
                or not symbol
                or any(c.isspace() for c in symbol)
                or symbol in SPECIAL_TOKENS
            ):
                raise InputError(f"invalid toy symbol {symbol!r}: symbols are non-empty, without spaces, not special")
        self.symbols = symbols
        self.vocab = list(SPECIAL_TOKENS) + symbols
        #: token -> id
        self.index = {token: index for index, token in enumerate(self.vocab)}

    @property
    def pad_id(self) -> int:
        return self.index[PAD]

    def __len__(self) -> int:
        return len(self.vocab)

    def split(self, text: str, *, allow: Sequence[str] = ()) -> list[str]:
        """The tokens of ``text``; unknown tokens raise :class:`InputError` listing the vocabulary.

        ``allow``: special tokens the caller accepts inside the text (e.g. ``<sep>``).
        """
        text = text.strip()
        if not text:
            raise InputError("the text is empty: give at least one symbol")
        if any(c.isspace() for c in text):
            pieces = text.split()
        elif all(len(symbol) == 1 for symbol in self.symbols) and text not in self.index:
            pieces = list(text)
        else:
            pieces = [text]
        for piece in pieces:
            if piece in SPECIAL_TOKENS and piece not in allow:
                raise InputError(
                    f"{piece} cannot be written in the text here: attnviz adds special tokens itself; "
                    "write only symbols, e.g. " + " ".join(self.symbols[:5])
                )
            if piece not in self.index:
                shown = " ".join(self.symbols) if len(self.symbols) <= 30 else " ".join(self.symbols[:30]) + " …"
                raise InputError(
                    f"unknown symbol {piece!r} for this toy model: its symbols are {shown} "
                    "(separate them with spaces, e.g. '" + " ".join(self.symbols[:3]) + "')"
                )
        return pieces

    def ids(self, tokens: Sequence[str]) -> list[int]:
        return [self.index[token] for token in tokens]

    def tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.vocab[index] for index in ids]

    def is_special(self, token: str) -> bool:
        return token in SPECIAL_TOKENS

    def to_dict(self) -> dict:
        return {"symbols": list(self.symbols)}

    @classmethod
    def from_dict(cls, values: dict) -> ToyTokenizer:
        if not isinstance(values, dict) or not isinstance(values.get("symbols"), list):
            raise InputError('a toy tokenizer needs a "symbols" list')
        return cls(values["symbols"])
