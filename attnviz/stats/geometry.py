"""Where each block's queries and keys stand: what :func:`~attnviz.stats.row_values.block_statistics` needs.

:class:`StackGeometry` describes one batch on one attention stack (lengths, key positions,
special tokens); :class:`BlockLayout` one block of queries within it (positions, which queries
count for which statistic, gather indices), built on the first layer and reused by the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnviz.models.base import EncodedBatch
from attnviz.stats.definitions import STATISTIC_INDEX, STATISTIC_NAMES


@dataclass
class StackGeometry:
    """What :func:`block_statistics` needs to know about one batch on one attention stack."""

    query_lengths: Tensor  # [b] long: real (non-padding) queries per example
    key_lengths: Tensor  # [b] long: real keys per example
    key_positions: Tensor  # [b, k, 1] float32: position j of each key (0 at padding, which has no weight)
    special_columns: list[int]  # sorted key positions that hold a special token in at least one example
    special_weights: Tensor  # [b, 1, 1, u] float32: 1 where special_columns[u] is special in that example
    causal: bool  # query i sees keys 0…i only
    _flags: dict[tuple[int, ...], Tensor] = field(default_factory=dict)  # special_flags, made once per batch

    def special_flags(self, indices: tuple[int, ...]) -> Tensor:
        """``[u, b, 1, 1]`` float32: the flags of ``special_columns[indices]`` per example, on the device, made once
        (an index list sent to a GPU at every layer would make the host wait for it each time)."""
        flags = self._flags.get(indices)
        if flags is None:
            picked = self.special_weights[:, 0, 0, list(indices)]  # [b, u]
            flags = self._flags[indices] = picked.T[:, :, None, None].contiguous()
        return flags

    @classmethod
    def from_batch(cls, batch: EncodedBatch, stack: str, causal: bool, device: torch.device) -> StackGeometry:
        query_lengths, key_lengths = batch.query_key_lengths(stack)
        _, key_special = batch.query_key_special(stack)
        width = max(key_lengths)
        positions = torch.arange(width, dtype=torch.float32)[None, :] * batch.key_padding_mask(stack)  # [b, k]
        # Special tokens are few ([CLS], [SEP], BOS, EOS): their mass is a sum over a handful of
        # gathered columns, not a pass over the whole pattern.
        columns = sorted({j for flags in key_special for j, special in enumerate(flags) if special})
        weights = torch.tensor([[float(j < len(flags) and flags[j]) for j in columns] for flags in key_special])
        return cls(
            query_lengths=torch.tensor(query_lengths, device=device),
            key_lengths=torch.tensor(key_lengths, device=device),
            key_positions=positions[:, :, None].to(device),
            special_columns=columns,
            special_weights=weights.view(len(key_special), 1, 1, len(columns)).to(device),
            causal=causal,
        )


@dataclass
class BlockLayout:
    """Everything about one block of queries that is the same in every layer (computed once per batch).

    Transformers runs each layer on the same batch with the same blocks, so positions,
    counts, weights and gather indices are built on the first layer and reused by the rest.
    """

    width: int  # keys that can carry weight: c
    query: Tensor  # [blk] float32 positions i
    log_visible: Tensor  # [b, 1, blk] ln(keys query i may see), at least ln 2
    log_visible_and_sink: Tensor  # [b, 1, blk] ln(keys query i may see + 1): a sink is one more outcome
    reach: Tensor  # [b, 1, blk] the largest distance query i can reach, at least 1
    distances: Tensor | None  # [blk, c] |i − j| (bidirectional stacks; causal ones need none)
    band_columns: Tensor  # [blk, o] long: key i − offset for offsets −w…w then 1 (clamped into range)
    band_valid: Tensor  # [blk, o] float32: 1 where that key exists
    local_window: int  # w
    counted: Tensor  # [S, b, 1, blk] bool: the query counts for that statistic
    counts: Tensor  # [S] float64: queries counted

    @classmethod
    def rows(cls, geometry: StackGeometry, query_start: int, rows: int, local_window: int) -> BlockLayout:
        """Positions and counts of queries ``query_start …`` only, for values computed elsewhere (no keys:
        ``width``, ``distances`` and the band hold one column)."""
        return cls.build(geometry, query_start, rows, 1, local_window)

    @classmethod
    def build(cls, geometry: StackGeometry, query_start: int, rows: int, width: int, local_window: int):
        device = geometry.key_lengths.device
        batch = geometry.key_lengths.shape[0]
        query = torch.arange(query_start, query_start + rows, device=device)  # [blk] positions i
        if geometry.causal:
            width = min(width, query_start + rows)  # keys after the block's last query have weight 0
        width = min(width, geometry.key_positions.shape[1])  # columns past the longest example are padding
        query_lengths = geometry.query_lengths[:, None]  # [b, 1]
        key_lengths = geometry.key_lengths[:, None]  # [b, 1]
        real_query = query[None, :] < query_lengths  # [b, blk]
        if geometry.causal:
            visible_keys = torch.minimum(query[None, :] + 1, key_lengths)  # [b, blk]
            reach = query[None, :].expand(batch, rows)  # [b, blk] the farthest key is position 0
            distances = None
        else:
            visible_keys = key_lengths.expand(batch, rows)  # [b, blk]
            reach = torch.maximum(query[None, :], (key_lengths - 1 - query[None, :]).abs())  # [b, blk]
            distances = (query[:, None] - torch.arange(width, device=device)[None, :]).abs().float()  # [blk, c]

        offsets = list(range(-local_window, local_window + 1)) + ([] if local_window >= 1 else [1])
        keys = query[:, None] - torch.tensor(offsets, device=device)[None, :]  # [blk, o]
        band_valid = ((keys >= 0) & (keys < width)).float()  # [blk, o]

        counted = real_query.expand(len(STATISTIC_NAMES), batch, rows).clone()  # [S, b, blk]
        counted[STATISTIC_INDEX["normalized_entropy"]] &= visible_keys >= 2
        counted[STATISTIC_INDEX["normalized_distance"]] &= reach >= 1
        counted[STATISTIC_INDEX["previous_token"]] &= (query[None, :] >= 1) & (query[None, :] - 1 < key_lengths)
        return cls(
            width=width,
            query=query.float(),
            log_visible=torch.log(visible_keys.clamp(min=2).float())[:, None, :],
            log_visible_and_sink=torch.log(visible_keys.clamp(min=1).float() + 1)[:, None, :],
            reach=reach.clamp(min=1).float()[:, None, :],
            distances=distances,
            band_columns=keys.clamp(0, width - 1),
            band_valid=band_valid,
            local_window=local_window,
            counted=counted[:, :, None, :],
            counts=counted.sum(dim=(1, 2)).double(),
        )
