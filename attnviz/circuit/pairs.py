"""Prompt pairs: reading them, checking them by ``patch``'s rules, and batching those of one token length.

A pair is a clean prompt the model answers, a corrupt prompt of the same token count changed where it
matters, the answer and the wrong answer (one token each). Pairs of the same length run as one batch
(no padding, so every position of a row is a real token).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnviz.common.errors import InputError
from attnviz.common.texts import json_records
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.patching.run import aligned_answer_position, one_token

#: the fields of one line of a pairs file
PAIR_FIELDS = ("clean", "corrupt", "answer", "wrong")


@dataclass(frozen=True)
class PromptPair:
    clean: str
    corrupt: str
    answer: str
    wrong: str


@dataclass
class PairGroup:
    """Pairs of one token length, as two batches (row ``i`` of each is pair ``i``)."""

    pairs: list[PromptPair]
    clean: EncodedBatch
    corrupt: EncodedBatch
    both: EncodedBatch  # the clean rows, then the corrupt rows (the reference runs' one batch)
    positions: Tensor  # [b] long: where each row's answer is read
    answers: Tensor  # [b] long
    wrongs: Tensor  # [b] long

    def __len__(self) -> int:
        return len(self.pairs)


def read_pairs(path: str | os.PathLike) -> list[PromptPair]:
    """The pairs of a JSON Lines file, one ``{"clean", "corrupt", "answer", "wrong"}`` object a line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read the pairs file {path}: {error}") from error
    pairs = []

    def not_json(number: int, error: json.JSONDecodeError) -> str:
        return f"{path}, line {number}: not JSON ({error.msg}); write one object a line"

    for number, record in json_records(enumerate(lines, start=1), not_json):
        pairs.append(pair_of(record, f"{path}, line {number}"))
    if not pairs:
        raise InputError(f"{path} holds no pairs: write one {{{', '.join(map(repr, PAIR_FIELDS))}}} object a line")
    return pairs


def pair_of(record: object, where: str) -> PromptPair:
    """A :class:`PromptPair` from a mapping with the four text fields (``where`` names it in errors)."""
    if isinstance(record, PromptPair):
        return record
    if not isinstance(record, Mapping):
        raise InputError(f"{where}: a pair is an object with the fields {', '.join(PAIR_FIELDS)}")
    missing = [name for name in PAIR_FIELDS if not isinstance(record.get(name), str) or not record[name].strip()]
    if missing:
        raise InputError(f"{where}: the pair has no text for {', '.join(missing)} (it needs {', '.join(PAIR_FIELDS)})")
    return PromptPair(*(str(record[name]) for name in PAIR_FIELDS))


def group_pairs(loaded: LoadedModel, pairs: Sequence[PromptPair], *, max_length: int | None = None) -> list[PairGroup]:
    """The pairs checked (one-token answers, equal token counts, one answer position) and grouped by length."""
    by_length: dict[int, list[tuple[PromptPair, int, int, int]]] = {}
    for number, pair in enumerate(pairs, start=1):
        where = f"pair {number}: " if len(pairs) > 1 else ""
        answer_id, answer_token = one_token(loaded, pair.answer, "answer")
        wrong_id, _ = one_token(loaded, pair.wrong, "wrong")
        if answer_id == wrong_id:
            raise InputError(f"{where}the answer and the wrong answer are the same token ({answer_token!r})")
        encoded = loaded.encode([pair.clean, pair.corrupt], max_length=max_length, truncate=False)
        position = aligned_answer_position(loaded, encoded, where)
        by_length.setdefault(encoded.lengths[0], []).append((pair, position, answer_id, wrong_id))
    groups = []
    for _, members in sorted(by_length.items()):
        chosen = [pair for pair, *_ in members]
        texts = [p.clean for p in chosen] + [p.corrupt for p in chosen]
        both = loaded.encode(texts, max_length=max_length, truncate=False)
        clean = loaded.encode(texts[: len(chosen)], max_length=max_length, truncate=False)
        corrupt = loaded.encode(texts[len(chosen) :], max_length=max_length, truncate=False)
        numbers = torch.as_tensor([rest for _, *rest in members], dtype=torch.long)  # [b, 3]
        groups.append(PairGroup(chosen, clean, corrupt, both, numbers[:, 0], numbers[:, 1], numbers[:, 2]))
    return groups


def tile(batch: EncodedBatch, times: int) -> EncodedBatch:
    """``batch`` repeated ``times`` times along the batch (row ``t·b + i`` is example ``i``)."""
    size = len(batch)
    inputs = {
        name: value.repeat(times, *([1] * (value.dim() - 1)))
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == size
        else value
        for name, value in batch.inputs.items()
    }
    return EncodedBatch(
        inputs=inputs,
        tokens=batch.tokens * times,
        special=batch.special * times,
        word_ids=batch.word_ids * times,
        truncated=[False] * (size * times),
    )
