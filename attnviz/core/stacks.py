"""The attention stacks of a model, and which side of the input each one reads.

A pattern ``[head, query, key]`` of stack ``s`` has its queries from ``s.query_side`` and its
keys from ``s.key_side``: the *source* is the text (the encoder's input in an encoder-decoder
model), the *target* the decoder's text. Every module that pairs patterns with tokens, lengths
or word ids asks this table instead of branching on stack names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

StackName = Literal["self", "encoder", "decoder", "cross"]
Side = Literal["source", "target"]


@dataclass(frozen=True)
class Stack:
    name: StackName
    query_side: Side
    key_side: Side
    always_causal: bool  # decoder self-attention never sees later target tokens

    def is_causal(self, causal_model: bool) -> bool:
        """Whether queries only see earlier keys: always for ``decoder``, for ``self`` in a causal LM."""
        return self.always_causal or (self.name == "self" and causal_model)

    def pick(self, source, target):
        """``(query-side value, key-side value)`` out of a source-side and a target-side value."""
        sides = {"source": source, "target": target}
        if target is None and "target" in (self.query_side, self.key_side):
            raise ValueError(f"stack {self.name!r} needs a target (decoder) side")
        return sides[self.query_side], sides[self.key_side]


STACKS: dict[str, Stack] = {
    "self": Stack("self", "source", "source", always_causal=False),  # encoder-only and decoder-only models
    "encoder": Stack("encoder", "source", "source", always_causal=False),
    "decoder": Stack("decoder", "target", "target", always_causal=True),
    "cross": Stack("cross", "target", "source", always_causal=False),  # decoder queries over encoder keys
}


def is_causal_stack(name: str, causal_model: bool) -> bool:
    """Whether stack ``name`` of a model (``causal_model``: decoder-only) lets queries see only earlier keys."""
    return stack_of(name).is_causal(causal_model)


def stack_of(name: str) -> Stack:
    """The :class:`Stack` called ``name``; ``ValueError`` for an unknown name."""
    try:
        return STACKS[name]
    except KeyError:
        raise ValueError(f"unknown attention stack {name!r}: one of {', '.join(STACKS)}") from None
