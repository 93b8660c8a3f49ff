"""Figures of ``attnviz diff``: a divergence grid for two models, A | B | B − A for two inputs, lines across checkpoints.

Rendering only. Cell values are written into small grids (two decimals; divergences in 10⁻³ nats),
so a figure can be read without a colour bar and checked by reading its SVG text back.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnviz.compare.checkpoints import CheckpointComparison
from attnviz.compare.inputs import InputComparison
from attnviz.compare.result import ModelComparison
from attnviz.render.figures import colormap, subplots, titled

#: cells per panel up to which values are written into the cells
ANNOTATE_CELLS = 400
#: the diverging colour map of differences (blue: B lower, red: B higher), centred on 0
DIVERGING = "RdBu_r"


def _annotate(ax, values: Tensor, scale: float, top: float) -> None:
    """Write ``values × scale`` (two decimals) into each finite cell; dark text on light cells."""
    for row in range(values.shape[0]):
        for column in range(values.shape[1]):
            value = float(values[row, column])
            if not math.isnan(value):
                light = top > 0 and value / top > 0.6
                colour = "black" if light else "white"
                ax.text(column, row, f"{value * scale:.2f}", ha="center", va="center", fontsize=6, color=colour)


def divergence_figure(comparison: ModelComparison, *, stack: str | None = None):
    """JS divergence and total variation by layer × head (original numbers); A / B mark heads in one model only."""
    stack = stack or comparison.stacks[0]
    panels = [("js_divergence", "JS divergence (10⁻³ nats)"), ("total_variation", "total variation (10⁻³)")]
    first = comparison.matrix("js_divergence", stack)  # [layer, head]
    layers, heads = first.shape
    fig, axes = subplots(1, 2, figsize=(2 * (1.6 + 0.42 * heads), 1.4 + 0.32 * layers), squeeze=False)
    status = {(h.site.layer, h.head): h.status for h in comparison.heads if h.site.stack == stack}
    sites = comparison.sites(stack)
    for ax, (measure, label) in zip(axes.flat, panels):
        values = comparison.matrix(measure, stack)  # [layer, head]
        finite = values[~values.isnan()]
        top = max(float(finite.max()) if finite.numel() else 0.0, 1e-12)
        cmap = colormap("magma").with_extremes(bad="#d9d9d9")
        image = ax.imshow(
            (values * 1000).numpy(), aspect="auto", cmap=cmap, vmin=0.0, vmax=top * 1000, interpolation="nearest"
        )
        fig.colorbar(image, ax=ax, fraction=0.08, pad=0.03)
        if values.numel() <= ANNOTATE_CELLS:
            _annotate(ax, values, 1000, top)
        for row, site in enumerate(sites):
            for head in range(heads):
                mark = {"only_a": "A", "only_b": "B"}.get(status.get((site.layer, head), ""))
                if mark:
                    ax.text(head, row, mark, ha="center", va="center", fontsize=7, color="#444444", fontweight="bold")
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.set_xticks(range(0, heads, max(1, heads // 16)))
        ax.set_yticks(range(layers))
        ax.set_yticklabels([str(site.layer) for site in sites])
        ax.tick_params(labelsize=7)
    return titled(fig, f"{comparison.model_b} (B) against {comparison.model_a} (A)", fontsize=11, top=0.93)


def inputs_figure(comparison: InputComparison, *, stack: str = "self", layer: int = 0, head: int = 0):
    """One head's pattern on input A, on input B, and B − A (diverging, centred on 0), side by side."""
    from matplotlib.colors import TwoSlopeNorm

    from attnviz.core import AttentionSite

    site = AttentionSite(stack, layer)
    a = comparison.patterns_a[site][head]  # [n, n]
    b = comparison.patterns_b[site][head]  # [n, n]
    difference = b - a  # [n, n]
    n = a.shape[0]
    side = 1.2 + 0.36 * n
    fig, axes = subplots(1, 3, figsize=(3 * side + 1.5, side + 0.8), squeeze=False)
    largest = max(float(difference.abs().max()), 1e-9)
    top = max(float(a.max()), float(b.max()), 1e-9)
    # each side is labelled with its own tokens; the difference with both where they differ ("are/is")
    both = [x if x == y else f"{x}/{y}" for x, y in zip(comparison.labels_a, comparison.labels_b, strict=True)]
    panels = (
        (f"A: {comparison.text_a}", a, colormap("magma"), None, comparison.labels_a),
        (f"B: {comparison.text_b}", b, colormap("magma"), None, comparison.labels_b),
        ("B − A", difference, colormap(DIVERGING), TwoSlopeNorm(0.0, -largest, largest), both),
    )
    for ax, (title, values, cmap, norm, labels) in zip(axes.flat, panels):
        extra = {"norm": norm} if norm is not None else {"vmin": 0.0, "vmax": top}
        image = ax.imshow(values.numpy(), cmap=cmap, interpolation="nearest", **extra)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.03)
        if values.numel() <= ANNOTATE_CELLS:
            _annotate_plain(ax, values, norm is not None, largest if norm is not None else top)
        ax.set_title(_short(title), fontsize=9)
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_xticklabels(labels, rotation=90, fontsize=7)
        ax.set_yticklabels(labels, fontsize=7)
    js, _ = comparison.query_divergence(stack, layer)
    return titled(
        fig,
        f"{comparison.model} · {stack} layer {layer} head {head} · aligned by {comparison.alignment} · "
        f"mean JS {float(js[head].mean()):.4f} nats",
        fontsize=10,
        top=0.94,
    )


