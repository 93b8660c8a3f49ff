"""Attention of a vision transformer drawn on the image itself: one translucent heat overlay per head.

From a capture of an image (:func:`attnviz.captures.images.capture_image`): one query's attention
to every patch, shaped to the model's ``rows × cols`` patch grid and laid over the resized picture
(nearest-neighbour, so each patch is one flat colour), with the extra tokens ([CLS], [DIST],
registers) as a strip of cells beside it on the same colour scale, and one colour bar.

The query is the class token by default; models without one (SigLIP) default to the mean over the
patch queries, and the title says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.common.errors import InputError
from attnviz.common.images import ImageGrid
from attnviz.common.wording import plural
from attnviz.render.figures import model_title, new_figure
from attnviz.render.heatmap import FigureStyle
from attnviz.render.selection import HeadSelection, LayerSelection, MeanOfHeads, resolve_heads, resolve_layers

#: which query's attention to draw: the class token, the mean over patch queries, or patch ``(row, col)``;
#: None: the class token when the model has one, else the mean
ImageQuery = Literal["cls", "mean"] | tuple[int, int] | None
ImageView = Literal["heads", "rollout"]
#: opacity of the heat overlay over the picture
OVERLAY_ALPHA = 0.6
_PANEL_INCHES = 2.6
#: the grey range the picture is drawn in under an overlay (black 0 … white 1): dim and flat, so that the heat's
#: colour alone tells the weight
_UNDER_LOW, _UNDER_HIGH = 0.4, 0.7


@dataclass
class ImagePanel:
    """One overlay: attention to each patch (``[rows, cols]``) and to each extra token (``[extras]``)."""

    patches: Tensor  # [rows, cols] float32
    extras: Tensor  # [num_extra] float32
    title: str


def image_grid_of(capture: AttentionCapture) -> ImageGrid:
    """The capture's patch grid; a clear error for a capture of text."""
    if capture.image_grid is None or "image" not in capture.extras:
        raise InputError(f"this capture of {capture.model} is of text, not of an image: draw it without --image")
    return capture.image_grid


def resolve_query(grid: ImageGrid, query: ImageQuery) -> tuple[Literal["mean"] | int, str]:
    """(the query: ``"mean"`` or a token index, and its words for titles)."""
    if query is None:
        query = "cls" if grid.has_class_token else "mean"
        if query == "mean":
            return "mean", "mean over patches (the model has no class token)"
    if query == "cls":
        if not grid.has_class_token:
            raise InputError("this model has no class token: use the query mean or a patch row,col")
        return 0, "[CLS]"
    if query == "mean":
        return "mean", "mean over patches"
    row, col = query
    return grid.patch_token(row, col), f"patch r{row}c{col}"


def query_row(pattern: Tensor, grid: ImageGrid, query: Literal["mean"] | int) -> Tensor:
    """``[..., key]`` attention of the query from ``pattern`` ``[..., query, key]`` (mean: over patch queries)."""
    if query == "mean":
        return pattern[..., grid.num_extra :, :].mean(dim=-2)
    return pattern[..., query, :]


def split_keys(weights: Tensor, grid: ImageGrid) -> tuple[Tensor, Tensor]:
    """``[key]`` weights -> (``[rows, cols]`` on the patches, ``[extras]`` on the extra tokens)."""
    patches = weights[grid.patch_indices()].reshape(grid.rows, grid.cols)  # [rows, cols], row-major patches
    return patches.float(), weights[grid.extra_indices()].float()


def image_panels(
    capture: AttentionCapture,
    *,
    layers: LayerSelection = (-1,),
    heads: HeadSelection = None,
    query: ImageQuery = None,
    view: ImageView = "heads",
) -> tuple[list[list[ImagePanel]], str]:
    """Rows of panels (one row per layer, heads across; one panel for rollout), and the query's words."""
    grid = image_grid_of(capture)
    chosen, described = resolve_query(grid, query)
    if view == "rollout":
        from attnviz.heads.propagation import rollout

        weights = query_row(rollout(capture), grid, chosen)  # [key]
        patches, extras = split_keys(weights, grid)
        return [[ImagePanel(patches, extras, f"rollout through {plural(capture.num_layers(), 'layer')}")]], described
    rows = []
    for layer in resolve_layers(layers, capture.num_layers()):
        pattern = capture.layer(layer)  # [head, query, key]
        ids = list(range(pattern.shape[0]))
        picked = resolve_heads(
            heads, ids if capture.identity is None else capture.identity.ids("self", layer, len(ids))
        )
        weights = query_row(pattern, grid, chosen)  # [head, key]
        if isinstance(picked, MeanOfHeads):
            patches, extras = split_keys(weights.mean(dim=0), grid)
            rows.append([ImagePanel(patches, extras, f"layer {layer} · mean of heads")])
            continue
        row = []
        for position in picked:
            patches, extras = split_keys(weights[position], grid)
            number = position if capture.identity is None else capture.identity.ids("self", layer, len(ids))[position]
            row.append(ImagePanel(patches, extras, f"layer {layer} · head {number}"))
        rows.append(row)
    return rows, described


