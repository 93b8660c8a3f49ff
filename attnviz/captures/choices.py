"""The closed sets of the capture file format; imports nothing heavy (the command line lists them)."""

from __future__ import annotations

#: bits per attention weight a capture file may store (see :mod:`attnviz.captures.compact`)
CAPTURE_BITS = (8, 16, 32)