def _annotate_plain(ax, values: Tensor, diverging: bool, top: float) -> None:
    for row in range(values.shape[0]):
        for column in range(values.shape[1]):
            value = float(values[row, column])
            light = (abs(value) / top < 0.6) if diverging else (value / top > 0.6)
            ax.text(
                column, row, f"{value:.2f}", ha="center", va="center", fontsize=6, color="black" if light else "white"
            )


def checkpoints_figure(comparison: CheckpointComparison, *, stack: str | None = None, measure: str = "js_divergence"):
    """A line per head: ``measure`` from the first checkpoint across checkpoints (colour: layer); beside it the
    consecutive pairs' layer means."""
    paths = comparison.trajectories(measure, stack)  # [checkpoint, layer, head]
    checkpoints, layers, heads = paths.shape
    fig, (left, right) = subplots(1, 2, figsize=(12, 4.6))
    cmap = colormap("viridis")
    steps = list(range(checkpoints))
    for layer in range(layers):
        colour = cmap(layer / max(1, layers - 1))
        for head in range(heads):
            line = paths[:, layer, head]
            if not line.isnan().all():
                left.plot(steps, line.numpy(), color=colour, linewidth=0.8, alpha=0.7)
    left.set_title(f"{measure.replace('_', ' ')} from {comparison.models[0]}, a line per head", fontsize=10)
    left.set_ylabel("nats" if measure == "js_divergence" else measure)
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    sm = ScalarMappable(cmap=cmap, norm=Normalize(0, max(1, layers - 1)))
    fig.colorbar(sm, ax=left, label="layer")
    for layer in range(layers):
        means = [float(torch.nanmean(r.matrix(measure, stack)[layer])) for r in comparison.consecutive]
        right.plot(steps[1:], means, marker="o", color=cmap(layer / max(1, layers - 1)), label=f"layer {layer}")
    right.set_title("consecutive checkpoints: layer mean", fontsize=10)
    for ax in (left, right):
        ax.set_xticks(steps)
        ax.set_xticklabels([_short(name, 18) for name in comparison.models], rotation=30, ha="right", fontsize=7)
    if layers <= 12:
        right.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    return fig


def _short(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
