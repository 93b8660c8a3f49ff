"""Figures of head functions: a layer × head panel per probe score, head similarity, attention rollout.

Everything here draws from tensors; nothing loads a model.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from attnviz.render.heatmap import FIGURE_SUFFIXES, HeatmapPanel, causal_visibility, render_heatmaps, save_figure  # noqa: F401
from attnviz.render.stats_plots import _pyplot, statistics_figure

#: How each probe label is marked on its score's panel: (marker, colour).
LABEL_MARKERS: dict[str, tuple[str, str]] = {
    "induction": ("*", "#1f77b4"),
    "duplicate_token": ("D", "#2ca02c"),
    "previous_token": ("<", "#ff7f0e"),
    "next_token": (">", "#d62728"),
}


def probe_scores_figure(result, *, stack: str = "self"):
    """One layer × head heatmap per probe score of a :class:`~attnviz.heads.HeadFunctions`; labelled heads marked.

    ``next_token`` is left out on causal stacks (no query can see its next token).
    """
    from matplotlib import patheffects

    from attnviz.heads.labels import LABELS, SCORE_NAMES

    plt = _pyplot()
    matrices = {}
    for name in SCORE_NAMES:
        matrix = result.matrix(name, stack)  # [layer, head]
        if not bool(matrix.isnan().all()):
            matrices[name] = matrix
    probe = result.probe
    title = f"{result.model} · {stack} attention · probe scores ({probe.sequences} × 2 × {probe.length} random tokens)"
    figure = statistics_figure(matrices, None, title=title, columns=len(matrices))
    halo = [patheffects.withStroke(linewidth=3.2, foreground="white")]
    handles = []
    for ax, name in zip(figure.axes, matrices):  # the panels come first, their colour bars after
        where = [
            (head, row)
            for row, site in enumerate(result.layers(stack))
            for head in range(result.scores[site].shape[1])
            if LABELS[name] in result.labels(site, head)
        ]
        if not where:
            continue
        marker, colour = LABEL_MARKERS[name]
        xs, ys = zip(*where)
        ax.scatter(xs, ys, marker=marker, s=40, linewidths=1.4, facecolors="none", edgecolors=colour, path_effects=halo)
        handles.append(
            plt.Line2D(
                [], [], linestyle="none", marker=marker, color=colour, markerfacecolor="none", label=LABELS[name]
            )
        )
    if handles:
        figure.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=9)
        figure.tight_layout(rect=(0, 0.05, 1, 0.97))
    return figure


def similarity_figure(divergence: Tensor, heads: Sequence[tuple[str, int, int]], embedding: Tensor, *, title: str = ""):
    """Clustered heatmap of the mean JS divergence between heads (coloured by layer), and its 2-D MDS map.

    Args:
        divergence: ``[n, n]`` symmetric mean JS divergence (nats), zero diagonal.
        heads: ``(stack, layer, head)`` of each row.
        embedding: ``[n, 2]`` MDS coordinates of the heads.
    """
    plt = _pyplot()
    import numpy as np
    import seaborn as sns
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform

    values = divergence.double().cpu().numpy()
    distance = np.sqrt(np.clip((values + values.T) / 2, 0.0, None))
    np.fill_diagonal(distance, 0.0)
    order = linkage(squareform(distance, checks=False), method="average")
    layers = [layer for _, layer, _ in heads]
    top = max(1, max(layers))
    colormap = plt.get_cmap("viridis")
    layer_colours = [colormap(layer / top) for layer in layers]
    names = [f"L{layer}H{head}" if stack in ("self",) else f"{stack[0]}{layer}.{head}" for stack, layer, head in heads]
    import pandas as pd

    frame = pd.DataFrame(values, index=names, columns=names)
    size = min(13.0, max(8.0, 0.03 * len(heads) + 6.0))  # inches; the figure is 1.75 × as wide
    grid = sns.clustermap(
        frame,
        row_linkage=order,
        col_linkage=order,
        row_colors=layer_colours,
        col_colors=layer_colours,
        cmap="magma_r",
        vmin=0.0,
        figsize=(size * 1.75, size),
        xticklabels=True if len(heads) <= 80 else max(1, len(heads) // 60),
        yticklabels=True if len(heads) <= 80 else max(1, len(heads) // 60),
        cbar_kws={"label": "JS (nats)"},
        cbar_pos=(0.03, 0.8, 0.025, 0.14),
        dendrogram_ratio=0.12,
        colors_ratio=0.02,
    )
    figure = grid.figure
    for ax in figure.axes:  # squeeze the clustermap into the left 57 % of the figure, below the title
        box = ax.get_position()
        ax.set_position([box.x0 * 0.57, box.y0 * 0.92, box.width * 0.57, box.height * 0.92])
    for ax in (grid.ax_heatmap,):
        ax.tick_params(labelsize=6 if len(heads) > 40 else 8)
    mds = figure.add_axes([0.63, 0.12, 0.34, 0.34 * 1.75 * 0.9])
    points = embedding.float().cpu().numpy()
    scatter = mds.scatter(
        points[:, 0], points[:, 1], c=layers, cmap=colormap, vmin=0, vmax=top, s=22, edgecolors="k", linewidths=0.3
    )
    if len(heads) <= 60:
        for (x, y), name in zip(points, names):
            mds.annotate(name, (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points")
    mds.set_title("MDS of √JS divergence (classical)", fontsize=10)
    mds.set_xlabel("dimension 1", fontsize=8)
    mds.set_ylabel("dimension 2", fontsize=8)
    mds.tick_params(labelsize=7)
    mds.set_aspect("equal", adjustable="datalim")
    colorbar = figure.colorbar(scatter, ax=mds, fraction=0.05, pad=0.02)
    colorbar.set_label("layer", fontsize=8)
    if title:
        figure.suptitle(title, fontsize=13)
    return figure


def head_similarity_figure(similarity, *, model: str = ""):
    """:func:`similarity_figure` of a :class:`~attnviz.heads.HeadSimilarity`."""
    from attnviz.heads.similarity import embedding_2d

    where = "probe sequences" if similarity.source == "probes" else "corpus examples"
    title = (
        f"{model} · head similarity: mean Jensen–Shannon divergence per query over {similarity.examples} {where} "
        f"(first {similarity.max_tokens} tokens)"
    )
    return similarity_figure(similarity.divergence, similarity.heads, embedding_2d(similarity.divergence), title=title)


def rollout_figure(
    matrix: Tensor,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    *,
    causal: bool,
    title: str,
    annotate: bool | None = None,
):
    """One heatmap of a ``[query, key]`` rollout matrix (the future masked in causal models)."""
    visible = causal_visibility(*matrix.shape) if causal else None
    panel = HeatmapPanel(pattern=matrix, title=title, visible=visible)
    return render_heatmaps([panel], list(query_labels), list(key_labels), title=title, annotate=annotate)


__all__ = [
    "capture_rollout_figure",
    "head_similarity_figure",
    "probe_scores_figure",
    "rollout_figure",
    "save_figure",
    "similarity_figure",
]


def capture_rollout_figure(capture, *, stack: str | None = None, annotate: bool | None = None, flow: bool = False):
    """The rollout (or, with ``flow``, attention-flow) heatmap of an :class:`~attnviz.captures.attention_capture.AttentionCapture`.

    A stored ``rollout`` tensor is used when the capture has one.
    """
    from attnviz.common.tokens import display_token
    from attnviz.heads.propagation import attention_flow, rollout, rollout_stack

    stack = stack or rollout_stack(capture)
    if flow:
        matrix = attention_flow(capture, stack)  # [query, key]
    else:
        stored = capture.extras.get("rollout") if stack == rollout_stack(capture) else None
        matrix = stored if stored is not None else rollout(capture, stack)  # [query, key]
    query_tokens, key_tokens = capture.axis_tokens(stack)
    what = "attention flow" if flow else "attention rollout"
    title = f"{capture.model} · {what} over {capture.num_layers(stack)} layers" + (
        f" ({stack})" if stack != "self" else ""
    )
    return rollout_figure(
        matrix,
        [display_token(t) for t in query_tokens],
        [display_token(t) for t in key_tokens],
        causal=capture.is_causal(stack),
        title=title,
        annotate=annotate,
    )
