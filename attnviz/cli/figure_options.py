"""The options of a figure (``--scale``, ``--vmax``, ``--cmap``, ``--dpi``), shared by the commands that draw one."""

from __future__ import annotations

from attnviz.cli.options import choice_enum, choice_option, option
from attnviz.render.choices import SCALES

FIGURE_PANEL = "Figure"

ColourScale = choice_enum("ColourScale", SCALES)

ScaleOption = choice_option(
    ColourScale,
    "--scale",
    "colour scale",
    help="Colour scale: linear, sqrt (square root) or log (three decades below the top). "
    "Small weights stay visible on sqrt and log. Example: --scale sqrt",
    panel=FIGURE_PANEL,
)
VmaxOption = option(
    float | None,
    "--vmax",
    min=0.0,
    help="Weight at the top of the colour scale (default: the largest weight shown); larger weights "
    "saturate, so a sink column no longer darkens everything else. Example: --vmax 0.3",
    show_default=False,
    panel=FIGURE_PANEL,
)
CmapOption = option(str, "--cmap", help="Matplotlib colour map of figures. Example: --cmap magma", panel=FIGURE_PANEL)
DpiOption = option(
    int,
    "--dpi",
    min=30,
    max=1200,
    help="Resolution of .png figures in dots per inch. Example: --dpi 300",
    panel=FIGURE_PANEL,
)
