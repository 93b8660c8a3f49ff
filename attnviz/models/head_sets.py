"""Sets of heads: which heads a model has, which are removed, and the head mask that removes them.

A model's heads are described by its *layout*, ``{AttentionSite: number of heads}``
(:meth:`attnviz.models.base.LoadedModel.layout`). A set of removed heads is
``{AttentionSite: sorted list of head indices}``, the same form that
``attnviz.toy.prune_toy_heads`` takes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from attnviz.core import AttentionSite, HeadMask

#: ``{site: sorted head indices}``; sites with nothing removed may be absent.
RemovedHeads = dict[AttentionSite, list[int]]


def total_heads(layout: Mapping[AttentionSite, int]) -> int:
    """Number of heads over all sites."""
    return sum(layout.values())


def count_removed(removed: Mapping[AttentionSite, Iterable[int]]) -> int:
    """Number of heads in a removed-heads set."""
    return sum(len(list(heads)) for heads in removed.values())


def max_removable(layout: Mapping[AttentionSite, int]) -> int:
    """How many heads can go while every layer keeps at least one."""
    return sum(heads - 1 for heads in layout.values())


def normalize_removed(removed: Mapping[AttentionSite, Iterable[int]]) -> RemovedHeads:
    """Sorted, de-duplicated head lists; sites with no removed head dropped."""
    return {site: sorted(set(heads)) for site, heads in sorted(removed.items()) if heads}


def merge_removed(*sets: Mapping[AttentionSite, Iterable[int]]) -> RemovedHeads:
    """Union of several removed-heads sets."""
    merged: dict[AttentionSite, set[int]] = {}
    for removed in sets:
        for site, heads in removed.items():
            merged.setdefault(site, set()).update(heads)
    return normalize_removed(merged)


def keep_matrix(
    layout: Mapping[AttentionSite, int], removed: Mapping[AttentionSite, Iterable[int]]
) -> dict[AttentionSite, Tensor]:
    """``{site: [h] float32}``: 1 for a kept head, 0 for a removed one."""
    keep = {site: torch.ones(heads) for site, heads in layout.items()}
    for site, heads in removed.items():
        for head in heads:
            keep[site][head] = 0.0
    return keep


def removal_mask(
    layout: Mapping[AttentionSite, int], removed: Mapping[AttentionSite, Iterable[int]]
) -> HeadMask | None:
    """The :class:`HeadMask` that removes ``removed`` (``None`` when nothing is removed)."""
    removed = normalize_removed(removed)
    if not removed:
        return None
    return HeadMask(keep_matrix(layout, removed))


def heads_as_records(removed: Mapping[AttentionSite, Iterable[int]]) -> list[dict]:
    """``[{"stack", "layer", "head"}, …]`` in site order, for JSON reports."""
    return [
        {"stack": site.stack, "layer": site.layer, "head": int(head)}
        for site, heads in sorted(removed.items())
        for head in sorted(heads)
    ]


def layout_after(
    layout: Mapping[AttentionSite, int], removed: Mapping[AttentionSite, Iterable[int]]
) -> dict[AttentionSite, int]:
    """Heads left at every site once ``removed`` is gone."""
    removed = normalize_removed(removed)
    return {site: heads - len(removed.get(site, [])) for site, heads in layout.items()}
