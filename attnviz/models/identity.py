"""Original head numbers of a pruned model, so figures and tables never renumber heads.

A checkpoint written by ``attnviz prune`` records, per attention site, the original
index of every head its weights still hold (``kept_heads``) and which of those were
removed but kept with zeroed output (``masked_heads``, grouped-query attention).

A capture of some layers and heads only uses the same record: ``heads`` gives the model's
number of each recorded head, ``recorded_layers`` the model's layers it holds, so a capture of
layer 3 head 2 is labelled L3 H2 everywhere, never L0 H0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from attnviz.models.specs import PRUNED_MARKER


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


def pruning_identity(checkpoint: str | Path | None) -> HeadIdentity | None:
    """The identity recorded in a pruned checkpoint directory's ``attnviz-pruned.json``; None for other models."""
    if checkpoint is None:
        return None
    marker = Path(checkpoint) / PRUNED_MARKER
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    identity = HeadIdentity()
    for site in record.get("sites", []):
        stack, layer = site["stack"], int(site["layer"])
        heads = identity.heads.setdefault(stack, [])
        masked = identity.masked.setdefault(stack, [])
        while len(heads) <= layer:
            heads.append([])
            masked.append([])
        heads[layer] = [int(h) for h in site["kept_heads"]]
        masked[layer] = [int(h) for h in site.get("masked_heads", [])]
    return identity


def removal_identity(history: list[dict[str, list[int]]], layout: dict) -> HeadIdentity:
    """The identity of a toy model pruned by ``history`` (its ``metadata["pruned"]["removed"]``).

    Each entry maps a site name (``"self.0"``) to the heads removed then, numbered as the model was
    at that time; replaying the entries in order gives each remaining head's original number.
    ``layout``: site -> heads now (:meth:`LoadedModel.layout`).
    """
    removed_per_site: dict[str, int] = {}
    for entry in history:
        for name, heads in entry.items():
            removed_per_site[name] = removed_per_site.get(name, 0) + len(heads)
    identity = HeadIdentity()
    for site, count in sorted(layout.items()):
        ids = list(range(count + removed_per_site.get(site.name, 0)))
        for entry in history:
            gone = set(entry.get(site.name, []))
            ids = [original for position, original in enumerate(ids) if position not in gone]
        layers = identity.heads.setdefault(site.stack, [])
        while len(layers) <= site.layer:
            layers.append([])
        layers[site.layer] = ids
    return identity


def model_identity(loaded) -> HeadIdentity | None:
    """The identity of a loaded model: pruned Hugging Face checkpoints carry ``checkpoint_path`` (their record),
    pruned toy models the history of their removals in ``metadata``."""
    recorded = pruning_identity(getattr(loaded, "checkpoint_path", None))
    if recorded is not None:
        return recorded
    metadata = getattr(loaded, "metadata", None)
    history = metadata.get("pruned", {}).get("removed") if isinstance(metadata, dict) else None
    return removal_identity(history, loaded.layout()) if history else None
