"""Reading and replacing each head's output (or pattern): the head editors.

A :class:`HeadEditor` travels in the :class:`~attnviz.core.attention.AttentionContext` (``head_editor``) like the
head mask does, and sees each head's output ``[b, q, h, dv]`` at every site: :class:`HeadOutputRecorder` keeps it,
:class:`HeadPatch` puts other values in, per batch row and head. Where it sees it is the model's choice: Hugging Face
models apply output edits at the input of each site's output projection (:mod:`attnviz.models.head_output_edits`:
the vector that really enters it, after any gate or sub-norm, on every family) and hand the core only the pattern
half (:class:`PatternEdits`); attnviz's toys, whose projection reads the core's output unchanged, let
:func:`attnviz.core.attention.attend` apply both to the ``[b, q, h, dv]`` it returns.

A patch can also replace a head's *pattern* rows (``[b, h, q, k]``, after the softmax, before the
product with the values): the core then computes that site on its fresh-tensor path.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

if TYPE_CHECKING:
    from attnviz.core.attention import AttentionSite


class HeadEditor(Protocol):
    """What the core asks at every attention site it computes (see the module docstring)."""

    def edits_patterns(self, site: AttentionSite) -> bool:
        """Whether :meth:`edit_pattern` changes patterns at ``site`` (the core then keeps them in fresh tensors)."""

    def edit_pattern(self, site: AttentionSite, pattern: Tensor, query_start: int) -> Tensor:
        """``pattern``: float32 ``[b, h, blk, k]``, rows ``query_start…``; returns the pattern to apply to the values."""

    def edit_output(self, site: AttentionSite, output: Tensor) -> Tensor:
        """``output``: ``[b, q, h, d]``, each head's output; returns what the model merges and projects."""


@dataclass(frozen=True)
class HeadReplacement:
    """Batch row ``rows[i]`` gets head ``heads[i]``'s values replaced by ``values[i]`` at query ``positions``.

    ``values``: ``[n, p, d]`` for an output patch, ``[n, p, k]`` for a pattern patch (``n`` rows,
    ``p`` positions); a ``[n, 1, ·]`` value is broadcast over the positions.
    """

    rows: Tensor  # [n] long
    heads: Tensor  # [n] long
    positions: Tensor  # [p] long
    values: Tensor  # [n, p|1, d] or [n, p|1, k]


class HeadPatch:
    """A :class:`HeadEditor` that replaces chosen heads' outputs or patterns, row by row of the batch."""

    def __init__(self) -> None:
        self.outputs: dict[AttentionSite, list[HeadReplacement]] = defaultdict(list)
        self.patterns: dict[AttentionSite, list[HeadReplacement]] = defaultdict(list)

    def replace_output(self, site: AttentionSite, replacement: HeadReplacement) -> None:
        self.outputs[site].append(replacement)

    def replace_pattern(self, site: AttentionSite, replacement: HeadReplacement) -> None:
        self.patterns[site].append(replacement)

    def edits_patterns(self, site: AttentionSite) -> bool:
        return site in self.patterns

    def edit_pattern(self, site: AttentionSite, pattern: Tensor, query_start: int) -> Tensor:
        block = pattern.shape[2]
        edited = pattern
        for change in self.patterns.get(site, ()):
            inside = (change.positions >= query_start) & (change.positions < query_start + block)
            if not bool(inside.any()):
                continue
            if edited is pattern:
                edited = pattern.clone()  # observers may keep the pattern they were shown
            local = (change.positions[inside] - query_start).to(pattern.device)  # [p']
            values = change.values if change.values.shape[1] == 1 else change.values[:, inside.to(change.values.device)]
            rows, heads = change.rows.to(pattern.device), change.heads.to(pattern.device)
            shape = (rows.shape[0], local.shape[0], edited.shape[-1])  # [n, p', k]
            edited[rows[:, None], heads[:, None], local[None, :]] = values.to(edited.dtype).expand(shape)
        return edited

    def edit_output(self, site: AttentionSite, output: Tensor) -> Tensor:
        for change in self.outputs.get(site, ()):
            rows, heads = change.rows.to(output.device), change.heads.to(output.device)
            positions = change.positions.to(output.device)
            shape = (rows.shape[0], positions.shape[0], output.shape[-1])  # [n, p, d]
            output[rows[:, None], positions[None, :], heads[:, None]] = change.values.to(output.dtype).expand(shape)
        return output


class HeadOutputRecorder:
    """A :class:`HeadEditor` that keeps every site's head outputs unchanged: ``outputs[site]`` is ``[b, q, h, d]``."""

    def __init__(self) -> None:
        self.outputs: dict[AttentionSite, Tensor] = {}

    def edits_patterns(self, site: AttentionSite) -> bool:
        return False

    def edit_pattern(self, site: AttentionSite, pattern: Tensor, query_start: int) -> Tensor:
        return pattern

    def edit_output(self, site: AttentionSite, output: Tensor) -> Tensor:
        self.outputs[site] = output.detach().clone()
        return output


def positions_tensor(positions: list[int] | range) -> Tensor:
    """Query positions as the ``[p]`` long tensor a :class:`HeadReplacement` takes."""
    return torch.as_tensor(list(positions), dtype=torch.long)


class PatternEdits:
    """The pattern half of ``editor`` (its output edits left out): what the core applies when the model applies the
    output edits itself, at the input of each output projection (:mod:`attnviz.models.head_output_edits`)."""

    def __init__(self, editor: HeadEditor) -> None:
        self.editor = editor

    def edits_patterns(self, site: AttentionSite) -> bool:
        return self.editor.edits_patterns(site)

    def edit_pattern(self, site: AttentionSite, pattern: Tensor, query_start: int) -> Tensor:
        return self.editor.edit_pattern(site, pattern, query_start)

    def edit_output(self, site: AttentionSite, output: Tensor) -> Tensor:
        return output
