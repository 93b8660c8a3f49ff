"""How much each attention head matters: the importance scores that pruning ranks heads by.

Every method returns ``{AttentionSite: [h] float64}``, higher meaning more
important; heads already removed score NaN.

* ``gradient`` — Michel et al. (2019), "Are Sixteen Heads Really Better than One?":
  a head-mask variable ξₕ multiplies each head's pattern; the importance is
  ``Iₕ = Σ_batches |∂L_batch/∂ξₕ|`` at ξ = 1 (removed heads held at 0), where
  ``L_batch`` is the batch's share of the data set's mean loss. Scores are then
  normalised per layer by their ℓ2 norm, as in the paper, so that layers with
  large gradients do not dominate a global ranking (removed heads' gradients at
  0 count in the norm, as in the paper's code).
* ``ablation`` — the loss increase when the head alone is masked (on top of the
  heads already removed): exact, one forward pass over the data per head.
* ``entropy`` / ``confidence`` — cheap proxies from :mod:`attnviz.stats` (one
  forward pass over the data): a head whose attention is focused (low normalised
  entropy, high mean maximum weight — Voita et al., 2019's "confidence") is taken
  to be important. ``entropy`` scores ``−normalized_entropy``.
* ``random`` — seeded uniform scores: the baseline every other method must beat.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnviz.common.errors import InputError
from attnviz.core import AttentionSite, HeadMask
from attnviz.models.head_sets import RemovedHeads, keep_matrix, merge_removed, normalize_removed, removal_mask
from attnviz.models.objective import Objective
from attnviz.prune.choices import METHODS

#: ``scores[site]`` is ``[h]`` float64 (NaN for removed heads); higher = more important
Scores = dict[AttentionSite, Tensor]


@dataclass
class HeadImportance:
    """Importance of every head of a model, by one method."""

    method: str  # one of METHODS
    scores: Scores  # site -> [h] float64, NaN for heads removed before scoring
    normalized: bool  # scores were divided by their layer's ℓ2 norm

    def records(self) -> list[dict]:
        """``[{"stack", "layer", "head", "score"}, …]`` for every head, NaN as ``None``."""
        return [
            {
                "stack": site.stack,
                "layer": site.layer,
                "head": head,
                "score": None if torch.isnan(value) else float(value),
            }
            for site, values in sorted(self.scores.items())
            for head, value in enumerate(values)
        ]


@contextlib.contextmanager
def frozen_parameters(model: nn.Module) -> Iterator[None]:
    """Turn off gradients of the weights (only the head mask needs them), restoring them afterwards."""
    flags = [(parameter, parameter.requires_grad) for parameter in model.parameters()]
    try:
        for parameter, _ in flags:
            parameter.requires_grad_(False)
        yield
    finally:
        for parameter, flag in flags:
            parameter.requires_grad_(flag)


def _mark_removed(scores: Scores, removed: Mapping[AttentionSite, list[int]]) -> Scores:
    for site, heads in removed.items():
        for head in heads:
            scores[site][head] = float("nan")
    return scores


def normalize_per_layer(scores: Scores) -> Scores:
    """Divide each site's scores by their ℓ2 norm (NaNs ignored), as Michel et al. do."""
    normalized = {}
    for site, values in scores.items():
        present = values[~torch.isnan(values)]
        norm = float(torch.linalg.vector_norm(present)) if present.numel() else 0.0
        normalized[site] = values / norm if norm > 0 else values.clone()
    return normalized


def gradient_importance(
    objective: Objective,
    layout: Mapping[AttentionSite, int],
    removed: Mapping[AttentionSite, list[int]] | None = None,
    *,
    normalize: bool = True,
    progress: Callable[[], None] | None = None,
) -> Scores:
    """``Σ_batches |∂L/∂ξₕ|`` with ξ = 1 for present heads and ξ = 0 for removed ones.

    As in Michel et al.'s reference implementation, removed heads are
    differentiated too (at ξ = 0: how much restoring them would change the
    loss) and count in their layer's normalisation, which keeps the scale of a
    layer's scores steady as it loses heads; then they are marked NaN.
    """
    removed = normalize_removed(removed or {})
    loaded = objective.loaded
    device = loaded.device
    sites = sorted(layout)
    keep = {site: values.to(device) for site, values in keep_matrix(layout, removed).items()}
    accumulated = {site: torch.zeros(layout[site], dtype=torch.float64) for site in sites}
    with frozen_parameters(loaded.model), torch.enable_grad():
        for index in objective.local_indices():  # this process's share in a data-parallel run
            # ξ: one leaf variable per site, [h], 1 for present heads and 0 for removed ones;
            # fresh for every batch so that each backward pass owns its graph.
            xi = {site: keep[site].clone().requires_grad_(True) for site in sites}
            context = loaded.context(head_mask=HeadMask(xi))
            losses = objective.gradient_losses(index, context)
            for number, loss in enumerate(losses):
                grads = torch.autograd.grad(
                    loss, [xi[site] for site in sites], retain_graph=number < len(losses) - 1, allow_unused=True
                )
                for site, grad in zip(sites, grads):
                    if grad is not None:
                        accumulated[site] += grad.detach().abs().double().cpu() / len(losses)
            if progress is not None:
                progress()
    # Σ over every process's batches (float64), before the per-layer normalisation
    accumulated = dict(zip(sites, objective.parallel.sum([accumulated[site] for site in sites])))
    if normalize:
        accumulated = normalize_per_layer(accumulated)
    return _mark_removed(accumulated, removed)


