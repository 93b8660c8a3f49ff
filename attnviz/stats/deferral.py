"""Where the statistics observers reduce a batch's layers together, at its end, rather than layer by layer.

On a GPU a short input's pass is bound by the host: every tensor operation is a kernel launched from Python, and the
GPU waits for the next one. There the observers keep what each layer's attention call hands them (the core then
hands them tensors of their own, see ``keeps_summary`` in :class:`attnviz.core.AttentionObserver`) and reduce the
layers of one shape side by side along the heads: a handful of operations per batch instead of per layer. On the
CPU each layer is reduced as soon as it is done, which keeps one layer's rows in memory, not a batch's.
"""

from __future__ import annotations

import torch

#: device types on which the observers defer (a benchmark or test may add "cpu" to do on the CPU what a GPU does)
DEFERRED_DEVICES: tuple[str, ...] = ("cuda",)
#: the most one observer may keep (bytes): past it, what it holds is reduced at once. Deferring pays where a layer is
#: short (launching operations is the cost); a long input's layer dwarfs its reduction anyway
DEFERRED_BYTES = 256 * 2**20


def defers(device: torch.device) -> bool:
    """Whether observers keep and reduce together what they see on ``device`` (read at each call, not at import)."""
    return device.type in DEFERRED_DEVICES
