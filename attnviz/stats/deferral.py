"""Where the statistics observers reduce a batch's layers together, at its end, rather than layer by layer.

On a GPU a short input's pass is bound by the host: every tensor operation is a kernel launched from Python, and the
GPU waits for the next one. There the observers keep what each layer's attention call hands them (the core then
hands them tensors of their own, see ``keeps_summary`` in :class:`attnviz.core.AttentionObserver`) and reduce the
layers of one shape side by side along the heads: a handful of operations per batch instead of per layer. On the
CPU each layer is reduced as soon as it is done, which keeps one layer's rows in memory, not a batch's. Either way
their sums stay on the device until the result is read (:class:`GroupSums`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
from torch import Tensor

#: device types on which the observers defer (a benchmark or test may add "cpu" to do on the CPU what a GPU does)
DEFERRED_DEVICES: tuple[str, ...] = ("cuda",)
#: the most one observer may keep (bytes): past it, what it holds is reduced at once. Deferring pays where a layer is
#: short (launching operations is the cost); a long input's layer dwarfs its reduction anyway
DEFERRED_BYTES = 256 * 2**20


def defers(device: torch.device) -> bool:
    """Whether observers keep and reduce together what they see on ``device`` (read at each call, not at import)."""
    return device.type in DEFERRED_DEVICES


class GroupSums:
    """Running sums keyed by a group of sites, added on the model's device as they come, brought to the host all
    together: one copy from the device for every group (a GPU's: one wait), not one operation per site."""

    def __init__(self) -> None:
        self._sums: dict[Hashable, Tensor] = {}

    def add(self, key: Hashable, sums: Tensor) -> None:
        """Add ``sums`` to the group ``key``'s; a first ``sums`` is kept as it is (give a tensor of the caller's own)."""
        if key in self._sums:
            self._sums[key].add_(sums)
        else:
            self._sums[key] = sums

    def take_to_host(self) -> list[tuple[Any, Tensor]]:
        """Every group's sums on the host, in the order the groups came, and nothing kept after."""
        if not self._sums:
            return []
        groups, self._sums = list(self._sums.items()), {}
        device = groups[0][1].device
        flat = torch.cat([sums.to(device).flatten() for _, sums in groups]).cpu()
        parts = flat.split([sums.numel() for _, sums in groups])
        return [(key, part.view(sums.shape)) for (key, sums), part in zip(groups, parts)]
