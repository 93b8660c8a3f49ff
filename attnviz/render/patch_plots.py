"""Figures and tables of a :class:`~attnviz.patching.PatchResult`: which heads make the answer.

The figure puts the layer × head grid of normalised patching effects beside the grid of direct logit
attributions (and of ablation effects, when measured), each on a diverging colour map centred on 0; the
top heads are outlined and their values written into their cells, and named under the figure.
"""

from __future__ import annotations

import math
from typing import Any

from attnviz.render.figures import colormap, subplots
from attnviz.render.heatmap import FIGURE_SUFFIXES, save_figure  # noqa: F401  (re-exported for the CLI)

#: heads named on the figure and in the terminal table by default
TOP_HEADS = 5

#: (field of HeadEffect, panel title)
PANELS = (
    ("normalized_effect", "patching: normalised effect"),
    ("direct_logit_attribution", "direct logit attribution"),
    ("ablation_effect", "ablation: change of logit diff"),
)


def panels_of(result) -> list[tuple[str, str]]:
    """The panels this result has numbers for (attribution: a linear readout; ablation: when asked for)."""
    return [
        (field, title) for field, title in PANELS if any(getattr(effect, field) is not None for effect in result.heads)
    ]


def patch_figure(result, *, top: int = TOP_HEADS):
    """The grids of :data:`PANELS` (rows: layers, columns: heads) with the ``top`` heads of each outlined and
    annotated (two decimals), and the top heads by normalised effect named under the figure."""
    from matplotlib.patches import Rectangle

    panels = panels_of(result)
    layers, heads = result.layers, result.width
    panel_width, panel_height = 1.6 + 0.42 * heads, 1.4 + 0.26 * layers
    fig, axes = subplots(1, len(panels), figsize=(panel_width * len(panels), panel_height + 1.2), squeeze=False)
    for ax, (field, title) in zip(axes.flat, panels):
        grid = result.grid(field)  # [layer][head], NaN where missing
        finite = [abs(v) for row in grid for v in row if not math.isnan(v)]
        limit = max(max(finite, default=1.0), 1e-6)
        cmap = colormap("RdBu_r").with_extremes(bad="#d9d9d9")  # red: toward the answer, blue: against it
        image = ax.imshow(grid, aspect="auto", cmap=cmap, vmin=-limit, vmax=limit, interpolation="nearest")
        fig.colorbar(image, ax=ax, fraction=0.08, pad=0.03)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.set_xticks(range(0, heads, max(1, heads // 12)))
        ticks = range(0, layers, max(1, math.ceil(layers / 16)))
        ax.set_yticks(ticks)
        if any(stack != "self" for stack, _ in result.rows):  # an encoder-decoder: name each row's stack
            ax.set_yticklabels([f"{result.rows[t][0]} {result.rows[t][1]}" for t in ticks])
        ax.tick_params(labelsize=7)
        for effect in result.top_heads(top, by=field):
            value = float(getattr(effect, field))
            ax.add_patch(
                Rectangle(
                    (effect.head - 0.5, result.row(effect) - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.4
                )
            )
            shade = "white" if abs(value) > 0.6 * limit else "black"
            ax.text(
                effect.head, result.row(effect), f"{value:.2f}", ha="center", va="center", fontsize=6.5, color=shade
            )
    fig.suptitle(
        f"{result.model} · logit({result.answer!r}) − logit({result.wrong!r}): clean "
        f"{result.clean_logit_diff:.2f}, corrupt {result.corrupt_logit_diff:.2f}",
        fontsize=10,
    )
    named = ", ".join(f"{e.label} ({e.normalized_effect:.2f})" for e in result.top_heads(top))
    fig.text(0.01, 0.01, f"{result.direction} {result.patched} patching · top heads: {named}", fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    return fig


def number(value: float | None) -> str:
    return "–" if value is None else f"{value:+.3f}"


def top_heads_table(result, *, top: int = TOP_HEADS) -> Any:
    """The ``top`` heads by absolute normalised effect as a rich table (the terminal view)."""
    from rich.table import Table

    table = Table(
        title=f"{result.model}: the heads that make {result.answer!r} over {result.wrong!r}",
        title_justify="left",
        header_style="bold",
        caption=(
            f"logit difference: clean {result.clean_logit_diff:.3f}, corrupt {result.corrupt_logit_diff:.3f} · "
            f"{result.settings_line()}"
        ),
        caption_justify="left",
    )
    for name in ("#", "head", "normalised effect", "patched logit diff", "direct logit attribution", "ablation effect"):
        table.add_column(name, justify="left" if name == "head" else "right")
    for rank, effect in enumerate(result.top_heads(top), start=1):
        table.add_row(
            str(rank),
            effect.label,
            number(effect.normalized_effect),
            number(effect.patched_logit_diff),
            number(effect.direct_logit_attribution),
            number(effect.ablation_effect),
        )
    return table
