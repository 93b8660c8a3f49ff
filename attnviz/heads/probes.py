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

from dataclasses import dataclass

from attnviz.common.errors import InputError
from attnviz.common.resources import batch_memory, require_memory
from attnviz.models.base import LoadedModel
from attnviz.models.probing import ProbeBatch

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


def default_length(loaded: LoadedModel) -> int:
    """T when none is given: :data:`DEFAULT_LENGTH` (50), or less where the model reads fewer positions.

    Toy models use their task's longest sequence (the induction toy: 8), at most as many symbols as
    they have, so the probe looks like what they were trained on
    (:meth:`~attnviz.models.base.LoadedModel.default_probe_length`).
    """
    return loaded.default_probe_length(DEFAULT_LENGTH)


def resolve_settings(loaded: LoadedModel, settings: ProbeSettings) -> ProbeSettings:
    """``settings`` with the length filled in for ``loaded`` (see :func:`default_length`).

    Asked always, so a model that cannot be probed (a vision model) refuses here, before any progress line.
    """
    length = default_length(loaded)
    if settings.length is not None:
        return settings
    return ProbeSettings(length, settings.sequences, settings.seed, settings.batch_size)


def probe_batches(loaded: LoadedModel, settings: ProbeSettings) -> list[ProbeBatch]:
    """The probe sequences of ``settings`` for ``loaded``, in batches of ``settings.batch_size``.

    Each model builds them from its own vocabulary and framing
    (:meth:`~attnviz.models.base.LoadedModel.probe_batches`).
    """
    settings = resolve_settings(loaded, settings)
    assert settings.length is not None  # filled in by resolve_settings
    tokens = 2 * settings.length + 3  # the block twice and the framing tokens
    if loaded.max_length is not None:
        tokens = min(tokens, loaded.max_length)  # a longer probe is refused by the model itself
    # every probe batch is built before the first forward pass: refuse a count that cannot be held
    require_memory("sequences", settings.sequences, batch_memory(settings.sequences, tokens), "the probe sequences")
    return loaded.probe_batches(settings.length, settings.sequences, seed=settings.seed, batch_size=settings.batch_size)
