"""The simplest observer: keep the patterns the core computes (for captures and small models).

By default it keeps every head of every site. Given ``sites`` it keeps only those sites and, per
site, only the chosen heads; the rest is seen block by block and dropped, so recording one head of
one layer costs one ``[b, 1, q, k]`` tensor however many layers the model has. Given the padded
``lengths`` of each stack it writes every block straight into one tensor per site, allocated once
(no list of blocks concatenated at the end, which would hold two copies at its peak).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from attnviz.core.attention import AttentionSite

#: heads to keep at one site: positions in the site's ``[b, h, q, k]`` pattern, or None for all of them
HeadPositions = Sequence[int] | None


class PatternRecorder:
    """Observer that keeps patterns: ``patterns[site]`` is ``[b, h, q, k]`` float32 (``h``: the kept heads).

    ``sites``: site -> head positions to keep (None: all heads); None keeps every site.
    ``lengths``: stack -> ``(batch, query length, key length)`` of its padded patterns; with it each
    site's tensor is allocated once and filled block by block (peak: the kept patterns, once). A model whose
    sequence is longer than those lengths (Whisper's encoder runs over 30 s of frames, padding after the audio)
    has its leading queries and keys kept.
    """

    def __init__(
        self,
        sites: Mapping[AttentionSite, HeadPositions] | None = None,
        lengths: Mapping[str, tuple[int, int, int]] | None = None,
    ) -> None:
        self._sites = None if sites is None else dict(sites)
        self._lengths = dict(lengths or {})
        self._blocks: dict[AttentionSite, list[Tensor]] = defaultdict(list)
        self._filled: dict[AttentionSite, Tensor] = {}  # site -> preallocated [b, h_kept, q, k]
        # with known lengths the recorder copies out of the core's reused buffers during observe,
        # so it can take the leading keys only (later keys of the block have weight exactly 0)
        self.accepts_key_prefix = bool(self._lengths)

    def wants(self, site: AttentionSite) -> bool:
        return self._sites is None or site in self._sites

    def observe(self, site: AttentionSite, pattern: Tensor, query_start: int) -> None:
        """``pattern``: ``[b, h, block, c]`` (``c`` ≤ the key length when keys are cut), rows from ``query_start``."""
        if site is None or not self.wants(site):
            return
        heads = None if self._sites is None else self._sites[site]
        shape = self._lengths.get(site.stack)
        if shape is None:  # lengths unknown: keep the blocks and join them at the end
            kept = pattern if heads is None else pattern[:, list(heads)]
            self._blocks[site].append(kept.detach().float().cpu())
            return
        batch, queries, keys = shape
        target = self._filled.get(site)
        if target is None:
            count = pattern.shape[1] if heads is None else len(heads)
            target = torch.empty(batch, count, queries, keys, dtype=torch.float32)  # [b, h_kept, q, k]
            self._filled[site] = target
        # a sequence longer than the lengths keeps its leading queries and keys (Whisper's frames past the audio)
        rows, width = min(pattern.shape[2], queries - query_start), min(pattern.shape[3], keys)
        if rows <= 0:
            return
        stop = query_start + rows
        positions = range(pattern.shape[1]) if heads is None else heads
        for slot, head in enumerate(positions):  # one head at a time: no block-sized temporaries
            target[:, slot, query_start:stop, :width].copy_(pattern[:, head, :rows, :width])
        if width < keys:
            target[:, :, query_start:stop, width:].zero_()

    @property
    def patterns(self) -> dict[AttentionSite, Tensor]:
        joined = {
            site: blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2) for site, blocks in self._blocks.items()
        }
        return {**self._filled, **joined}

    def pop(self, site: AttentionSite) -> Tensor:
        """The pattern of ``site``, handed over: the recorder lets go of it (so a caller can free it early)."""
        if site in self._filled:
            return self._filled.pop(site)
        blocks = self._blocks.pop(site)
        return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)

    def sites(self) -> list[AttentionSite]:
        """The sites recorded so far, in order."""
        return sorted({*self._filled, *self._blocks})
