"""Batches formed by token count: the one batcher of every corpus pass (statistics, importance, …).

Examples are sorted by token length, longest first, and cut into batches whose *padded*
size (examples × longest example) stays within ``max_tokens`` and whose example count
stays within ``max_examples``. Sorting keeps padding small, and a token budget keeps the
work per forward pass even: many short sentences or a few long documents.

Planning (:func:`plan_batches`) only needs the lengths and returns example indices, so
the plan is cheap, the same on every process of a distributed run, and can be split
among processes before anything is encoded (see :mod:`attnviz.common.parallel`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from attnviz.common.errors import InputError, ParameterError
from attnviz.models.base import EncodedBatch, LoadedModel

#: Examples per batch when no limit is given.
DEFAULT_MAX_EXAMPLES = 8


def plan_batches(
    lengths: Sequence[int], *, max_tokens: int | None = None, max_examples: int | None = DEFAULT_MAX_EXAMPLES
) -> list[list[int]]:
    """Group example indices into batches, longest examples first.

    Args:
        lengths: tokens of each example.
        max_tokens: most padded tokens per batch (examples × the batch's longest); an example
            longer than this gets a batch of its own. ``None``: no token limit.
        max_examples: most examples per batch. ``None``: no count limit.

    Returns:
        Lists of indices into ``lengths``; ties keep the original order, so the plan is deterministic.
    """
    if max_tokens is not None and max_tokens < 1:
        raise ParameterError(
            "max_tokens_per_batch", f"{{max_tokens_per_batch}} must be at least 1, got {max_tokens}", max_tokens
        )
    if max_examples is not None and max_examples < 1:
        raise ParameterError("batch_size", f"{{batch_size}} must be at least 1, got {max_examples}", max_examples)
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        longest = lengths[current[0]] if current else lengths[index]  # sorted: the first is the longest
        too_many = max_examples is not None and len(current) + 1 > max_examples
        too_long = max_tokens is not None and (len(current) + 1) * max(longest, 1) > max_tokens
        if current and (too_many or too_long):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def token_lengths(loaded: LoadedModel, texts: Sequence[str], max_length: int | None = None) -> list[int]:
    """Tokens of each text as ``loaded`` encodes it (capped at the length limit)."""
    limits = [limit for limit in (max_length, loaded.max_length) if limit]
    limit = min(limits) if limits else None
    lengths = loaded.token_counts(texts, max_length=max_length)
    return [min(length, limit) if limit else length for length in lengths]


def encode_batch(
    loaded: LoadedModel, texts: Sequence[str], indices: Sequence[int], *, max_length: int | None, truncate: bool
) -> EncodedBatch:
    """Encode ``texts[i] for i in indices`` as one batch; refuse texts that are nothing but special tokens."""
    batch = loaded.encode([texts[index] for index in indices], max_length=max_length, truncate=truncate)
    for position, index in enumerate(indices):
        if all(batch.special[position]):
            raise InputError(
                f"text #{index + 1} ({_preview(texts[index])}) tokenises to nothing but special tokens: "
                "remove it or give real words"
            )
    return batch


def token_batches(
    loaded: LoadedModel,
    texts: Sequence[str],
    *,
    max_tokens: int | None = None,
    max_examples: int | None = DEFAULT_MAX_EXAMPLES,
    max_length: int | None = None,
    truncate: bool = True,
) -> Iterator[EncodedBatch]:
    """Encode ``texts`` in the batches of :func:`plan_batches`, lazily (one batch in memory at a time)."""
    texts = list(texts)
    plan = plan_batches(token_lengths(loaded, texts, max_length), max_tokens=max_tokens, max_examples=max_examples)
    for indices in plan:
        yield encode_batch(loaded, texts, indices, max_length=max_length, truncate=truncate)


def _preview(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")
