"""Inputs built from a Hugging Face tokenizer directly, where :meth:`HFModel.encode` would not fit:
the fixed-length timing input, and the repeated-random-token probes."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from attnviz.common.errors import InputError
from attnviz.common.tokens import token_strings
from attnviz.models.base import EncodedBatch
from attnviz.models.probing import ProbeBatch, check_probe_fits, chunks

if TYPE_CHECKING:  # HFModel calls this module
    from attnviz.models.hf import HFModel


def text_timing_batch(loaded: HFModel, texts: Sequence[str], tokens: int) -> EncodedBatch:
    """One example of exactly ``tokens`` tokens (special tokens included), cut from ``texts`` repeated.

    Built from the tokenizer directly so that the cut is silent; capped at the model's maximum length.
    """
    tokenizer = loaded.tokenizer
    if loaded.max_length is not None:
        tokens = min(tokens, loaded.max_length)
    joined = " ".join(text.strip() for text in texts if text.strip())
    if not joined:
        raise InputError("no text to measure latency on")
    text = joined
    while len(tokenizer(text)["input_ids"]) < tokens:
        text = f"{text} {joined}"
    encoding = tokenizer(
        [text], truncation=True, max_length=tokens, return_tensors="pt", return_special_tokens_mask=True
    )
    ids = encoding["input_ids"][0].tolist()
    special = [bool(flag) for flag in encoding["special_tokens_mask"][0].tolist()]
    inputs = {
        "input_ids": encoding["input_ids"].to(loaded.device),
        "attention_mask": encoding["attention_mask"].to(loaded.device),
    }
    return EncodedBatch(
        inputs=inputs,
        tokens=[token_strings(tokenizer, ids)],
        special=[special],
        word_ids=[[None if flag else i for i, flag in enumerate(special)]],
        truncated=[True],
    )


# -- probes ---------------------------------------------------------------------------------------------


def ordinary_token_ids(tokenizer, rng: random.Random, wanted: int) -> list[int]:
    """About ``wanted`` distinct random ids of ordinary tokens (see :mod:`attnviz.heads.probes`), in draw order."""
    special = set(tokenizer.all_special_ids)
    vocabulary = len(tokenizer)
    order = rng.sample(range(vocabulary), vocabulary) if vocabulary <= 200_000 else None
    accepted: list[int] = []
    position = 0
    while len(accepted) < wanted and position < vocabulary:
        size = max(256, 2 * (wanted - len(accepted)))
        if order is not None:
            candidates = order[position : position + size]
        else:
            candidates = [rng.randrange(vocabulary) for _ in range(size)]
        position += size
        candidates = [c for c in candidates if c not in special]
        texts = tokenizer.batch_decode([[c] for c in candidates])
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
        accepted.extend(c for c, text, ids in zip(candidates, texts, encoded) if ids == [c] and text.strip())
    accepted = list(dict.fromkeys(accepted))
    return accepted[:wanted]


def framing_ids(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after any text (``[CLS]``/``[SEP]``, ``<s>``/``</s>``, …)."""
    sample = "attention"
    framed = tokenizer(sample)["input_ids"]
    body = tokenizer(sample, add_special_tokens=False)["input_ids"]
    for start in range(len(framed) - len(body) + 1):
        if framed[start : start + len(body)] == body:
            return framed[:start], framed[start + len(body) :]
    return [], []


def text_probe_batches(loaded: HFModel, length: int, sequences: int, *, seed: int, batch_size: int) -> list[ProbeBatch]:
    """Probe sequences from the tokenizer's ordinary tokens, inside its own framing (see :mod:`attnviz.heads.probes`)."""
    tokenizer = loaded.tokenizer
    prefix, suffix = framing_ids(tokenizer)
    if not prefix and tokenizer.bos_token_id is not None and not loaded.encoder_decoder:
        prefix = [tokenizer.bos_token_id]  # decoder-only LMs read [BOS] first, even when encode() omits it
    check_probe_fits(loaded, length, len(prefix) + len(suffix))
    rng = random.Random(seed)
    pool = ordinary_token_ids(tokenizer, rng, max(4 * length, length * sequences))
    if len(pool) < length:
        raise InputError(
            f"{loaded.name}'s vocabulary has only {len(pool)} ordinary tokens: use a probe length of at most "
            f"{len(pool)}"
        )
    blocks = [rng.sample(pool, length) for _ in range(sequences)]
    start_id = None
    if loaded.encoder_decoder:
        config: Any = loaded.model.config  # a transformers config
        start_id = config.decoder_start_token_id
        if start_id is None:
            start_id = tokenizer.pad_token_id
    result = []
    for chunk in chunks(blocks, batch_size):
        sources = [prefix + block + block + suffix for block in chunk]
        targets = [[start_id] + block + block for block in chunk] if start_id is not None else None
        result.append(
            ProbeBatch(
                batch=_probe_batch(loaded, sources, targets),
                length=length,
                source_start=len(prefix),
                target_start=1 if targets is not None else None,
            )
        )
    return result


def _probe_batch(loaded: HFModel, sources: list[list[int]], targets: list[list[int]] | None) -> EncodedBatch:
    """An :class:`EncodedBatch` of equal-length id lists (no padding needed)."""
    tokenizer = loaded.tokenizer
    special_ids = set(tokenizer.all_special_ids)

    def side(rows: list[list[int]]):
        ids = torch.tensor(rows, dtype=torch.long)  # [b, n]
        tokens = [token_strings(tokenizer, row) for row in rows]
        special = [[i in special_ids for i in row] for row in rows]
        words = [[None if flag else position for position, flag in enumerate(flags)] for flags in special]
        return ids, tokens, special, words

    ids, tokens, special, words = side(sources)
    device = loaded.device
    inputs = {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}
    batch = EncodedBatch(
        inputs=inputs, tokens=tokens, special=special, word_ids=words, truncated=[False] * len(sources)
    )
    if targets is not None:
        target_ids, batch.target_tokens, batch.target_special, batch.target_word_ids = side(targets)
        inputs["decoder_input_ids"] = target_ids.to(device)
        inputs["decoder_attention_mask"] = torch.ones_like(target_ids).to(device)
    return batch
