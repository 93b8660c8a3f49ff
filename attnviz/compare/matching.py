"""Which head of model B is which head of model A: matched by their original identity.

A head's identity is ``(stack, layer, original head number)``. A model that was not pruned numbers
its heads 0…h−1; a checkpoint written by ``attnviz prune`` records the original number of every head
its weights still hold, and which of those were removed but kept with zeroed output (masked: they
count as removed). Heads whose identity exists in both models are ``matched``; the others are
``only_a`` or ``only_b``.

Two models whose layouts differ before pruning (different layers or head counts, once each pruned
model's heads are counted as its record says they were) cannot be matched: their heads have nothing in
common but a number. :func:`match_heads` refuses them unless asked to match by position
(``by_position``), which the statistics-only comparison does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from attnviz.common.errors import InputError
from attnviz.compare.pairing import HeadPairs
from attnviz.core import AttentionSite
from attnviz.models.identity import HeadIdentity, original_layout

HeadStatus = Literal["matched", "only_a", "only_b"]


@dataclass(frozen=True)
class HeadMatch:
    """One head of the comparison: its identity, its status, and its weight position in A and in B (or None)."""

    site: AttentionSite
    head: int  # original head number
    status: HeadStatus
    a_position: int | None
    b_position: int | None


def present_heads(
    layout: Mapping[AttentionSite, int], identity: HeadIdentity | None
) -> dict[AttentionSite, dict[int, int]]:
    """site -> {original head: position in the weights} of the heads a model really has (masked ones left out)."""
    present = {}
    for site, count in layout.items():
        if identity is None:
            present[site] = {head: head for head in range(count)}
            continue
        ids = identity.ids(site.stack, site.layer, count)
        masked = set(identity.masked_ids(site.stack, site.layer))
        present[site] = {original: position for position, original in enumerate(ids) if original not in masked}
    return present


def match_heads(
    layout_a: Mapping[AttentionSite, int],
    identity_a: HeadIdentity | None,
    layout_b: Mapping[AttentionSite, int],
    identity_b: HeadIdentity | None,
    *,
    names: tuple[str, str] = ("A", "B"),
    by_position: bool = False,
) -> list[HeadMatch]:
    """Every head of either model, in (stack, layer, head) order, matched by original identity.

    Raises :class:`InputError` when the layouts the two models were pruned from (their own, when not pruned)
    differ, unless ``by_position``.
    """
    original_a, original_b = original_layout(layout_a, identity_a), original_layout(layout_b, identity_b)
    if original_a != original_b and not by_position:
        raise InputError(
            f"{names[0]} and {names[1]} come from different attention layouts ({_describe(original_a)} against "
            f"{_describe(original_b)}{_pruned_note(identity_a, identity_b)}): their heads cannot be matched. "
            "Compare their per-head statistics only with --by-statistics (compare_models(..., by_statistics=True))"
        )
    heads_a, heads_b = present_heads(layout_a, identity_a), present_heads(layout_b, identity_b)
    matches = []
    for site in sorted(set(heads_a) | set(heads_b)):
        in_a, in_b = heads_a.get(site, {}), heads_b.get(site, {})
        for head in sorted(set(in_a) | set(in_b)):
            status: HeadStatus = "matched" if head in in_a and head in in_b else "only_a" if head in in_a else "only_b"
            matches.append(HeadMatch(site, head, status, in_a.get(head), in_b.get(head)))
    return matches


def head_pairs(matches: list[HeadMatch]) -> dict[AttentionSite, HeadPairs]:
    """site -> the matched heads' positions in A and B (sites without a matched head are left out)."""
    pairs: dict[AttentionSite, tuple[list[int], list[int]]] = {}
    for match in matches:
        if match.status == "matched":
            a_index, b_index = pairs.setdefault(match.site, ([], []))
            a_index.append(match.a_position)  # type: ignore[arg-type]
            b_index.append(match.b_position)  # type: ignore[arg-type]
    return {site: HeadPairs(tuple(a), tuple(b)) for site, (a, b) in pairs.items()}


def _pruned_note(identity_a: HeadIdentity | None, identity_b: HeadIdentity | None) -> str:
    pruned = [side for side, identity in (("A", identity_a), ("B", identity_b)) if identity is not None]
    if not pruned:
        return ""
    return f" before pruning {' and '.join(pruned)}"


def _describe(layout: Mapping[AttentionSite, int]) -> str:
    stacks: dict[str, list[int]] = {}
    for site, count in sorted(layout.items()):
        stacks.setdefault(site.stack, []).append(count)
    parts = []
    for stack, counts in stacks.items():
        heads = f"{counts[0]} heads" if len(set(counts)) == 1 else f"{min(counts)}–{max(counts)} heads"
        parts.append(f"{len(counts)} {stack} layers × {heads}")
    return ", ".join(parts)