def image_heatmap(
    capture: AttentionCapture,
    *,
    layers: LayerSelection = (-1,),
    heads: HeadSelection = None,
    query: ImageQuery = None,
    view: ImageView = "heads",
    style: FigureStyle | None = None,
):
    """A matplotlib figure: each chosen head's (or rollout's) attention as an overlay on the image.

    ``layers``/``heads``: as for :func:`~attnviz.render.capture_view.capture_heatmap` (last layer, all heads);
    ``query``: see :data:`ImageQuery`; ``view``: ``"heads"`` or ``"rollout"`` (Abnar & Zuidema 2020).
    """
    style = style or FigureStyle()
    style.check()
    grid = image_grid_of(capture)
    rows, described = image_panels(capture, layers=layers, heads=heads, query=query, view=view)
    image = capture.extras["image"].numpy()  # [H, W, 3] in 0–1
    panels = [panel for row in rows for panel in row]
    norm, cmap = overlay_scale(style, panels)
    columns = max(len(row) for row in rows) + 1  # the first column: the image as the model saw it
    figure, axes = overlay_grid(
        len(rows), columns, grid, panel=_PANEL_INCHES, extra_room=0.45, label_room=0.5, title_room=0.7
    )
    for r, row in enumerate(rows):
        if r == 0:
            draw_input(axes[0][0], image, grid, query_patch=_patch_of(query, grid))
        else:
            axes[r][0].set_axis_off()
        for c in range(1, columns):
            ax = axes[r][c]
            if c - 1 >= len(row):
                ax.set_axis_off()
                continue
            draw_overlay(ax, image, row[c - 1], grid, norm, cmap, query_patch=_patch_of(query, grid))
    weight_colorbar(figure, axes, norm, cmap)
    figure.suptitle(f"{model_title(capture)} · query: {described}", fontsize=10)
    return figure


def overlay_grid(
    rows: int, columns: int, grid: ImageGrid, *, panel: float, extra_room: float, label_room: float, title_room: float
):
    """``(figure, axes [rows][columns])``: a constrained-layout grid of square panels ``panel`` inches wide, with
    ``extra_room`` inches more per column where ``grid`` has extra tokens (their strip beside the picture),
    ``label_room`` more per row (a panel's title), 1.2 inches across for the colour bar and ``title_room`` down for
    the figure's title."""
    extra_room = extra_room if grid.num_extra else 0.0
    figure = new_figure(
        figsize=(columns * (panel + extra_room) + 1.2, rows * (panel + label_room) + title_room),
        layout="constrained",
    )
    return figure, figure.subplots(rows, columns, squeeze=False)


def weight_colorbar(figure, axes, norm, cmap) -> None:
    """One colour bar of attention weight beside all of ``axes`` (the overlays share ``norm`` and ``cmap``)."""
    from matplotlib.cm import ScalarMappable

    figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes, label="attention weight", shrink=0.8)


def _patch_of(query: ImageQuery, grid: ImageGrid) -> tuple[int, int] | None:
    return query if isinstance(query, tuple) else None


def overlay_scale(style: FigureStyle, panels: list[ImagePanel]):
    """(norm, colour map) shared by every overlay of a figure: up to ``style.vmax``, else the largest weight shown
    (on a patch or an extra token; 1.0 when all are zero)."""
    top = style.vmax or max(max([float(p.patches.max())] + p.extras.tolist()) for p in panels) or 1.0
    return style.norm(top), style.colour_map()


def _frame(ax, grid: ImageGrid, width: int, height: int, query_patch: tuple[int, int] | None) -> None:
    """Outline the query's patch (if the query is one) and show exactly the ``width``×``height`` picture."""
    from matplotlib.patches import Rectangle

    if query_patch is not None:
        row, col = query_patch
        patch_height, patch_width = grid.patch_size
        ax.add_patch(
            Rectangle((col * patch_width, row * patch_height), patch_width, patch_height, fill=False, color="#e8384f")
        )
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)