def ablation_importance(
    objective: Objective,
    layout: Mapping[AttentionSite, int],
    removed: Mapping[AttentionSite, list[int]] | None = None,
    *,
    progress: Callable[[], None] | None = None,
) -> Scores:
    """Loss increase when each remaining head is masked on top of ``removed`` (one pass per head)."""
    removed = normalize_removed(removed or {})
    base = objective.loss(removal_mask(layout, removed))
    scores = {site: torch.full((heads,), float("nan"), dtype=torch.float64) for site, heads in layout.items()}
    for site, heads in sorted(layout.items()):
        for head in range(heads):
            if head in removed.get(site, ()):
                continue
            mask = removal_mask(layout, merge_removed(removed, {site: [head]}))
            scores[site][head] = objective.loss(mask) - base
            if progress is not None:
                progress()
    return scores


#: the attnviz.stats statistic behind each proxy, and its sign (importance = sign × statistic)
PROXY_STATISTICS = {"entropy": ("normalized_entropy", -1.0), "confidence": ("max_weight", 1.0)}


def proxy_importance(
    objective: Objective,
    layout: Mapping[AttentionSite, int],
    proxy: str,
    removed: Mapping[AttentionSite, list[int]] | None = None,
) -> Scores:
    """``−normalized entropy`` or ``confidence`` (mean maximum weight) of each head, from :mod:`attnviz.stats`.

    Entropy is normalised by ``ln`` of the number of visible keys so that
    heads of causal models compare fairly across positions and layers. The
    statistics are those of the unpruned model on the scoring data, so
    re-scoring in an iterative run gives the same ranking as one-shot.
    """
    from attnviz.stats import compute_statistics

    statistic, sign = PROXY_STATISTICS[proxy]
    statistics = compute_statistics(
        objective.loaded, batches=objective.batches, progress=False, parallel=objective.parallel
    )
    scores = {}
    for stack in sorted({site.stack for site in layout}):
        matrix = statistics.matrix(statistic, stack)  # [layer, head], NaN past a layer's head count
        for site, heads in layout.items():
            if site.stack == stack:
                values = matrix[site.layer, :heads].double()  # [h]
                scores[site] = torch.nan_to_num(sign * values, nan=0.0)  # heads never scored count as 0
    return _mark_removed(scores, normalize_removed(removed or {}))


def random_importance(
    layout: Mapping[AttentionSite, int], seed: int, removed: Mapping[AttentionSite, list[int]] | None = None
) -> Scores:
    """Seeded uniform scores in ``[0, 1)``: the same seed gives the same ranking."""
    generator = torch.Generator().manual_seed(seed)
    scores = {site: torch.rand(layout[site], generator=generator, dtype=torch.float64) for site in sorted(layout)}
    return _mark_removed(scores, normalize_removed(removed or {}))


def compute_importance(
    method: str,
    objective: Objective,
    layout: Mapping[AttentionSite, int],
    removed: RemovedHeads | None = None,
    *,
    seed: int = 0,
    normalize: bool | None = None,
    progress: Callable[[], None] | None = None,
) -> HeadImportance:
    """Score every head with ``method`` (one of :data:`METHODS`), with ``removed`` already masked.

    ``normalize``: per-layer ℓ2 normalisation; ``None`` means the method's default
    (on for ``gradient``, as in Michel et al.; off for the others).
    """
    if method not in METHODS:
        raise InputError(f"unknown importance method {method!r}: use one of {', '.join(METHODS)}")
    if normalize is None:
        normalize = method == "gradient"
    if method == "gradient":
        scores = gradient_importance(objective, layout, removed, normalize=normalize, progress=progress)
    elif method == "ablation":
        scores = ablation_importance(objective, layout, removed, progress=progress)
    elif method in ("entropy", "confidence"):
        scores = proxy_importance(objective, layout, method, removed)
    else:
        scores = random_importance(layout, seed, removed)
    if normalize and method != "gradient":
        scores = normalize_per_layer(scores)
    return HeadImportance(method=method, scores=scores, normalized=normalize)


def scoring_passes(method: str, objective: Objective, layout: Mapping[AttentionSite, int], removed_count: int) -> int:
    """How many progress steps :func:`compute_importance` reports (for sizing a progress bar)."""
    if method == "gradient":
        return len(objective.local_indices())
    if method == "ablation":
        return sum(layout.values()) - removed_count
    return 0
