"""Figures of head functions: a layer × head panel per probe score, head similarity, attention rollout.

Everything here draws from tensors; nothing loads a model.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from attnviz.common.wording import plural
from attnviz.render.figures import colormap, new_figure
from attnviz.render.heatmap import FIGURE_SUFFIXES, HeatmapPanel, causal_visibility, render_heatmaps, save_figure  # noqa: F401
from attnviz.render.stats_plots import statistics_figure

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
    from matplotlib.lines import Line2D

    from attnviz.heads.labels import LABELS, SCORE_NAMES

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
            (head, site.layer)
            for site in result.layers(stack)
            for head in range(result.scores[site].shape[1])
            if LABELS[name] in result.labels(site, head)
        ]
        if not where:
            continue
        marker, colour = LABEL_MARKERS[name]
        xs, ys = zip(*where)
        ax.scatter(xs, ys, marker=marker, s=40, linewidths=1.4, facecolors="none", edgecolors=colour, path_effects=halo)
        handles.append(
            Line2D([], [], linestyle="none", marker=marker, color=colour, markerfacecolor="none", label=LABELS[name])
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
    import numpy as np
    from scipy.cluster.hierarchy import dendrogram, leaves_list, linkage
    from scipy.spatial.distance import squareform

    values = divergence.double().cpu().numpy()  # [n, n]
    distance = np.sqrt(np.clip((values + values.T) / 2, 0.0, None))
    np.fill_diagonal(distance, 0.0)
    order = linkage(squareform(distance, checks=False), method="average")
    leaves = leaves_list(order)  # heads in dendrogram order
    layers = [layer for _, layer, _ in heads]
    top = max(1, max(layers))
    cmap = colormap("viridis")
    layer_colours = np.array([cmap(layer / top) for layer in layers])  # [n, 4] RGBA
    names = [f"L{layer}H{head}" if stack in ("self",) else f"{stack[0]}{layer}.{head}" for stack, layer, head in heads]
    size = min(13.0, max(8.0, 0.03 * len(heads) + 6.0))  # inches; the figure is 1.75 × as wide
    figure = new_figure(figsize=(size * 1.75, size))
    # a clustered heatmap drawn by hand (seaborn's clustermap would go through pyplot): dendrogram on top,
    # each head's layer as a colour strip on the top and left, the reordered divergences below
    tree = figure.add_axes([0.085, 0.79, 0.45, 0.09])
    dendrogram(order, ax=tree, no_labels=True, color_threshold=0, above_threshold_color="#555555")
    tree.set_axis_off()
    top_strip = figure.add_axes([0.085, 0.77, 0.45, 0.015])
    top_strip.imshow(layer_colours[leaves][None], aspect="auto", interpolation="nearest")  # [1, n, 4]
    top_strip.set_axis_off()
    left_strip = figure.add_axes([0.068, 0.09, 0.012, 0.675])
    left_strip.imshow(layer_colours[leaves][:, None], aspect="auto", interpolation="nearest")  # [n, 1, 4]
    left_strip.set_axis_off()
    heatmap = figure.add_axes([0.085, 0.09, 0.45, 0.675])
    image = heatmap.imshow(
        values[np.ix_(leaves, leaves)], cmap="magma_r", vmin=0.0, aspect="auto", interpolation="nearest"
    )
    step = 1 if len(heads) <= 80 else max(1, len(heads) // 60)
    ticks = list(range(0, len(heads), step))
    heatmap.set_xticks(ticks, [names[leaves[i]] for i in ticks], rotation=90)
    heatmap.set_yticks(ticks, [names[leaves[i]] for i in ticks])
    heatmap.yaxis.tick_right()
    heatmap.tick_params(labelsize=6 if len(heads) > 40 else 8)
    figure.colorbar(image, cax=figure.add_axes([0.02, 0.8, 0.015, 0.12]), label="JS (nats)")
    mds = figure.add_axes([0.63, 0.12, 0.34, 0.34 * 1.75 * 0.9])
    points = embedding.float().cpu().numpy()
    scatter = mds.scatter(
        points[:, 0], points[:, 1], c=layers, cmap=cmap, vmin=0, vmax=top, s=22, edgecolors="k", linewidths=0.3
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
    title = f"{capture.model} · {what} over {plural(capture.num_layers(stack), 'layer')}" + (
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
