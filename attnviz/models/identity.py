"""Original head numbers of a pruned model, so figures and tables never renumber heads.

A checkpoint written by ``attnviz prune`` records, per attention site, the original
index of every head its weights still hold (``kept_heads``) and which of those were
removed but kept with zeroed output (``masked_heads``, grouped-query attention).
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
        return {"heads": self.heads, "masked": self.masked}

    @classmethod
    def from_dict(cls, record: dict) -> HeadIdentity:
        return cls(heads=record.get("heads", {}), masked=record.get("masked", {}))


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


def model_identity(loaded) -> HeadIdentity | None:
    """The identity of a loaded model (pruned checkpoints carry ``checkpoint_path``)."""
    return pruning_identity(getattr(loaded, "checkpoint_path", None))
