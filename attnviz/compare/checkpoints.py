"""Checkpoints over training: each consecutive pair, and each checkpoint against the first.

``attnviz diff CKPT_1 CKPT_2 … CKPT_n`` with more than two specs. Only two models are loaded at
once beside the first (which every later one is compared with).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from attnviz.compare.models import compare_models
from attnviz.compare.result import ModelComparison, record_header
from attnviz.models.base import LoadedModel


@dataclass
class CheckpointComparison:
    """``consecutive[i]``: checkpoint i against i + 1; ``from_first[i]``: the first against checkpoint i + 1."""

    models: list[str]
    consecutive: list[ModelComparison]
    from_first: list[ModelComparison]

    def trajectories(self, measure: str = "js_divergence", stack: str | None = None) -> torch.Tensor:
        """``[checkpoint, layer, head]`` of ``measure`` from the first (checkpoint 0 is 0 where matched)."""
        matrices = [result.matrix(measure, stack) for result in self.from_first]  # each [layer, head]
        first = torch.where(matrices[0].isnan(), matrices[0], torch.zeros_like(matrices[0]))  # [layer, head]
        return torch.stack([first, *matrices])

    def record(self) -> dict:
        return {
            **record_header("checkpoints"),
            "models": self.models,
            "consecutive": [result.record() for result in self.consecutive],
            "from_first": [result.record() for result in self.from_first],
        }


def compare_checkpoints(
    specs: Sequence[str | LoadedModel],
    load: Callable[[str], LoadedModel],
    texts: Sequence[str] | None = None,
    **options,
) -> CheckpointComparison:
    """Compare each consecutive pair of ``specs`` and each against the first; ``load`` turns a spec into a model.

    ``options`` go to :func:`~attnviz.compare.models.compare_models`.
    """

    def model(spec: str | LoadedModel) -> LoadedModel:
        return spec if isinstance(spec, LoadedModel) else load(spec)

    first = model(specs[0])
    previous = first
    consecutive, from_first = [], []
    for spec in specs[1:]:
        current = model(spec)
        consecutive.append(compare_models(previous, current, texts, **options))
        if previous is first:
            from_first.append(consecutive[-1])
        else:
            from_first.append(compare_models(first, current, texts, **options))
        previous = current
    return CheckpointComparison([first.name] + [r.model_b for r in consecutive], consecutive, from_first)
