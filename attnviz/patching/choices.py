"""The closed sets of ``attnviz patch``'s options (no torch: the command line reads them at start-up)."""

from __future__ import annotations

from typing import Literal

#: denoising: the corrupt run gets one head from the clean run; noising: the clean run gets it from the corrupt run
Direction = Literal["denoising", "noising"]
DIRECTIONS: tuple[Direction, ...] = ("denoising", "noising")

#: what is put in: the head's output (the vector that enters the output projection) or its attention pattern
Patched = Literal["output", "pattern"]
PATCHED: tuple[Patched, ...] = ("output", "pattern")

#: what a head's output is replaced by when it is ablated
Ablation = Literal["zero", "mean"]
ABLATIONS: tuple[Ablation, ...] = ("zero", "mean")
