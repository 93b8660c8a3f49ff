"""Figures of per-head statistics: layer × head heatmaps, and their evolution across checkpoints.

Everything here draws from ``[layer, head]`` tensors (and flags); nothing loads a model.
:func:`statistics_figure` and :func:`evolution_figure` take plain tensors;
:func:`head_statistics_figure` and :func:`head_statistics_evolution_figure` unpack
:class:`~attnviz.stats.HeadStatistics` / :class:`~attnviz.stats.Detection` for them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from attnviz.common.wording import plural
from attnviz.render.figures import colormap, subplots
from attnviz.render.heatmap import FIGURE_SUFFIXES, save_figure  # noqa: F401  (re-exported for the CLI)
from attnviz.stats.tables import shown_statistics

#: How each flag is drawn on the heatmaps: (marker, colour, legend text).
FLAG_MARKERS: dict[str, tuple[str, str, str]] = {
    "collapsed": ("x", "#d62728", "collapsed"),
    "unfocused": ("o", "#1f77b4", "unfocused"),
    "diagonal": ("s", "#2ca02c", "diagonal"),
    "previous-token": ("<", "#ff7f0e", "previous-token"),
    "first-token-sink": ("v", "#9467bd", "first-token sink"),
    "special-token": ("D", "#8c564b", "special-token"),
    "local": ("+", "#e377c2", "local"),
}

#: Which flags each statistic's panel marks: the problem flags on the entropy-like panels,
#: and the pattern label that statistic defines on its own panel.
PANEL_FLAGS: dict[str, tuple[str, ...]] = {
    "entropy": ("collapsed", "unfocused"),
    "normalized_entropy": ("collapsed", "unfocused"),
    "max_weight": ("collapsed", "unfocused"),
    "mean_distance": ("local",),
    "normalized_distance": ("local",),
    "diagonal": ("diagonal",),
    "previous_token": ("previous-token",),
    "local_ratio": ("local",),
    "first_token": ("first-token-sink",),
    "special_tokens": ("special-token",),
}

#: Why a statistic can be exactly 0 for every head: said inside its panel, which is otherwise one flat colour.
#: (Attention weights are softmax outputs, never exactly 0, so a mean of exactly 0 means no such key was seen.)
ZERO_PANEL_REASONS: dict[str, str] = {
    "special_tokens": "no special tokens\n([CLS], [SEP], BOS, EOS)\namong these texts' keys",
    "first_token": "no query saw a first token\nother than itself",
    "previous_token": "no query had a previous token\n(one-token texts)",
    "sink_share": "the model has no\nlearned attention sinks",
}

#: Statistics bounded by [0, 1] share a fixed colour scale; the others scale to their maximum.
_UNBOUNDED = ("entropy", "mean_distance")


def statistics_figure(
    matrices: Mapping[str, Tensor],
    flags: Mapping[str, Tensor] | None = None,
    *,
    title: str = "",
    columns: int = 5,
):
    """One heatmap per statistic (rows: layers, columns: heads), flagged heads marked.

    Args:
        matrices: ``{statistic: [layer, head]}`` means; NaN cells (missing heads) are left blank.
        flags: ``{flag: [layer, head] bool}``; each panel marks the flags of :data:`PANEL_FLAGS`.
        title: figure title.
        columns: panels per row.
    """
    from matplotlib import patheffects
    from matplotlib.lines import Line2D

    names = list(matrices)
    layers, heads = next(iter(matrices.values())).shape
    rows = math.ceil(len(names) / columns)
    panel_width = 1.2 + 0.32 * heads
    panel_height = 0.9 + 0.22 * layers
    fig, axes = subplots(rows, columns, figsize=(panel_width * columns, panel_height * rows + 0.9), squeeze=False)
    used_flags: set[str] = set()
    for ax, name in zip(axes.flat, names):
        values = matrices[name].detach().float().cpu()  # [layer, head]
        finite = values[~values.isnan()]
        top = 1.0 if name not in _UNBOUNDED else max(float(finite.max()) if finite.numel() else 1.0, 1e-6)
        cmap = colormap("magma").with_extremes(bad="#d9d9d9")  # NaN: a head the layer lacks
        image = ax.imshow(values.numpy(), aspect="auto", cmap=cmap, vmin=0.0, vmax=top, interpolation="nearest")
        fig.colorbar(image, ax=ax, fraction=0.08, pad=0.03)
        ax.set_title(name.replace("_", " "), fontsize=10)
        _explain_flat_panel(ax, name, finite)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.set_xticks(range(0, heads, max(1, heads // 12)))
        ax.set_yticks(range(0, layers, max(1, math.ceil(layers / 16))))
        ax.tick_params(labelsize=7)
        for flag in PANEL_FLAGS.get(name, ()):
            if flags is None or flag not in flags:
                continue
            where = flags[flag].nonzero().tolist()  # [[layer, head], ...]
            if not where:
                continue
            marker, colour, _ = FLAG_MARKERS[flag]
            ys, xs = zip(*where)
            halo = [patheffects.withStroke(linewidth=3.2, foreground="white")]  # visible on dark and bright cells
            if marker in ("x", "+"):  # line markers have no face
                ax.scatter(xs, ys, marker=marker, s=34, linewidths=1.6, color=colour, path_effects=halo)
            else:
                ax.scatter(
                    xs, ys, marker=marker, s=34, linewidths=1.6, facecolors="none", edgecolors=colour, path_effects=halo
                )
            used_flags.add(flag)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    if used_flags:
        handles = [
            Line2D(
                [],
                [],
                linestyle="none",
                marker=FLAG_MARKERS[f][0],
                color=FLAG_MARKERS[f][1],
                markerfacecolor="none",
                markersize=7,
                label=FLAG_MARKERS[f][2],
            )
            for f in FLAG_MARKERS
            if f in used_flags
        ]
        fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0.05 if used_flags else 0, 1, 0.97 if title else 1))
    return fig


def flat_panel_note(name: str, finite: Tensor) -> str | None:
    """What a panel of one flat colour means, or None when its values differ.

    All values missing: said so; all exactly 0: the reason from :data:`ZERO_PANEL_REASONS` where one is
    known; any other single value: that value (every head alike is a finding, not a drawing error).
    """
    if finite.numel() == 0:
        return "no values:\nno head of this panel\nsaw a query"
    low, high = float(finite.min()), float(finite.max())
    if high - low > 1e-9 * max(1.0, abs(high)):
        return None
    if high == 0.0:
        return "0 for every head:\n" + ZERO_PANEL_REASONS.get(name, "no weight of this kind")
    return f"{high:.3g} for every head"


def _explain_flat_panel(ax, name: str, finite: Tensor) -> None:
    """Write :func:`flat_panel_note` across the middle of ``ax`` when the panel is one flat colour."""
    note = flat_panel_note(name, finite)
    if note is not None:
        _write_in_panel(ax, note)


def _write_in_panel(ax, note: str) -> None:
    """``note`` across the middle of ``ax``, boxed so that it reads on any colour, small enough to fit its width."""
    width_points = ax.get_position().width * ax.figure.get_figwidth() * 72
    longest = max(len(line) for line in note.splitlines())
    fontsize = max(5.0, min(9.0, 0.85 * width_points / (0.6 * longest)))  # a character is about 0.6 em wide
    ax.text(
        0.5,
        0.5,
        note,
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=fontsize,
        color="#222222",
        bbox={"boxstyle": "round,pad=0.35", "facecolor": "white", "edgecolor": "#999999", "alpha": 0.92},
    )


def evolution_figure(
    checkpoints: Sequence[str],
    matrices: Sequence[Mapping[str, Tensor]],
    flag_counts: Sequence[Mapping[str, int]] | None = None,
    *,
    title: str = "",
    columns: int = 4,
):
    """How each statistic changes across checkpoints.

    One panel per statistic: x is the checkpoint (in the order given), one line per layer
    (mean over its heads, coloured from first layer to last), and the mean over all heads
    in black. With ``flag_counts`` (``{flag: number of heads}`` per checkpoint) a last panel
    counts flagged heads.

    Args:
        checkpoints: checkpoint names (x tick labels).
        matrices: per checkpoint ``{statistic: [layer, head]}``; the same statistics in each.
    """
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    names = list(matrices[0])
    panels = len(names) + (1 if flag_counts else 0)
    rows = math.ceil(panels / columns)
    # constrained layout keeps rotated checkpoint names clear of the next row's titles
    fig, axes = subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows + 0.6), squeeze=False, layout="constrained")
    x = list(range(len(checkpoints)))
    labels = [_short_name(name) for name in checkpoints]
    cmap = colormap("viridis")
    num_layers = max(m[names[0]].shape[0] for m in matrices)
    for ax, name in zip(axes.flat, names):
        per_checkpoint = [m[name].detach().float().cpu() for m in matrices]  # each [layer, head]
        for layer in range(num_layers):
            ys = [_nanmean(t[layer]) if layer < t.shape[0] else math.nan for t in per_checkpoint]
            ax.plot(x, ys, color=cmap(layer / max(1, num_layers - 1)), linewidth=1.0, alpha=0.8)
        ax.plot(x, [_nanmean(t) for t in per_checkpoint], color="black", linewidth=2.2, marker="o", markersize=4)
        ax.set_title(name.replace("_", " "), fontsize=10)
        ax.set_xticks(x, labels, rotation=30 if len(x) > 3 else 0, ha="right" if len(x) > 3 else "center", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(alpha=0.3)
        every_value = torch.cat([t.flatten() for t in per_checkpoint])  # [all heads of all checkpoints]
        _explain_flat_panel(ax, name, every_value[~every_value.isnan()])
    if flag_counts:
        ax = axes.flat[len(names)]
        flags = [f for f in FLAG_MARKERS if any(counts.get(f, 0) for counts in flag_counts)]
        for flag in flags:
            marker, colour, label = FLAG_MARKERS[flag]
            ax.plot(x, [counts.get(flag, 0) for counts in flag_counts], marker=marker, color=colour, label=label)
        ax.set_title("flagged heads", fontsize=10)
        ax.set_xticks(x, labels, rotation=30 if len(x) > 3 else 0, ha="right" if len(x) > 3 else "center", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(alpha=0.3)
        if flags:
            ax.legend(fontsize=7)
        else:
            _write_in_panel(ax, "no head is flagged\nin any checkpoint")
    for ax in list(axes.flat)[panels:]:
        ax.set_visible(False)
    scalar = ScalarMappable(cmap=cmap, norm=Normalize(0, max(1, num_layers - 1)))
    colorbar = fig.colorbar(
        scalar, ax=axes.ravel().tolist(), fraction=0.015, pad=0.01, label="layer (black: all heads)"
    )
    if num_layers <= 12:  # one tick per layer
        colorbar.set_ticks(list(range(num_layers)))
    if title:
        fig.suptitle(title, fontsize=12)
    return fig


def _nanmean(values: Tensor) -> float:
    finite = values[~values.isnan()]
    return float(finite.mean()) if finite.numel() else math.nan


def _short_name(name: str, limit: int = 24) -> str:
    name = name.rstrip("/").rsplit("/", 1)[-1] or name
    return name if len(name) <= limit else "…" + name[-(limit - 1) :]


# -- from attnviz.stats results -------------------------------------------------------------------


def flag_matrices(stats, detection, stack: str = "self") -> dict[str, Tensor]:
    """``{flag: [layer, head] bool}`` from a :class:`~attnviz.stats.Detection`."""
    layers = stats.layers(stack)
    width = stats.original_matrix(stats.names[0], stack).shape[1]  # original head numbers of a pruned model
    out = {flag: torch.zeros(stats.num_layers(stack), width, dtype=torch.bool) for flag in FLAG_MARKERS}
    for site in layers:
        row = site.layer
        ids = stats.original_ids(site)
        for head, head_flags in enumerate(detection.flags[site]):
            for flag in head_flags:
                if flag in out:
                    out[flag][row, ids[head]] = True
    return out


def head_statistics_figure(stats, detection=None, *, stack: str = "self", names: Sequence[str] | None = None):
    """:func:`statistics_figure` of a :class:`~attnviz.stats.HeadStatistics` (by default every statistic, the sink
    share only for a model with attention sinks)."""
    names = list(names or shown_statistics(stats, stats.names, stack))
    matrices = {name: stats.original_matrix(name, stack) for name in names}  # [layer, original head]
    flags = None if detection is None else flag_matrices(stats, detection, stack)
    title = f"{stats.model} · {stack} attention · {plural(stats.num_examples, 'example')}, {plural(stats.num_tokens, 'token')}"
    return statistics_figure(matrices, flags, title=title)


def head_statistics_evolution_figure(all_stats, detections=None, *, stack: str = "self", names=None):
    """:func:`evolution_figure` of several :class:`~attnviz.stats.HeadStatistics` (one per checkpoint)."""
    names = list(names or dict.fromkeys(n for s in all_stats for n in shown_statistics(s, s.names, stack)))
    matrices = [{name: stats.matrix(name, stack) for name in names} for stats in all_stats]
    counts = None
    if detections is not None:
        counts = []
        for stats, detection in zip(all_stats, detections):
            total: dict[str, int] = {}
            for site in stats.layers(stack):
                for flag, number in detection.counts(site).items():
                    total[flag] = total.get(flag, 0) + number
            counts.append(total)
    return evolution_figure(
        [stats.model for stats in all_stats],
        matrices,
        counts,
        title=f"statistics across checkpoints · {stack} attention",
    )
