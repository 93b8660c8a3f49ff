"""Probe inputs as every model builds them: random blocks of ordinary tokens, each written twice.

What a probe is and how heads are scored on it is described in :mod:`attnviz.heads.probes`;
each model kind builds the sequences from its own vocabulary and framing
(:meth:`attnviz.models.base.LoadedModel.probe_batches`). This module holds what they share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnviz.common.errors import InputError
from attnviz.core.stacks import stack_of

if TYPE_CHECKING:  # the models call this module
    from attnviz.models.base import EncodedBatch, LoadedModel


@dataclass
class ProbeBatch:
    """A batch of probe sequences and where ``r₁`` sits on each side."""

    batch: EncodedBatch
    length: int  # T
    source_start: int  # position of r₁ in the (encoder / only) sequence
    target_start: int | None = None  # position of r₁ in the decoder sequence (encoder-decoder models)

    def starts(self, stack: str) -> tuple[int, int]:
        """(query-side start, key-side start) of ``stack``."""
        return stack_of(stack).pick(self.source_start, self.target_start)


def check_probe_fits(loaded: LoadedModel, length: int, framing: int) -> None:
    """Refuse a probe of ``length`` (plus ``framing`` special positions) longer than ``loaded`` reads."""
    positions = 2 * length + framing
    if loaded.max_length is not None and positions > loaded.max_length:
        most = (loaded.max_length - framing) // 2
        raise InputError(
            f"a probe of length {length} needs {positions} positions but {loaded.name} reads at most "
            f"{loaded.max_length}: use a probe length of at most {most}"
        )


def chunks(sequences: list, size: int) -> list[list]:
    """``sequences`` in consecutive runs of at most ``size``."""
    return [sequences[start : start + size] for start in range(0, len(sequences), size)]
