"""The accuracy docs/views.md states for a long page's kept weights holds on random rows.

The bounds are read from the page's documentation itself (``each shown within `m / N```), so the statement and the
code cannot drift apart: rows of random widths and shapes (peaked, flat, sparse, maxima just above a power of two,
where bfloat16's rounding-up of the scale is largest) go through the reducer and the decoder the page mirrors.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from attnviz.render.html_rows import LayerReducer, decode_rows

VIEWS = Path(__file__).resolve().parents[2] / "docs" / "views.md"


def stated_bound(pattern: str) -> int:
    found = re.search(pattern, " ".join(VIEWS.read_text(encoding="utf-8").split()))
    assert found, f"docs/views.md no longer states {pattern!r}"
    return int(found.group(1))


def random_rows(seed: int, heads: int, queries: int, keys: int) -> torch.Tensor:
    """``[head, query, key]`` rows summing to 1: peaked, flat, sparse and power-of-two-topped rows."""
    generator = torch.Generator().manual_seed(seed)
    logits = (
        torch.randn(heads, queries, keys, generator=generator)
        * torch.tensor([0.1, 1.0, 4.0, 12.0])[torch.randint(0, 4, (heads, queries, 1), generator=generator)]
    )
    rows = logits.softmax(dim=-1)
    # a few rows whose maximum is just above a power of two (the scale's worst bfloat16 rounding)
    for head in range(heads):
        row = torch.full((keys,), 0.0)
        row[0] = 2.0**-2 * 1.0004
        row[1:5] = (1 - row[0]) / 4
        rows[head, head % queries] = row[torch.randperm(keys, generator=generator)]
    return rows


def test_kept_weights_and_the_dropped_bound_are_within_what_the_page_states():
    kept_bound = stated_bound(r"largest weights \(ties aside\), each shown within `m / (\d+)`")
    first_bound = stated_bound(r"first token's weight is shown within `m / (\d+)`")
    step_bound = stated_bound(r"the bound exceeds the largest dropped weight by less than one step, under `m / (\d+)`")
    worst = 0.0
    for seed, (heads, queries, keys, top) in enumerate([(3, 40, 512, 32), (4, 64, 97, 8), (2, 33, 2000, 4)]):
        rows = random_rows(seed, heads, queries, keys)
        reducer = LayerReducer(heads, queries, keys, top=top)
        for start in range(0, queries, 16):
            reducer.add(rows[:, start : start + 16], start)
        decoded = decode_rows(reducer.payload(), heads, queries)
        peak = rows.amax(dim=-1)  # [head, query]: m
        truth = rows.gather(-1, decoded["indices"])  # [head, query, top]
        error = (decoded["weights"] - truth).abs() / peak[..., None]
        worst = max(worst, float(error.max()))
        assert float(error.max()) <= 1 / kept_bound
        assert float(((decoded["first"] - rows[..., 0]).abs() / peak).max()) <= 1 / first_bound
        kept = torch.zeros_like(rows, dtype=torch.bool).scatter_(-1, decoded["indices"], True)
        largest_dropped = (
            rows.masked_fill(kept, 0).masked_fill(torch.arange(keys) == 0, 0).amax(dim=-1)
        )  # the first token is stated on its own
        assert bool((decoded["dropped"] >= largest_dropped).all())
        assert float(((decoded["dropped"] - largest_dropped) / peak).max()) < 1 / step_bound
    assert worst > 1 / 510  # the bfloat16 scale does take kept weights past half an exact 8-bit step
