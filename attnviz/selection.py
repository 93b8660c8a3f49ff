"""Parsing which layers and heads the user asked for (``--layer``, ``--head``)."""

from __future__ import annotations

from attnviz.errors import InputError

MEAN = "mean"


def _parse_index(item: str, count: int, what: str) -> int:
    try:
        index = int(item)
    except ValueError:
        raise InputError(f"{what} {item!r} is not a number: give an index like 0, -1 or a list like 0,3") from None
    if not -count <= index < count:
        raise InputError(
            f"{what} {index} is out of range: the model has {count} {what}s (0–{count - 1}, or -1 for the last)"
        )
    return index % count


def parse_layers(spec: str, num_layers: int) -> list[int]:
    """``all``, an index (negative counts from the end) or a comma list -> layer indices."""
    spec = spec.strip().lower()
    if spec == "all":
        return list(range(num_layers))
    return [_parse_index(item.strip(), num_layers, "layer") for item in spec.split(",") if item.strip()] or _empty(
        "layer"
    )


def parse_heads(spec: str, num_heads: int) -> list[int] | str:
    """``all``, ``mean``, an index or a comma list -> head indices, or :data:`MEAN`."""
    spec = spec.strip().lower()
    if spec == MEAN:
        return MEAN
    if spec == "all":
        return list(range(num_heads))
    return [_parse_index(item.strip(), num_heads, "head") for item in spec.split(",") if item.strip()] or _empty("head")


def parse_original_heads(spec: str, original_ids: list[int]) -> list[int] | str:
    """:func:`parse_heads` for a pruned model whose heads keep their original numbers.

    ``original_ids[i]`` is the original number of the head at position ``i``; numbers in ``spec``
    are original numbers, and the positions of those heads come back. A pruned-away head is refused.
    """
    selection = parse_heads(spec, max(original_ids, default=-1) + 1)
    if selection == MEAN or spec.strip().lower() == "all":
        return MEAN if selection == MEAN else list(range(len(original_ids)))
    position = {original: index for index, original in enumerate(original_ids)}
    pruned = [head for head in selection if head not in position]
    if pruned:
        kept = ", ".join(map(str, original_ids))
        raise InputError(f"head {pruned[0]} was pruned from this layer: it keeps heads {kept}")
    return [position[head] for head in selection]


def _empty(what: str):
    raise InputError(f"no {what} given: use an index, a comma list, or 'all'")
