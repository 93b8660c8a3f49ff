"""The row reductions of the statistics, fused into one pass over a block by ``torch.compile`` (optional).

:func:`attnviz.stats.accumulator.block_statistics` reads each ``[b, h, blk, c]`` block
several times (max, Σ A·s, max s, Σ A, Σ A·j). Inductor turns :func:`row_reductions`
into one loop per row that reads the pattern and the scores once. It is off by default
(see the README's benchmark: on the 2-core CPU machine it did not pay for its compile
time); turn it on with ``ATTNVIZ_FUSED_STATISTICS=1`` or :func:`set_fused_statistics`.
It is compiled once per process for dynamic shapes and falls back for good to the eager
reductions when compilation is unavailable (no C++ compiler, an unsupported platform).
"""

from __future__ import annotations

import os
import threading

import torch
from torch import Tensor

#: environment variable that turns the fused reductions on ("1") or off (anything else)
FUSED_VARIABLE = "ATTNVIZ_FUSED_STATISTICS"

_state = threading.Lock()
_enabled: bool | None = None  # None: read the environment
_compiled = None  # the compiled row_reductions, once built
_failed = False  # compilation failed once: stay on the eager reductions


def row_reductions(pattern: Tensor, scores: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Per-row reductions of a block, written so that a compiler can fuse them.

    Args:
        pattern: float32 ``[b, h, blk, c]`` softmax output.
        scores: float32 ``[b, h, blk, c]`` its input (may hold ``-inf`` where ``pattern`` is 0).
        positions: float32 ``[b, 1, 1, c]`` key positions ``j`` (0 at padding).

    Returns:
        ``(max weight, Σ A·s, max s, Σ A, Σ A·j)``, each ``[b, h, blk]``; the two weighted sums are
        accumulated in float64 (free in a memory-bound loop): over 2048 keys with positions and scores in
        the hundreds, float32 sums drift by ~1e-4.
    """
    weighted = torch.where(pattern > 0, pattern * scores, 0.0).sum(-1, dtype=torch.float64)  # 0·(−inf) counts as 0
    position_sum = (pattern * positions).sum(-1, dtype=torch.float64)
    return pattern.amax(-1), weighted, scores.amax(-1), pattern.sum(-1), position_sum


def set_fused_statistics(enabled: bool | None) -> None:
    """Turn the fused reductions on or off for this process (``None``: follow the environment)."""
    global _enabled
    _enabled = enabled


def fused_statistics_enabled() -> bool:
    if _enabled is not None:
        return _enabled
    return os.environ.get(FUSED_VARIABLE, "") == "1"


def fused_row_reductions(pattern: Tensor, scores: Tensor, positions: Tensor):
    """:func:`row_reductions` compiled (built on first use), or ``None`` when compilation is unavailable."""
    global _compiled, _failed
    if _failed:
        return None
    try:
        with _state:
            if _compiled is None:
                _compiled = torch.compile(row_reductions, dynamic=True, fullgraph=True)
        return _compiled(pattern, scores, positions)
    except Exception:  # noqa: BLE001 (any backend failure: no compiler, unsupported op, …) -> eager for good
        _failed = True
        return None
