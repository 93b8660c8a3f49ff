"""``--layer`` and ``--head`` text -> the library's typed selections (:mod:`attnviz.render.selection`).

Only the syntax is checked here (before any model loads); whether an index exists is checked
by the library against the capture (:func:`attnviz.render.selection.resolve_layers`).
"""

from __future__ import annotations

from attnviz.common.errors import InputError
from attnviz.render.selection import MEAN_OF_HEADS, HeadSelection, LayerSelection, MeanOfHeads

ALL = "all"
MEAN = "mean"


def parse_layer_option(spec: str) -> LayerSelection:
    """``all`` -> None (every layer); ``-1`` or ``0,3`` -> a list of indices."""
    spec = spec.strip().lower()
    if spec == ALL:
        return None
    return _indices(spec, "--layer", "layer", "or all")


def parse_head_option(spec: str) -> HeadSelection:
    """``all`` -> None (every head); ``mean`` -> :data:`~attnviz.render.selection.MEAN_OF_HEADS`; else a list of numbers."""
    spec = spec.strip().lower()
    if spec == ALL:
        return None
    if spec == MEAN:
        return MEAN_OF_HEADS
    return _indices(spec, "--head", "head", "all or mean")


def check_one_pattern(layers: LayerSelection, heads: HeadSelection) -> tuple[int, int | MeanOfHeads]:
    """The one layer and the one head (or the mean) that ``--terminal`` draws; refuses more than one."""
    if layers is None or len(layers) != 1:
        raise InputError("the terminal shows one layer at a time: pick one with --layer, e.g. 0 or -1")
    if isinstance(heads, MeanOfHeads):
        return layers[0], heads
    if heads is None or len(heads) != 1:
        raise InputError("the terminal shows one head at a time: pick one with --head, e.g. 3, or mean")
    return layers[0], heads[0]


def _indices(spec: str, flag: str, what: str, words: str) -> list[int]:
    items = [item.strip() for item in spec.split(",")]
    if not any(items):
        raise InputError(f"no {what} given in {flag}: use an index, a comma list, {words}")
    if not all(items):  # "0,,1" or "0,": a number left out, not a shorter list
        raise InputError(f"{flag} {spec!r} has an empty entry between commas: give a comma list like 0,3, {words}")
    indices = []
    for item in items:
        try:
            indices.append(int(item))
        except ValueError:
            raise InputError(
                f"{flag} {item!r} is not a number: give an index like 0 or -1, a comma list like 0,3, {words}"
            ) from None
    return indices
