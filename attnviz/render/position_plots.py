"""The figure of statistics by query position: one panel per metric, one line per layer.

x is the start of each bucket of query positions, y the mean over the layer's heads of the
metric in that bucket; layers are coloured from first to last (colour bar), and the mean over
every head is drawn in black. Several models give one row of panels each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from attnviz.render.figures import colormap, subplots
from attnviz.render.stats_plots import _short_name

#: panel titles (and units) of each metric of attnviz.stats.by_position.POSITION_METRICS
PANEL_TITLES = {
    "sink_mass": "sink mass (weight on the first token)",
    "entropy": "entropy (nats)",
    "mean_distance": "mean attention distance (tokens)",
    "recent_share": "recent share (|query − key| ≤ {reach})",
}


def position_figure(all_stats: Sequence, *, stack: str = "self"):
    """The figure of ``stats.by_position`` of each :class:`~attnviz.stats.HeadStatistics` in ``all_stats``."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    from attnviz.stats.by_position import POSITION_METRICS

    rows = len(all_stats)
    columns = len(POSITION_METRICS)
    fig, axes = subplots(rows, columns, figsize=(4.2 * columns, 3.3 * rows + 0.5), squeeze=False, layout="constrained")
    cmap = colormap("viridis")
    num_layers = max(stats.by_position.layers(stack)[-1].layer + 1 for stats in all_stats)  # the model's numbers
    for row, stats in enumerate(all_stats):
        positions = stats.by_position
        starts = positions.bucket_starts
        one_point = len(starts) == 1  # a line needs two buckets: draw markers instead
        for column, name in enumerate(POSITION_METRICS):
            ax = axes[row, column]
            means = positions.layer_means(name, stack).float()  # [layer, B]
            for layer in range(means.shape[0]):
                colour = cmap(layer / max(1, num_layers - 1))
                ax.plot(
                    starts,
                    means[layer].tolist(),
                    color=colour,
                    linewidth=1.0,
                    alpha=0.85,
                    marker="o" if one_point else None,
                )
            overall = positions.curves(name, stack).float().flatten(0, 1).nanmean(0)  # [B] over every head
            ax.plot(starts, overall.tolist(), color="black", linewidth=2.0, marker="o" if one_point else None)
            title = PANEL_TITLES[name].format(reach=positions.recent_tokens - 1)
            ax.set_title(title if rows == 1 else f"{_short_name(stats.model)}: {title}", fontsize=9)
            ax.set_xlabel(f"query position (bucket start; {positions.bucket_size} positions per bucket)", fontsize=7)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if name in ("sink_mass", "recent_share"):
                ax.set_ylim(-0.02, 1.02)
            else:
                finite = means[~means.isnan()]
                if finite.numel() == 0 or math.isclose(float(finite.max()), 0.0):
                    ax.set_ylim(-0.02, 1.0)
    scalar = ScalarMappable(cmap=cmap, norm=Normalize(0, max(1, num_layers - 1)))
    colorbar = fig.colorbar(
        scalar,
        ax=axes.ravel().tolist(),
        fraction=0.015,
        pad=0.01,
        label="layer (mean over its heads; black: all heads)",
    )
    if num_layers <= 12:
        colorbar.set_ticks(list(range(num_layers)))
    stack_note = "" if stack == "self" else f" · {stack} attention"
    fig.suptitle(f"Attention along the input, by query position{stack_note}", fontsize=11)
    return fig
