"""How attnviz words counts for people: plurals, and the one summary of a model's layers and heads."""

from __future__ import annotations

from collections.abc import Iterable


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """``1 layer``, ``6 layers``, ``1,024 tokens`` (``plural_form`` for nouns not made plural by an ``s``)."""
    return f"{count:,} {noun if count == 1 else plural_form or noun + 's'}"


def layers_and_heads(head_counts: Iterable[int]) -> str:
    """A stack's size from its heads per layer, true for pruned models whose layers differ.

    ``[12] * 6`` -> ``6 layers × 12 heads``; ``[1]`` -> ``1 layer × 1 head``;
    ``[8, 12, 9, 12, 10, 11]`` -> ``6 layers, 8–12 heads (62 in all)``; a hybrid stack, whose layers without
    attention count 0 heads: ``[0, 4, 0, 4]`` -> ``4 layers, attention in 1, 3 × 4 heads``.
    """
    counts = list(head_counts)
    if not counts:
        return "no layers"
    present = [layer for layer, count in enumerate(counts) if count]
    if present and len(present) < len(counts):
        rest = layers_and_heads([counts[layer] for layer in present]).split(" ", 2)[2]  # "× 4 heads", "8–12 heads …"
        joint = " " if rest.startswith("×") else ", "
        return f"{plural(len(counts), 'layer')}, attention in {', '.join(map(str, present))}{joint}{rest}"
    low, high = min(counts), max(counts)
    if low == high:
        return f"{plural(len(counts), 'layer')} × {plural(low, 'head')}"
    return f"{plural(len(counts), 'layer')}, {low}–{high} heads ({sum(counts):,} in all)"
