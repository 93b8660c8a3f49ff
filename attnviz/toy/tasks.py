"""Synthetic tasks whose attention solution is known, and how their examples become token sequences.

=================  ==========================  =============================================
task               example (items → answer)    attention that solves it
=================  ==========================  =============================================
``copy``           3 1 4 → 3 1 4               output t looks at source item t (diagonal)
``reverse``        3 1 4 → 4 1 3               output t looks at source item n−1−t (anti-diagonal)
``sort``           3 1 4 → 1 3 4               output t looks at the next-larger source item
``previous-token`` a b c: label of c is b      position i looks at i−1
``induction``      x y a b c a b c: after the  the second "a" looks at the token after the first
                   second a comes b            "a" (prefix matching; needs two layers)
=================  ==========================  =============================================

``copy``, ``reverse`` and ``sort`` are sequence-to-sequence tasks; the other two
label every position of one sequence. How an example is laid out depends on the
architecture (``items`` x₁…xₙ, ``answer`` y₁…yₙ; ``·`` marks positions with no label):

* encoder-decoder: source ``x₁ … xₙ <eos>``; decoder input ``<bos> y₁ … yₙ``;
  labels ``y₁ … yₙ <eos>`` (decoder position t emits yₜ₊₁);
* decoder: ``<bos> x₁ … xₙ <sep> y₁ … yₙ``; labels ``· … · y₁ … yₙ <eos>`` (from ``<sep>`` on);
* encoder: ``<bos> x₁ … xₙ``; labels ``· y₁ … yₙ`` (one answer per position);
* labelling tasks (encoder or decoder): ``<bos> x₁ … xₙ`` with the task's labels.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, fields
from typing import ClassVar

from attnviz.common.errors import InputError
from attnviz.common.resources import require_memory
from attnviz.toy.tokenizer import BOS, EOS, SEP


@dataclass(frozen=True)
class TaskSettings:
    """What a task's random examples look like (stored in every toy checkpoint)."""

    # task name, one of TASKS
    task: str
    # fewest items in a sampled sequence (for induction: in the half that repeats)
    min_length: int
    # most items in a sampled sequence
    max_length: int
    # distinct symbols the items are drawn from
    num_symbols: int

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> TaskSettings:
        if not isinstance(values, dict) or set(values) != {f.name for f in fields(cls)}:
            raise InputError(f"task settings need exactly the fields {', '.join(f.name for f in fields(cls))}")
        return get_task(values["task"]).settings(values["min_length"], values["max_length"], values["num_symbols"])


#: what one symbol of a task's vocabulary costs before the model is built (strings and tokenizer tables)
BYTES_PER_SYMBOL = 400


@dataclass
class ToyExample:
    """One example as token strings: what the model reads, and the label of every output position."""

    source: list[str]  # encoder tokens (encoder-decoder), or the whole sequence (encoder-only, decoder-only)
    target: list[str] | None  # decoder input tokens of an encoder-decoder model
    labels: list[str | None]  # per output position (decoder side when there is one): token to predict, or None


