"""Patterns that eager attention returns in blocks, laid out over the input's tokens.

LongT5's local attention splits the input into blocks of ``block = local_radius + 1`` tokens; each block's queries
attend to the keys of the block before it, itself and the block after it. Eager attention returns the weights as
``[b, blocks, h, block, 3·block]``: row ``r`` of block ``i`` is query ``i·block + r``, column ``c`` key
``(i − 1)·block + c`` (keys before the start or past the end are padding, with weight 0). Laid out over the tokens
they are the ``[b, h, q, k]`` pattern every other model has, 0 outside each query's window.
"""

from __future__ import annotations

from torch import Tensor


def unblock_local_pattern(blocked: Tensor, length: int) -> Tensor:
    """``[b, blocks, h, block, 3·block]`` local-attention weights -> ``[b, h, length, length]`` over the tokens."""
    batch, blocks, heads, block, width = blocked.shape
    if width != 3 * block:
        raise ValueError(f"blocked weights of shape {tuple(blocked.shape)} are not [b, blocks, h, block, 3·block]")
    # keys padded by one block on each side, so block i's three blocks of keys start at column i·block
    full = blocked.new_zeros(batch, heads, blocks * block, (blocks + 2) * block)  # [b, h, q_padded, k_padded]
    for index in range(blocks):
        rows = slice(index * block, (index + 1) * block)
        full[:, :, rows, index * block : index * block + width] = blocked[:, index]
    return full[:, :, :length, block : block + length]  # [b, h, q, k]
