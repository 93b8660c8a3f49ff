"""Physically removing heads from a toy model.

Masking head ``h`` of a site (a :class:`~attnviz.core.HeadMask` of 0) zeroes its
output before the output projection. Removing it deletes its rows of the
query/key/value projections, its columns of the output projection and its
slice of any per-head variant parameters: the pruned model computes the same
outputs with fewer parameters. The config records the new head counts in
``heads_per_layer``, so the checkpoint reloads with the right shapes.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from attnviz.common.errors import InputError
from attnviz.core import AttentionSite
from attnviz.models.base import parameter_count

if TYPE_CHECKING:  # ToyModel calls this module; the pruned copy is built with type(loaded)
    from attnviz.toy.loaded import ToyModel


def prune_toy_heads(loaded: ToyModel, remove: Mapping[AttentionSite, Sequence[int]]) -> ToyModel:
    """A copy of ``loaded`` without the heads in ``remove`` (indices into each site's current heads).

    ``loaded`` itself is left unchanged. Unknown sites or head indices raise :class:`InputError`.
    """
    modules = loaded.model.attention_modules()
    for site, heads in remove.items():
        if site not in modules:
            raise InputError(
                f"this toy model has no attention site {site.name}: it has {', '.join(s.name for s in modules)}"
            )
        count = modules[site].heads
        bad = [h for h in heads if not isinstance(h, int) or not 0 <= h < count]
        if bad:
            raise InputError(f"site {site.name} has heads 0–{count - 1}; cannot remove {bad}")
        if len(set(heads)) != len(heads):
            raise InputError(f"site {site.name}: head indices to remove are repeated ({list(heads)})")

    model = copy.deepcopy(loaded.model)
    pruned_modules = model.attention_modules()
    heads_per_layer = {
        stack: [pruned_modules[AttentionSite(stack, layer)].heads for layer in range(loaded.config.layers_of(stack))]
        for stack in loaded.config.stacks()
    }
    for site, heads in remove.items():
        if not heads:
            continue
        module = pruned_modules[site]
        module.keep_heads([h for h in range(module.heads) if h not in set(heads)])
        heads_per_layer[site.stack][site.layer] = module.heads
    model.config = replace(loaded.config, heads_per_layer=heads_per_layer).validate()

    history = list(loaded.metadata.get("pruned", {}).get("removed", []))
    history.append({site.name: sorted(heads) for site, heads in remove.items() if heads})
    metadata = dict(loaded.metadata)
    metadata["pruned"] = {
        "from": loaded.name,
        "removed": history,
        "parameters_before": _count(loaded),
        "parameters_after": parameter_count(model),
    }
    pruned = type(loaded)(
        model, loaded.tokenizer, loaded.task_settings, name=f"{loaded.name} (pruned)", metadata=metadata
    )
    return pruned


def _count(loaded: ToyModel) -> int:
    previous = loaded.metadata.get("pruned", {}).get("parameters_before")
    return previous if previous is not None else parameter_count(loaded.model)
