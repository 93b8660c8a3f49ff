"""The closed sets of drawing options; imports nothing heavy (the command line lists them)."""

from __future__ import annotations

#: colour scales of heatmaps: weights as they are, their square root, or their logarithm
SCALES = ("linear", "sqrt", "log")
