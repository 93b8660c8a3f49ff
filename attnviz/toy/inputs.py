"""Inputs a toy model draws from its own symbols: the fixed-length timing input and the probes."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import torch

from attnviz.models.base import EncodedBatch
from attnviz.models.probing import ProbeBatch, check_probe_fits, chunks
from attnviz.toy.tasks import ToyExample
from attnviz.toy.tokenizer import BOS, EOS

if TYPE_CHECKING:  # ToyModel calls this module
    from attnviz.toy.loaded import ToyModel


def random_symbols_batch(loaded: ToyModel, tokens: int, seed: int) -> EncodedBatch:
    """``tokens`` random symbols drawn with ``seed`` (capped at the position table), on every input side."""
    tokenizer = loaded.tokenizer
    length = min(tokens, loaded.max_length or tokens)
    symbol_ids = torch.tensor(tokenizer.ids(list(tokenizer.symbols)), dtype=torch.long)  # [symbols]
    generator = torch.Generator().manual_seed(seed)
    ids = symbol_ids[torch.randint(len(symbol_ids), (1, length), generator=generator)]  # [1, length]
    valid = torch.ones_like(ids)  # [1, length]
    inputs = {"input_ids": ids, "attention_mask": valid}
    if loaded.encoder_decoder:
        inputs["decoder_input_ids"], inputs["decoder_attention_mask"] = ids.clone(), valid.clone()
    names = [[tokenizer.vocab[i] for i in ids[0].tolist()]]
    batch = EncodedBatch(
        inputs={key: value.to(loaded.device) for key, value in inputs.items()},
        tokens=names,
        special=[[False] * length],
        word_ids=[list(range(length))],
        truncated=[False],
    )
    if loaded.encoder_decoder:
        batch.target_tokens, batch.target_special, batch.target_word_ids = (
            names,
            [[False] * length],
            [list(range(length))],
        )
    return batch


def symbol_probe_batches(
    loaded: ToyModel, length: int, sequences: int, *, seed: int, batch_size: int
) -> list[ProbeBatch]:
    """Probe sequences in the task's own symbols (see :mod:`attnviz.heads.probes`): ``<bos>`` first, or for
    encoder-decoder toys ``r₁…r_T r₁…r_T <eos>`` read by the encoder and ``<bos> r₁…r_T r₁…r_T`` by the decoder."""
    architecture = loaded.config.architecture
    check_probe_fits(loaded, length, 1)
    symbols = loaded.tokenizer.symbols
    rng = random.Random(seed)
    result = []
    blocks = [
        rng.sample(symbols, length) if length <= len(symbols) else [rng.choice(symbols) for _ in range(length)]
        for _ in range(sequences)
    ]
    for chunk in chunks(blocks, batch_size):
        if architecture == "encoder-decoder":
            examples = [ToyExample([*b, *b, EOS], [BOS, *b, *b], [None] * (2 * len(b) + 1)) for b in chunk]
            starts: tuple[int, int | None] = (0, 1)
        else:
            examples = [ToyExample([BOS, *b, *b], None, [None] * (2 * len(b) + 1)) for b in chunk]
            starts = (1, None)
        result.append(ProbeBatch(loaded.batch_examples(examples), length, *starts))
    return result