def draw_input(ax, image, grid: ImageGrid, *, query_patch=None) -> None:
    """The picture as the model saw it (after its processor), with the patch grid and patch names at the rims,
    so a reader can tell which patch the overlays beside it light up."""
    height, width = image.shape[:2]
    patch_height, patch_width = grid.patch_size
    ax.imshow(image, extent=(0, width, height, 0), interpolation="nearest")
    for row in range(1, grid.rows):
        ax.axhline(row * patch_height, color="white", linewidth=0.4, alpha=0.6)
    for col in range(1, grid.cols):
        ax.axvline(col * patch_width, color="white", linewidth=0.4, alpha=0.6)
    _frame(ax, grid, width, height, query_patch)
    if grid.rows <= 16 and grid.cols <= 16:  # row and column numbers: patch r2c1 is row 2, column 1
        ax.set_xticks([(col + 0.5) * patch_width for col in range(grid.cols)], [f"c{col}" for col in range(grid.cols)])
        ax.set_yticks([(row + 0.5) * patch_height for row in range(grid.rows)], [f"r{row}" for row in range(grid.rows)])
        ax.tick_params(labelsize=6, length=0)
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    ax.set_title(f"input {width}×{height} · {grid.rows}×{grid.cols} patches", fontsize=8)


def draw_overlay(ax, image, panel: ImagePanel, grid: ImageGrid, norm, cmap, *, query_patch=None) -> None:
    """The picture, the translucent per-patch heat on it, the patch grid, and the extra tokens beside it."""
    height, width = image.shape[:2]
    patch_height, patch_width = grid.patch_size
    covered = (grid.cols * patch_width, grid.rows * patch_height)  # pixels the grid covers (a crop may leave a rim)
    # the picture in grey of low contrast under the heat: its own colours and brightness showing through would read
    # as weights (a red shape under a cell of weight 0 looked as hot as a cell of 0.3); its shapes stay visible
    under = _UNDER_LOW + (_UNDER_HIGH - _UNDER_LOW) * greyscale(image)
    ax.imshow(under, extent=(0, width, height, 0), interpolation="bilinear", cmap="gray", vmin=0, vmax=1)
    ax.imshow(
        panel.patches.numpy(),
        extent=(0, covered[0], covered[1], 0),
        cmap=cmap,
        norm=norm,
        alpha=OVERLAY_ALPHA,
        interpolation="nearest",
    )
    if grid.rows <= 32:  # faint patch boundaries
        for row in range(1, grid.rows):
            ax.axhline(row * patch_height, color="white", linewidth=0.3, alpha=0.4)
        for col in range(1, grid.cols):
            ax.axvline(col * patch_width, color="white", linewidth=0.3, alpha=0.4)
    _frame(ax, grid, width, height, query_patch)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(panel.title, fontsize=8)
    if grid.num_extra:
        _draw_extras(ax, panel.extras, grid, norm, cmap)


def greyscale(image):
    """``[H, W, 3]`` (or ``[H, W]``) picture in 0–1 -> ``[H, W]`` luminance (ITU-R BT.601 weights)."""
    import numpy as np

    image = np.asarray(image, dtype=np.float32)
    return image if image.ndim == 2 else image[..., :3] @ np.array([0.299, 0.587, 0.114], dtype=np.float32)


def _draw_extras(ax, extras: Tensor, grid: ImageGrid, norm, cmap) -> None:
    """The extra tokens as a column of cells right of the image, same colours, labelled with their weight."""
    count = grid.num_extra
    height = min(1.0, count / max(grid.rows, 1) * 1.0)
    strip = ax.inset_axes((1.03, 1.0 - height, 0.1, height))
    strip.imshow(extras.numpy()[:, None], cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    labels = grid.token_labels()[:count]
    strip.set_xticks([])
    strip.set_yticks(range(count))
    strip.set_yticklabels([f"{label} {float(value):.2f}" for label, value in zip(labels, extras)], fontsize=6)
    strip.yaxis.tick_right()
    strip.tick_params(length=0)


def overlay_patch_centres(ax, grid: ImageGrid) -> Sequence[tuple[float, float]]:
    """Display coordinates (pixels from the bottom left) of every patch centre of a drawn overlay, row-major."""
    patch_height, patch_width = grid.patch_size
    centres = torch.tensor(
        [
            [col * patch_width + patch_width / 2, row * patch_height + patch_height / 2]
            for row in range(grid.rows)
            for col in range(grid.cols)
        ]
    )
    return [tuple(point) for point in ax.transData.transform(centres.numpy())]
