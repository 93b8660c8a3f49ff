"""Original head numbers of a pruned model, so figures and tables never renumber heads.

A checkpoint written by ``attnviz prune`` records, per attention site, the original
index of every head its weights still hold (``kept_heads``) and which of those were
removed but kept with zeroed output (``masked_heads``, grouped-query attention).

A capture of some layers and heads only uses the same record: ``heads`` gives the model's
number of each recorded head, ``recorded_layers`` the model's layers it holds, so a capture of
layer 3 head 2 is labelled L3 H2 everywhere, never L0 H0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from attnviz.core import AttentionSite


@dataclass
class HeadIdentity:
    """``heads[stack][layer]``: the original id of each head in the weights, in order;
    ``masked[stack][layer]``: original ids of heads kept with zeroed output."""

    heads: dict[str, list[list[int]]] = field(default_factory=dict)
    masked: dict[str, list[list[int]]] = field(default_factory=dict)
    #: a capture of some layers: stack -> the model's layers it records (a stack absent here: every layer)
    recorded_layers: dict[str, list[int]] = field(default_factory=dict)
    #: a capture of some layers or heads: stack -> per layer, how many heads the model numbers (``heads``: those recorded)
    model_heads: dict[str, list[int]] = field(default_factory=dict)
    #: a capture of some layers or heads: stack -> per layer, how many heads the model has (fewer than it
    #: numbers once pruned)
    model_layout: dict[str, list[int]] = field(default_factory=dict)
    #: a pruned model: stack -> per layer, how many heads it had before pruning (not saved with captures)
    original_heads: dict[str, list[int]] = field(default_factory=dict)

    def is_recorded(self, stack: str, layer: int) -> bool:
        """Whether a capture holds ``layer`` of ``stack`` (always, unless it records some layers only)."""
        layers = self.recorded_layers.get(stack)
        return layers is None or layer in layers

    def head_count(self, stack: str, layer: int) -> int | None:
        """How many heads the model numbers in ``(stack, layer)`` when a capture records some only; else None."""
        counts = self.model_heads.get(stack)
        return counts[layer] if counts is not None and layer < len(counts) else None

    def is_subset(self) -> bool:
        """Whether this describes a capture of some layers or heads only."""
        return bool(self.recorded_layers or self.model_heads)

    def ids(self, stack: str, layer: int, count: int) -> list[int]:
        """Original ids of the ``count`` heads of ``(stack, layer)`` (0..count-1 when nothing is recorded)."""
        layers = self.heads.get(stack)
        if layers is None or layer >= len(layers) or len(layers[layer]) != count:
            return list(range(count))
        return list(layers[layer])

    def masked_ids(self, stack: str, layer: int) -> list[int]:
        layers = self.masked.get(stack)
        return list(layers[layer]) if layers is not None and layer < len(layers) else []

    def to_dict(self) -> dict:
        record: dict = {"heads": self.heads, "masked": self.masked}
        if self.recorded_layers:
            record["recorded_layers"] = self.recorded_layers
        if self.model_heads:
            record["model_heads"] = self.model_heads
        if self.model_layout:
            record["model_layout"] = self.model_layout
        return record

    @classmethod
    def from_dict(cls, record: dict) -> HeadIdentity:
        identity = cls(
            heads=record.get("heads", {}),
            masked=record.get("masked", {}),
            recorded_layers=record.get("recorded_layers", {}),
            model_heads=record.get("model_heads", {}),
            model_layout=record.get("model_layout", {}),
        )
        # read from files: every table must be stack -> list of numbers (or of lists of numbers)
        for name, table, nested in (
            ("heads", identity.heads, True),
            ("masked", identity.masked, True),
            ("recorded_layers", identity.recorded_layers, False),
            ("model_heads", identity.model_heads, False),
            ("model_layout", identity.model_layout, False),
        ):
            if not isinstance(table, dict) or not all(
                isinstance(value, list) and all(_numbers(item) if nested else _number(item) for item in value)
                for value in table.values()
            ):
                raise ValueError(f"{name} is not a mapping of stack to lists of numbers")
        return identity


def _number(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _numbers(value: object) -> bool:
    return isinstance(value, list) and all(_number(item) for item in value)


def original_layout(layout: Mapping[AttentionSite, int], identity: HeadIdentity | None) -> dict[AttentionSite, int]:
    """site -> heads before pruning of a model whose heads are now ``layout`` (``layout`` itself when not pruned)."""
    counts = identity.original_heads if identity is not None else {}
    return {
        site: counts[site.stack][site.layer] if site.layer < len(counts.get(site.stack, [])) else heads
        for site, heads in layout.items()
    }


def model_identity(loaded) -> HeadIdentity | None:
    """The identity of a loaded model (its ``head_identity``: the loaders of pruned checkpoints set it from their
    checked record, :mod:`attnviz.models.pruning_records`); None when it was not pruned."""
    return getattr(loaded, "head_identity", None)
