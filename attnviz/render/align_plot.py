"""The layer × head picture of alignment error rates (from :class:`attnviz.heads.alignment.AlignmentResult`)."""

from __future__ import annotations

from torch import Tensor


def alignment_grid_figure(grid: Tensor, *, title: str):
    """A heatmap of ``grid`` ``[layer, head + 1]`` (AER; last column the layer mean), values in the cells.

    Low AER (good alignment) is bright, so the heads that align stand out.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    data = grid.detach().float().cpu().numpy()  # [layer, head + 1]
    layers, columns = data.shape
    # constrained layout keeps the colour bar's label inside the figure; two short lines fit a short figure
    fig, ax = plt.subplots(figsize=(max(4.5, 0.8 * columns + 2.4), max(3.0, 0.6 * layers + 1.6)), layout="constrained")
    image = ax.imshow(data, cmap="viridis_r", vmin=0.0, vmax=1.0, aspect="auto")
    for (layer, column), value in np.ndenumerate(data):
        if np.isnan(value):
            continue
        ax.text(
            column,
            layer,
            f"{value:.2f}",
            ha="center",
            va="center",
            fontsize=8,
            color="white" if value > 0.55 else "black",
        )
    ax.axvline(columns - 1.5, color="white", linewidth=3)  # separates the heads from the layer mean
    ax.set_xticks(range(columns))
    ax.set_xticklabels([str(h) for h in range(columns - 1)] + ["mean"])
    ax.set_yticks(range(layers))
    ax.set_xlabel("cross-attention head")
    ax.set_ylabel("layer")
    colorbar = fig.colorbar(image, ax=ax)
    colorbar.set_label("alignment error rate\n(lower is better)")
    ax.set_title(title, fontsize=10)
    return fig


def alignment_table(result, *, limit: int | None = None):
    """A rich table of an :class:`~attnviz.heads.alignment.AlignmentResult`, best heads first."""
    from rich.table import Table

    table = Table(
        title=f"{result.model} · cross-attention alignment on {result.num_pairs} pairs (best first)",
        caption=f"AER: argmax links; ≥{result.threshold:g}: links at or above the weight threshold; "
        f"rows: the decoder step {'predicting' if result.rows == 'predicting' else 'reading'} each target word",
    )
    for name in ("layer", "head", "AER", f"AER ≥{result.threshold:g}", "precision", "recall"):
        table.add_column(name, justify="right")
    for entry in result.heads[:limit]:
        table.add_row(
            str(entry.layer),
            "mean" if entry.head is None else str(entry.head),
            f"{entry.aer:.3f}",
            f"{entry.threshold_aer:.3f}",
            f"{entry.precision:.3f}",
            f"{entry.recall:.3f}",
        )
    return table
