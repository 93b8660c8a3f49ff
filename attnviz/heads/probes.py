"""Probe inputs: repeated random tokens ``[BOS] r₁…r_T r₁…r_T`` built from a model's own vocabulary.

A probe sequence is a random block of ``T`` distinct ordinary tokens written twice, inside the
framing the model's tokenizer puts around any text:

* decoder-only models: ``[BOS] r₁…r_T r₁…r_T`` (the tokenizer's BOS token; none when it has none);
* BERT-like encoders: ``[CLS] r₁…r_T r₁…r_T [SEP]``, the tokenizer's own framing;
* encoder-decoder models: the encoder reads the framed sequence (BART: ``<s> … </s>``, T5:
  ``… </s>``), the decoder reads ``[decoder start] r₁…r_T r₁…r_T``;
* attnviz toy models: ``<bos> r₁…r_T r₁…r_T`` in the task's own symbols (decoder and encoder
  toys; encoder-decoder toys read ``r₁…r_T r₁…r_T <eos>`` and ``<bos> r₁…r_T r₁…r_T``).

``start`` is the position of ``r₁`` on each side (1 after a BOS/[CLS], else 0); the scores
in :mod:`attnviz.heads.scores` are defined from it. "Ordinary" tokens are never special
tokens, and — for sub-word vocabularies — only tokens that survive a round trip through
the tokenizer (``encode(decode([t])) == [t]``: no byte fragments, no ``##`` continuation
pieces, no ``[unused]`` slots), so the probe looks like text the model could have read.
Tokens within one block are distinct, so a block's only repetition is the second copy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from attnviz.errors import InputError
from attnviz.models.base import EncodedBatch, LoadedModel

#: Defaults: T = 50 random tokens written twice (101–103 positions), 16 sequences, seed 0.
DEFAULT_LENGTH = 50
DEFAULT_SEQUENCES = 16
DEFAULT_SEED = 0
#: Sequences per forward pass.
DEFAULT_BATCH_SIZE = 16
PROBE_KIND = "repeated-random-tokens"


@dataclass(frozen=True)
class ProbeSettings:
    """How the probe sequences are drawn."""

    length: int | None = None  # T: random tokens per block, written twice (None: the model's default)
    sequences: int = DEFAULT_SEQUENCES  # how many probe sequences
    seed: int = DEFAULT_SEED  # seed of the token draw
    batch_size: int = DEFAULT_BATCH_SIZE  # sequences per forward pass

    def __post_init__(self) -> None:
        for name, least in (("length", 2), ("sequences", 1), ("batch_size", 1)):
            value = getattr(self, name)
            if value is None and name == "length":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise InputError(f"probe {name} must be a whole number of at least {least}, got {value!r}")

    def record(self) -> dict:
        """The ``probe`` object of the JSON output."""
        return {"kind": PROBE_KIND, "length": self.length, "sequences": self.sequences, "seed": self.seed}


@dataclass
class ProbeBatch:
    """A batch of probe sequences and where ``r₁`` sits on each side."""

    batch: EncodedBatch
    length: int  # T
    source_start: int  # position of r₁ in the (encoder / only) sequence
    target_start: int | None = None  # position of r₁ in the decoder sequence (encoder-decoder models)

    def starts(self, stack: str) -> tuple[int, int]:
        """(query-side start, key-side start) of ``stack``."""
        if stack in ("self", "encoder"):
            return self.source_start, self.source_start
        assert self.target_start is not None
        if stack == "decoder":
            return self.target_start, self.target_start
        return self.target_start, self.source_start  # cross: decoder queries over encoder keys


def default_length(loaded: LoadedModel) -> int:
    """T when none is given: :data:`DEFAULT_LENGTH` (50), or less where the model reads fewer positions.

    Toy models use their task's longest sequence (the induction toy: 8), at most as many symbols as
    they have, so the probe looks like what they were trained on.
    """
    from attnviz.toy.loaded import ToyModel

    if isinstance(loaded, ToyModel):
        fits = (loaded.config.max_positions - 1) // 2
        return max(2, min(loaded.task_settings.max_length, len(loaded.tokenizer.symbols), fits))
    if loaded.max_length is not None:
        return max(2, min(DEFAULT_LENGTH, (loaded.max_length - 2) // 2))
    return DEFAULT_LENGTH


def resolve_settings(loaded: LoadedModel, settings: ProbeSettings) -> ProbeSettings:
    """``settings`` with the length filled in for ``loaded`` (see :func:`default_length`)."""
    if settings.length is not None:
        return settings
    return ProbeSettings(default_length(loaded), settings.sequences, settings.seed, settings.batch_size)


def probe_batches(loaded: LoadedModel, settings: ProbeSettings) -> list[ProbeBatch]:
    """The probe sequences of ``settings`` for ``loaded``, in batches of ``settings.batch_size``."""
    from attnviz.toy.loaded import ToyModel

    settings = resolve_settings(loaded, settings)
    if isinstance(loaded, ToyModel):
        return _toy_batches(loaded, settings)
    if not hasattr(loaded, "tokenizer"):
        raise InputError(f"{loaded.name}: attnviz can only probe Hugging Face and attnviz toy models")
    return _hf_batches(loaded, settings)


def _check_fits(loaded: LoadedModel, settings: ProbeSettings, framing: int) -> None:
    positions = 2 * settings.length + framing
    if loaded.max_length is not None and positions > loaded.max_length:
        most = (loaded.max_length - framing) // 2
        raise InputError(
            f"a probe of length {settings.length} needs {positions} positions but {loaded.name} reads at most "
            f"{loaded.max_length}: use a probe length of at most {most}"
        )


def _chunks(sequences: list, size: int) -> list[list]:
    return [sequences[start : start + size] for start in range(0, len(sequences), size)]


# -- Hugging Face models --------------------------------------------------------------------------------


def ordinary_token_ids(tokenizer, rng: random.Random, wanted: int) -> list[int]:
    """About ``wanted`` distinct random ids of ordinary tokens (see the module docstring), in draw order."""
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


def _framing(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after any text (``[CLS]``/``[SEP]``, ``<s>``/``</s>``, …)."""
    sample = "attention"
    framed = tokenizer(sample)["input_ids"]
    body = tokenizer(sample, add_special_tokens=False)["input_ids"]
    for start in range(len(framed) - len(body) + 1):
        if framed[start : start + len(body)] == body:
            return framed[:start], framed[start + len(body) :]
    return [], []