class Task:
    """A synthetic task: random items, the right output for them, and the architectures it suits."""

    name: str = ""
    description: str = ""
    #: "seq2seq" (items → answer of the same length) or "labelling" (a label per position)
    kind: str = "seq2seq"
    default_architecture: str = "encoder-decoder"
    architectures: tuple[str, ...] = ("encoder", "decoder", "encoder-decoder")
    #: symbol alphabet: "digits" (0 1 2 …) or "letters" (a b c …)
    alphabet: str = "digits"
    default_lengths: tuple[int, int] = (3, 8)
    default_symbols: int = 10
    #: ToyConfig fields this task trains best with (the user's choices override them)
    model_defaults: ClassVar[dict] = {}
    #: training steps that reach the shipped accuracy with the default model
    default_steps: int = 600

    # -- settings ------------------------------------------------------------------------------

    def settings(
        self, min_length: int | None = None, max_length: int | None = None, num_symbols: int | None = None
    ) -> TaskSettings:
        """Validated settings; ``None`` picks the task's default."""
        low = self.default_lengths[0] if min_length is None else min_length
        high = self.default_lengths[1] if max_length is None else max_length
        symbols = self.default_symbols if num_symbols is None else num_symbols
        for name, value in (("min_length", low), ("max_length", high), ("num_symbols", symbols)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"{self.name}: {name} must be a whole number of at least 1 (got {value!r})")
        if low > high:
            raise InputError(
                f"{self.name}: the shortest length {low} is above the longest {high}: give lengths as MIN:MAX"
            )
        if symbols < 2:
            raise InputError(f"{self.name}: needs at least 2 symbols (got {symbols})")
        # each symbol is a string in the vocabulary, its tokenizer tables and a row of two embedding tables
        require_memory("num_symbols", symbols, symbols * BYTES_PER_SYMBOL, "the task's vocabulary")
        if self.alphabet == "letters" and symbols > 26:
            raise InputError(f"{self.name} uses the letters a–z: at most 26 symbols (got {symbols})")
        return TaskSettings(self.name, low, high, symbols)

    def symbols(self, settings: TaskSettings) -> list[str]:
        if self.alphabet == "letters":
            return [chr(ord("a") + i) for i in range(settings.num_symbols)]
        return [str(i) for i in range(settings.num_symbols)]

    def check_architecture(self, architecture: str) -> None:
        if architecture not in self.architectures:
            raise InputError(
                f"task {self.name} does not fit the {architecture} architecture: use {' or '.join(self.architectures)}"
            )

    # -- examples ---------------------------------------------------------------------------------

    def sample(self, rng: random.Random, settings: TaskSettings) -> list[str]:
        """Random items (uniform length in [min_length, max_length], symbols drawn with replacement)."""
        symbols = self.symbols(settings)
        length = rng.randint(settings.min_length, settings.max_length)
        return [rng.choice(symbols) for _ in range(length)]

    def answer(self, items: list[str]) -> list[str]:
        """The right output for ``items`` (sequence-to-sequence tasks)."""
        raise NotImplementedError

    def labels(self, tokens: list[str]) -> list[str | None]:
        """The label of every position of ``tokens`` (``<bos>`` first; labelling tasks)."""
        raise NotImplementedError

    def example(self, architecture: str, items: list[str], answer: list[str] | None = None) -> ToyExample:
        """Lay out ``items`` (and an ``answer``, default the right one) for ``architecture`` (see the module doc)."""
        if self.kind == "labelling":
            tokens = [BOS, *items]
            return ToyExample(tokens, None, self.labels(tokens))
        right = self.answer(items)
        answer = right if answer is None else answer
        # the labels are always the right answer, fitted to the length of the answer that is read
        emitted = _fit([*right, EOS], len(answer) + 1)
        if architecture == "encoder-decoder":
            return ToyExample([*items, EOS], [BOS, *answer], emitted)
        if architecture == "decoder":
            unscored: list[str | None] = [None] * (len(items) + 1)
            return ToyExample([BOS, *items, SEP, *answer], None, unscored + emitted)
        return ToyExample([BOS, *items], None, [None, *right])

    def sequence_lengths(self, settings: TaskSettings, architecture: str) -> int:
        """Longest sequence (per side) an example of ``settings`` has: sizes the position table."""
        longest = settings.max_length
        if self.kind == "labelling":
            return 1 + self.items_per_length * longest
        if architecture == "decoder":
            return 2 * longest + 2
        return longest + 1

    def max_items(self, architecture: str, positions: int) -> int:
        """Most items that fit in ``positions`` positions (longer inputs are truncated)."""
        if self.kind == "labelling" or architecture != "decoder":
            return positions - 1
        return (positions - 2) // 2

    #: most items per unit of length (induction: a prefix and the half twice)
    items_per_length: int = 1


class _SequenceTask(Task):
    """copy / reverse / sort: a 2 + 2 layer model with a 128-wide MLP learns them in a few hundred steps."""

    model_defaults: ClassVar[dict] = {"mlp_width": 128}


class CopyTask(_SequenceTask):
    name = "copy"
    description = "repeat the items (diagonal attention)"
    default_architecture = "decoder"

    def answer(self, items: list[str]) -> list[str]:
        return list(items)


class ReverseTask(_SequenceTask):
    name = "reverse"
    description = "reverse the items (anti-diagonal cross-attention)"
    default_architecture = "encoder-decoder"

    def answer(self, items: list[str]) -> list[str]:
        return list(reversed(items))


