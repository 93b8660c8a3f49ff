"""Probe scores per head, accumulated by an attention observer while the probes run.

On a probe ``[BOS] r₁…r_T r₁…r_T`` (see :mod:`attnviz.heads.probes`), with ``s`` the position
of ``r₁`` (1 after a BOS / [CLS]), a head's scores are mean attention weights on one key per query:

==================  ==============================================  ===========================================
score               query → key                                     which queries
==================  ==============================================  ===========================================
``induction``       ``s+T+k−1`` → ``s+k`` (the token after the      second copy, k = 1…T (Olsson et al. 2022's
                    earlier occurrence of the query's token)        prefix matching; with s = 1 the stripe
                                                                    ``pattern.diagonal(1−T)`` over the 2nd copy)
``duplicate_token`` ``s+T+k−1`` → ``s+k−1`` (the earlier             second copy, k = 1…T
                    occurrence itself)
``previous_token``  ``s+i`` → ``s+i−1``                             i = 1…2T−1: both tokens random
``next_token``      ``s+i`` → ``s+i+1``                             i = 0…2T−2; bidirectional stacks only
                                                                    (a causal query cannot see it: NaN)
==================  ==============================================  ===========================================

Each score is the mean over those queries and over every probe sequence. On bidirectional
encoders the same positions are measured: an encoder's query in the second copy may also
see the tokens after it, so its induction score says "attends to the token after the
earlier occurrence", not that it could predict it. Cross-attention uses decoder positions
for queries and encoder positions for keys (both sides hold the same two copies).

The observer reads each block of a pattern only while the core hands it over (it declares
``accepts_key_prefix``): keys past the block's width carry weight exactly 0. Nothing is kept
but per-head sums.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnviz.core import AttentionSite
from attnviz.core.stacks import is_causal_stack
from attnviz.heads.labels import SCORE_NAMES
from attnviz.heads.probes import ProbeBatch

SCORE_INDEX = {name: index for index, name in enumerate(SCORE_NAMES)}


def score_positions(length: int, query_start: int, key_start: int) -> list[tuple[Tensor, Tensor]]:
    """Per score (:data:`SCORE_NAMES` order): ``(query positions [n], key positions [n])`` long tensors."""
    t = length
    k = torch.arange(1, t + 1)  # [T] k = 1…T
    second_copy = query_start + t + k - 1  # [T] r_k's second occurrence
    i = torch.arange(1, 2 * t)  # [2T−1] i = 1…2T−1
    j = torch.arange(0, 2 * t - 1)  # [2T−1] i = 0…2T−2
    return [
        (second_copy, key_start + k),  # induction: the token after the earlier occurrence
        (second_copy, key_start + k - 1),  # duplicate: the earlier occurrence
        (query_start + i, key_start + i - 1),  # previous token
        (query_start + j, key_start + j + 1),  # next token
    ]


class ProbeScoreAccumulator:
    """An attention observer summing each head's probe scores (call :meth:`begin_batch` before each pass)."""

    #: reads each block only during ``observe``; keys past the block's width have weight 0
    accepts_key_prefix = True

    def __init__(self, *, causal: bool):
        self.causal = causal  # decoder-only model: its "self" stack is causal
        self.sums: dict[AttentionSite, Tensor] = {}  # site -> [score, h] float64
        self.counts: dict[AttentionSite, Tensor] = {}  # site -> [score] float64 (queries × sequences)
        self._probe: ProbeBatch | None = None
        self._positions: dict[tuple, list[tuple[Tensor, Tensor]]] = {}

    def begin_batch(self, probe: ProbeBatch) -> None:
        self._probe = probe

    def _stack_positions(self, stack: str, device: torch.device) -> list[tuple[Tensor, Tensor]]:
        assert self._probe is not None
        query_start, key_start = self._probe.starts(stack)
        key = (stack, self._probe.length, query_start, key_start, device)
        if key not in self._positions:
            pairs = score_positions(self._probe.length, query_start, key_start)
            if is_causal_stack(stack, self.causal):
                pairs[SCORE_INDEX["next_token"]] = (torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
            self._positions[key] = [(q.to(device), k.to(device)) for q, k in pairs]
        return self._positions[key]

    def observe(self, site: AttentionSite | None, pattern: Tensor, query_start: int) -> None:
        """``pattern``: float32 ``[b, h, blk, c]``, queries ``query_start…``, the first ``c`` keys."""
        if site is None:
            return
        if self._probe is None:
            raise RuntimeError("ProbeScoreAccumulator.begin_batch(probe) must be called before the forward pass")
        batch, heads, rows, width = pattern.shape
        if site not in self.sums:
            self.sums[site] = torch.zeros(len(SCORE_NAMES), heads, dtype=torch.float64)
            self.counts[site] = torch.zeros(len(SCORE_NAMES), dtype=torch.float64)
        for index, (queries, keys) in enumerate(self._stack_positions(site.stack, pattern.device)):
            inside = (queries >= query_start) & (queries < query_start + rows)  # [n]
            if not bool(inside.any()):
                continue
            rows_here, keys_here = queries[inside] - query_start, keys[inside]  # [m], [m]
            seen = keys_here < width  # keys past the width have weight 0
            weights = pattern[:, :, rows_here[seen], keys_here[seen]]  # [b, h, m']
            self.sums[site][index] += weights.sum(dim=(0, 2)).double().cpu()
            self.counts[site][index] += batch * int(inside.sum())

    def means(self) -> dict[AttentionSite, Tensor]:
        """site -> ``[score, h]`` float64 mean of each score; NaN where no query counted (next_token, causal)."""
        result = {}
        for site in sorted(self.sums):
            count = self.counts[site][:, None]  # [score, 1]
            mean = self.sums[site] / count.clamp(min=1)  # [score, h]
            result[site] = mean.masked_fill(count == 0, math.nan)
        return result