def _hf_batches(loaded, settings: ProbeSettings) -> list[ProbeBatch]:
    tokenizer = loaded.tokenizer
    prefix, suffix = _framing(tokenizer)
    if not prefix and tokenizer.bos_token_id is not None and not loaded.encoder_decoder:
        prefix = [tokenizer.bos_token_id]  # decoder-only LMs read [BOS] first, even when encode() omits it
    _check_fits(loaded, settings, len(prefix) + len(suffix))
    rng = random.Random(settings.seed)
    pool = ordinary_token_ids(tokenizer, rng, max(4 * settings.length, settings.length * settings.sequences))
    if len(pool) < settings.length:
        raise InputError(
            f"{loaded.name}'s vocabulary has only {len(pool)} ordinary tokens: use a probe length of at most "
            f"{len(pool)}"
        )
    blocks = [rng.sample(pool, settings.length) for _ in range(settings.sequences)]
    start_id = None
    if loaded.encoder_decoder:
        start_id = loaded.model.config.decoder_start_token_id
        if start_id is None:
            start_id = tokenizer.pad_token_id
    result = []
    for chunk in _chunks(blocks, settings.batch_size):
        sources = [prefix + block + block + suffix for block in chunk]
        targets = [[start_id] + block + block for block in chunk] if start_id is not None else None
        result.append(
            ProbeBatch(
                batch=_hf_batch(loaded, sources, targets),
                length=settings.length,
                source_start=len(prefix),
                target_start=1 if targets is not None else None,
            )
        )
    return result


def _hf_batch(loaded, sources: list[list[int]], targets: list[list[int]] | None) -> EncodedBatch:
    """An :class:`EncodedBatch` of equal-length id lists (no padding needed)."""
    tokenizer = loaded.tokenizer
    special_ids = set(tokenizer.all_special_ids)

    def side(rows: list[list[int]]):
        ids = torch.tensor(rows, dtype=torch.long)  # [b, n]
        tokens = [tokenizer.convert_ids_to_tokens(row) for row in rows]
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


# -- attnviz toy models ------------------------------------------------------------------------------------


def _toy_batches(loaded, settings: ProbeSettings) -> list[ProbeBatch]:
    from attnviz.toy.tasks import ToyExample
    from attnviz.toy.tokenizer import BOS, EOS

    architecture = loaded.config.architecture
    _check_fits(loaded, settings, 1)
    symbols = loaded.tokenizer.symbols
    rng = random.Random(settings.seed)
    result = []
    blocks = [
        rng.sample(symbols, settings.length)
        if settings.length <= len(symbols)
        else [rng.choice(symbols) for _ in range(settings.length)]
        for _ in range(settings.sequences)
    ]
    for chunk in _chunks(blocks, settings.batch_size):
        if architecture == "encoder-decoder":
            examples = [ToyExample([*b, *b, EOS], [BOS, *b, *b], [None] * (2 * len(b) + 1)) for b in chunk]
            starts = (0, 1)
        else:
            examples = [ToyExample([BOS, *b, *b], None, [None] * (2 * len(b) + 1)) for b in chunk]
            starts = (1, None)
        result.append(ProbeBatch(loaded.batch_examples(examples), settings.length, *starts))
    return result