class SortTask(_SequenceTask):
    name = "sort"
    description = "sort the items (attention follows the sorting permutation)"
    default_architecture = "encoder-decoder"

    def answer(self, items: list[str]) -> list[str]:
        order = {symbol: _symbol_rank(symbol) for symbol in items}
        return sorted(items, key=order.__getitem__)


class PreviousTokenTask(Task):
    name = "previous-token"
    description = "label each position with the token before it (previous-token head)"
    kind = "labelling"
    default_architecture = "decoder"
    architectures = ("encoder", "decoder")
    alphabet = "letters"
    default_lengths = (4, 12)
    default_symbols = 10
    # one attention-only layer: the head that looks at i − 1 is the whole model
    model_defaults: ClassVar[dict] = {"num_layers": 1, "mlp_width": 0}

    def labels(self, tokens: list[str]) -> list[str | None]:
        return [None] + tokens[:-1]


class InductionTask(Task):
    name = "induction"
    description = "predict the token that followed the previous occurrence of the current one (induction head)"
    kind = "labelling"
    default_architecture = "decoder"
    architectures = ("decoder",)
    alphabet = "letters"
    default_lengths = (4, 8)
    default_symbols = 26
    items_per_length = 3  # a prefix of up to max_length symbols, then the half twice
    # Relative positions clipped at ±2 and no absolute positions: a head can find the earlier
    # occurrence only by content (prefix matching), and the previous-token head it composes
    # with is one learned offset away. An attention-only model forms the circuit in ~300 steps.
    model_defaults: ClassVar[dict] = {
        "attention": "relative",
        "max_relative_position": 2,
        "absolute_positions": False,
        "mlp_width": 0,
    }
    default_steps = 600

    def settings(self, min_length=None, max_length=None, num_symbols=None) -> TaskSettings:
        settings = super().settings(min_length, max_length, num_symbols)
        if 2 * settings.max_length > settings.num_symbols:
            raise InputError(
                f"induction draws a prefix and a repeated half of distinct symbols: twice the longest length "
                f"({2 * settings.max_length}) cannot exceed the number of symbols ({settings.num_symbols})"
            )
        return settings

    def sample(self, rng: random.Random, settings: TaskSettings) -> list[str]:
        """``p₁ … pₘ r₁ … rₙ r₁ … rₙ``: a random prefix (0 ≤ m ≤ max_length), then a random half twice.

        All symbols are distinct, so nothing but the earlier occurrence tells what comes next
        (with a fixed start, or repeated symbols, a model can get by with position or
        "which symbol has not come back yet" tricks instead of an induction head).
        """
        half = rng.randint(settings.min_length, settings.max_length)
        prefix = rng.randint(0, settings.max_length)
        symbols = rng.sample(self.symbols(settings), prefix + half)
        return symbols[:prefix] + symbols[prefix:] * 2

    def labels(self, tokens: list[str]) -> list[str | None]:
        """At a token seen before, the token after it; elsewhere nothing (the prefix and first half are random).

        For ``p₁ … pₘ r₁ … rₙ r₁ … rₙ`` these are the repeated half's positions ``rₖ`` (k < n), label ``rₖ₊₁``.
        """
        labels: list[str | None] = [None] * len(tokens)
        seen: set[str] = set()
        for position, token in enumerate(tokens):
            if token in seen and position + 1 < len(tokens):
                labels[position] = tokens[position + 1]
            seen.add(token)
        return labels


def _fit(labels: list[str], length: int) -> list[str | None]:
    """``labels`` cut or padded with ``None`` to ``length``."""
    return [*labels[:length], *[None] * (length - len(labels))]


def _symbol_rank(symbol: str) -> tuple[int, int | str]:
    """Digits sort numerically (2 < 10), anything else alphabetically."""
    return (0, int(symbol)) if symbol.isdigit() else (1, symbol)


TASKS: dict[str, Task] = {
    task.name: task for task in (CopyTask(), ReverseTask(), SortTask(), PreviousTokenTask(), InductionTask())
}
#: tasks on images, each trained as a small ViT (attnviz.toy.odd_patch) or ViT + GPT-2 captioner (attnviz.toy.caption)
IMAGE_TASKS: tuple[str, ...] = ("odd-patch", "caption")


def get_task(name: str) -> Task:
    """The task called ``name``; an unknown name raises :class:`InputError` listing the tasks."""
    if name not in TASKS:
        raise InputError(f"unknown task {name!r}: use one of {', '.join(TASKS)}")
    return TASKS[name]
