"""Which layers and heads to draw (or record), as integers: checked against what a capture or model holds.

The library takes typed selections only: a sequence of layer indices (negative ones count
from the end, as in Python) or None for every layer; for heads, a sequence of head numbers,
None for every head, or :data:`MEAN_OF_HEADS` for their average. Turning command-line text
(``"all"``, ``"-1"``, ``"0,3"``, ``"mean"``) into these lives in :mod:`attnviz.cli.selection`.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnviz.common.errors import ParameterError

__all__ = ["MEAN_OF_HEADS", "HeadSelection", "LayerSelection", "MeanOfHeads", "resolve_heads", "resolve_layers"]


class MeanOfHeads:
    """The average of a layer's heads, drawn as one pattern, instead of the heads one by one."""

    def __repr__(self) -> str:
        return "MEAN_OF_HEADS"


#: select the mean over a layer's heads (``heads=MEAN_OF_HEADS``)
MEAN_OF_HEADS = MeanOfHeads()

#: layer indices (negative: from the end), or None for every layer
LayerSelection = Sequence[int] | None
#: head numbers (negative: from the end), None for every head, or :data:`MEAN_OF_HEADS`
HeadSelection = Sequence[int] | MeanOfHeads | None


def resolve_layers(
    layers: LayerSelection, count: int, present: Sequence[int] | None = None, *, parameter: str = "layers"
) -> list[int]:
    """The chosen layers as indices in ``0..count-1`` (None: all of them); refuses an empty or out-of-range choice.

    ``present``: the layers that have attention, where only some do (a hybrid stack whose other layers run a
    recurrence or a convolution); None chooses those, and a layer outside them is refused, naming them.
    ``parameter``: the caller's name of the parameter, for the messages.
    """
    if layers is None:
        return list(range(count)) if present is None else sorted(present)
    if len(layers) == 0:
        raise ParameterError(parameter, f"no layer given in {{{parameter}}}: give an index, a list of indices, or all")
    chosen = [_in_range(index, count, parameter, "layer") for index in layers]
    for index, layer in zip(layers, chosen, strict=True):
        if present is not None and layer not in present:
            raise ParameterError(
                parameter,
                f"{{{parameter}}}: layer {layer} has no attention (this model mixes attention with other layers): "
                f"its attention layers are {', '.join(map(str, sorted(present)))}",
                index,
            )
    return chosen


def resolve_heads(
    heads: HeadSelection, original_ids: Sequence[int], *, count: int | None = None, recorded_only: bool = False
) -> list[int] | MeanOfHeads:
    """Positions (in the layer's pattern tensor) of the chosen heads, or :data:`MEAN_OF_HEADS`.

    ``original_ids[i]`` is the number of the head at position ``i``: ``0..n-1`` for an unpruned
    layer, the numbers from before pruning for a pruned one. Head numbers in ``heads`` are those
    numbers (negative ones count back from the layer's original head count); a head pruned away
    from the layer is refused, naming the heads it kept. ``count``: how many heads the model numbers
    (default: the largest number + 1); ``recorded_only``: ``original_ids`` are the heads a capture
    recorded (a missing head is refused as not recorded rather than pruned).
    """
    if isinstance(heads, MeanOfHeads):
        return heads
    if heads is None:
        return list(range(len(original_ids)))
    if len(heads) == 0:
        raise ParameterError("heads", "no head given in {heads}: give an index, a list of indices, all or mean")
    if not original_ids and not recorded_only:
        raise ParameterError(
            "heads", "this layer has no heads left (every one was pruned away): choose another layer", heads[0]
        )
    position = {original: index for index, original in enumerate(original_ids)}
    original_count = count if count is not None else max(original_ids, default=-1) + 1
    chosen = []
    for number in heads:
        original = _in_range(number, original_count, "heads", "head")
        if original not in position:
            kept = ", ".join(map(str, original_ids))
            if recorded_only:
                raise ParameterError(
                    "heads", f"head {original} is not in this capture: it records heads {kept} of this layer", number
                )
            raise ParameterError("heads", f"head {original} was pruned from this layer: it keeps heads {kept}", number)
        chosen.append(position[original])
    return chosen


def _in_range(index: int, count: int, parameter: str, what: str) -> int:
    """``index`` in ``0..count-1``, a negative one counted from the end; refused (naming ``parameter``) otherwise."""
    if not -count <= index < count:
        raise ParameterError(
            parameter,
            f"{{{parameter}}}: {what} {index} is out of range: the model has {count} {what}s "
            f"(0–{count - 1}, or -1 for the last)",
            index,
        )
    return index % count
