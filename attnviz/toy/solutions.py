"""How much each head follows its task's known attention solution.

Every toy task has an attention pattern that solves it (see :mod:`attnviz.toy.tasks`):
for a query position, the key position(s) holding what it needs. A head's
*solution score* is the weight it puts on those keys, averaged over the
scored queries of many fresh examples (1.0: the head is the solution).

* ``copy`` / ``reverse`` / ``sort``: the position that emits answer token ``yₜ``
  looks at the source position ``yₜ`` is copied from (``t``, ``n−1−t``, or any
  position holding the same symbol for ``sort``). Encoder-decoder models:
  cross-attention; decoder-only and encoder-only models: self-attention.
* ``previous-token``: position ``i`` looks at ``i − 1``.
* ``induction``: the *prefix-matching score* — from the second occurrence of a
  token, the weight on the token after its first occurrence.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from attnviz.core import AttentionSite
from attnviz.core.recorder import PatternRecorder
from attnviz.toy.loaded import ToyModel
from attnviz.toy.tasks import Task
from attnviz.toy.tokenizer import BOS


def expected_keys(task: Task, architecture: str, items: list[str]) -> list[tuple[int, list[int]]]:
    """``(query position, key positions)`` of the task's attention solution on one example's ``items``.

    Positions are those of the layout of :meth:`Task.example` (decoder side for cross-attention queries).
    """
    if task.kind == "labelling":
        tokens = [BOS, *items]
        if task.name == "previous-token":
            return [(i, [i - 1]) for i in range(1, len(tokens))]
        pairs = []  # induction: prefix matching
        first: dict[str, int] = {}
        for position, token in enumerate(tokens):
            if token in first and first[token] + 1 < position:
                pairs.append((position, [first[token] + 1]))
            first.setdefault(token, position)
        return pairs
    n = len(items)
    answer = task.answer(items)
    # where answer token t is emitted, and where source item j sits
    emit = {"encoder-decoder": 0, "decoder": n + 1, "encoder": 1}[architecture]
    source = 0 if architecture == "encoder-decoder" else 1
    pairs = []
    for t, token in enumerate(answer):
        if task.name == "copy":
            keys = [t]
        elif task.name == "reverse":
            keys = [n - 1 - t]
        else:  # sort: any position holding the emitted symbol
            keys = [j for j, item in enumerate(items) if item == token]
        pairs.append((emit + t, [source + j for j in keys]))
    return pairs


def solution_stack(loaded: ToyModel) -> str:
    """The stack where the solution lives: ``cross`` for encoder-decoder models, else ``self``."""
    return "cross" if loaded.encoder_decoder else "self"


def solution_scores(loaded: ToyModel, num_examples: int = 200, seed: int = 12345) -> dict[AttentionSite, Tensor]:
    """Per site of :func:`solution_stack`, ``[h]``: mean weight each head puts on the solution's keys."""
    rng = random.Random(f"solution:{seed}")
    items = [loaded.toy_task.sample(rng, loaded.task_settings) for _ in range(num_examples)]
    batch = loaded.batch_examples([loaded.toy_task.example(loaded.config.architecture, x) for x in items])
    recorder = PatternRecorder()
    with torch.no_grad():
        loaded.forward(batch, loaded.context([recorder]))
    stack = solution_stack(loaded)
    scores = {}
    for site, pattern in recorder.patterns.items():  # [b, h, q, k]
        if site.stack != stack:
            continue
        total = torch.zeros(pattern.shape[1])
        count = 0
        for example, example_items in enumerate(items):
            for query, keys in expected_keys(loaded.toy_task, loaded.config.architecture, example_items):
                total += pattern[example, :, query, keys].sum(dim=-1)
                count += 1
        scores[site] = total / max(count, 1)
    return dict(sorted(scores.items()))
