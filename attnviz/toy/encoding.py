"""Reading text into a toy model: parsing the toy vocabulary (items, and an answer after ``<sep>`` or as a
target), the length limit, the model's own greedy answer where none is given, and padding examples into a batch
with labels (see :mod:`attnviz.toy.loaded` for the layout). :class:`~attnviz.toy.loaded.ToyModel`'s ``encode``,
``generate`` and ``batch_examples`` call these."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnviz.common.errors import InputError, ParameterError
from attnviz.common.progress import warn
from attnviz.common.wording import plural
from attnviz.models.base import EncodedBatch
from attnviz.toy.tasks import ToyExample
from attnviz.toy.tokenizer import EOS, SEP, SPECIAL_TOKENS

if TYPE_CHECKING:  # ToyModel calls this module
    from attnviz.toy.loaded import ToyModel

#: label id that is not scored (PyTorch's cross-entropy default)
IGNORE = -100


def encode_toy_texts(
    loaded: ToyModel,
    texts: Sequence[str],
    *,
    targets: Sequence[str] | None = None,
    max_length: int | None = None,
    truncate: bool = True,
) -> EncodedBatch:
    """Tokenise texts of the toy vocabulary into a right-padded batch with labels (the layout:
    :mod:`attnviz.toy.loaded`)."""
    texts = list(texts)
    if not texts:
        raise InputError("no text given")
    if targets is not None:
        targets = list(targets)
        if loaded.toy_task.kind != "seq2seq" or loaded.config.architecture == "encoder":
            raise InputError(
                f"this toy {loaded.config.architecture} model ({loaded.task}) reads one sequence: a target applies "
                "only to sequence-to-sequence tasks on decoder or encoder-decoder models"
            )
        if len(targets) != len(texts):
            raise InputError("give one target per text")
    limit = min(loaded.config.max_positions, max_length or loaded.config.max_positions)
    items_limit = loaded.toy_task.max_items(loaded.config.architecture, limit)
    if items_limit < 1:
        raise ParameterError(
            "max_length", f"{{max_length}} {limit} leaves no room for a single symbol with this toy model", limit
        )
    parsed: list[tuple[list[str], list[str] | None]] = []
    truncated: list[bool] = []
    for index, text in enumerate(texts):
        items, answer = _parse(loaded, text)
        if targets is not None:
            if answer is not None:
                raise InputError("give the answer either after <sep> in the text or as a target, not both")
            answer = loaded.tokenizer.split(targets[index])
        cut = len(items) > items_limit
        if cut and not truncate:
            raise InputError(
                f"the text has {len(items)} symbols, more than the {items_limit} this toy model reads "
                f"(max length {limit}): shorten it or allow truncation"
            )
        items = items[:items_limit]
        if answer is not None:
            room = answer_room(loaded, len(items), limit)
            if len(answer) > room and not truncate:
                raise InputError(
                    f"the target has {len(answer)} symbols; only {room} fit next to the text within "
                    f"max length {limit}: shorten it or allow truncation"
                )
            cut = cut or len(answer) > room
            answer = answer[:room]
        truncated.append(cut)
        parsed.append((items, answer))
    if any(truncated):
        count = sum(truncated)
        warn(f"{plural(count, 'toy text')} longer than {limit} positions {'was' if count == 1 else 'were'} truncated")
    if loaded.toy_task.kind == "seq2seq" and loaded.config.architecture != "encoder":
        missing = [i for i, (_, answer) in enumerate(parsed) if answer is None]
        if missing:
            answers = greedy_answers(loaded, [parsed[i][0] for i in missing], max_length=limit)
            for i, answer in zip(missing, answers):
                parsed[i] = (parsed[i][0], answer)
    examples = [loaded.toy_task.example(loaded.config.architecture, items, answer) for items, answer in parsed]
    return batch_toy_examples(loaded, examples, truncated)


def greedy_answers(loaded: ToyModel, items: Sequence[list[str]], *, max_length: int | None = None) -> list[list[str]]:
    """The model's greedy answer to each item list (sequence-to-sequence tasks), ``<eos>`` left out.

    At most ``len(items) + 1`` tokens are generated per example (every task's answer has ``len(items)``).
    """
    limit = min(loaded.config.max_positions, max_length or loaded.config.max_positions)
    answers: list[list[str]] = [[] for _ in items]
    done = [False] * len(items)
    # only symbols and <eos> may be emitted
    allowed = torch.zeros(len(loaded.tokenizer), dtype=torch.bool)
    allowed[loaded.tokenizer.ids([EOS, *loaded.tokenizer.symbols])] = True
    eos_id = loaded.tokenizer.ids([EOS])[0]
    with torch.no_grad():
        while not all(done):
            examples = [loaded.toy_task.example(loaded.config.architecture, x, a) for x, a in zip(items, answers)]
            batch = batch_toy_examples(loaded, examples)
            logits = loaded.forward(batch).logits.float()  # [b, q, vocab]
            for i, example in enumerate(examples):
                if done[i]:
                    continue
                last = len(example.target if example.target is not None else example.source) - 1
                scores = logits[i, last].cpu().masked_fill(~allowed, -math.inf)
                token = int(scores.argmax())
                if token == eos_id:
                    done[i] = True
                else:
                    answers[i].append(loaded.tokenizer.vocab[token])
                    room = answer_room(loaded, len(items[i]), limit)
                    done[i] = len(answers[i]) >= min(room, len(items[i]) + 1)
    return answers


def batch_toy_examples(
    loaded: ToyModel, examples: Sequence[ToyExample], truncated: list[bool] | None = None
) -> EncodedBatch:
    """Pad examples on the right into an :class:`EncodedBatch` on the model's device."""
    source_ids, source_valid = _pad(loaded, [e.source for e in examples])
    labels, _ = _pad(loaded, [e.labels for e in examples], pad=IGNORE)
    inputs = {"input_ids": source_ids, "attention_mask": source_valid}
    tokens, special, word_ids = _annotate([e.source for e in examples])
    batch = EncodedBatch(
        inputs=inputs,
        tokens=tokens,
        special=special,
        word_ids=word_ids,
        truncated=truncated or [False] * len(examples),
    )
    if loaded.encoder_decoder:
        targets = [e.target for e in examples if e.target is not None]
        if len(targets) != len(examples):
            raise InputError("every example of an encoder-decoder toy model needs a target")
        target_ids, target_valid = _pad(loaded, targets)
        inputs["decoder_input_ids"] = target_ids
        inputs["decoder_attention_mask"] = target_valid
        batch.target_tokens, batch.target_special, batch.target_word_ids = _annotate(targets)
    inputs["labels"] = labels
    device = loaded.device
    batch.inputs = {key: value.to(device) for key, value in inputs.items()}
    return batch


def _pad(loaded: ToyModel, sequences: Sequence[Sequence[str | None]], pad: int | None = None) -> tuple[Tensor, Tensor]:
    """``[b, n]`` ids (right-padded) and ``[b, n]`` 1/0 validity; ``pad`` given: None entries become ``pad``."""
    width = max(len(s) for s in sequences)
    fill = loaded.tokenizer.pad_id if pad is None else pad
    ids = torch.full((len(sequences), width), fill, dtype=torch.long)
    valid = torch.zeros((len(sequences), width), dtype=torch.long)
    lookup = loaded.tokenizer.index
    for row, sequence in enumerate(sequences):
        values = [fill if t is None else lookup[t] for t in sequence]
        ids[row, : len(values)] = torch.tensor(values, dtype=torch.long)
        valid[row, : len(values)] = 1
    return ids, valid


def _parse(loaded: ToyModel, text: str) -> tuple[list[str], list[str] | None]:
    """Items of ``text``, and the answer after ``<sep>`` (decoder-only sequence-to-sequence models)."""
    takes_sep = loaded.toy_task.kind == "seq2seq" and loaded.config.architecture == "decoder"
    pieces = loaded.tokenizer.split(text, allow=(SEP,) if takes_sep else ())
    if SEP not in pieces:
        return pieces, None
    cut = pieces.index(SEP)
    items, answer = pieces[:cut], pieces[cut + 1 :]
    if not items or SEP in answer:
        raise InputError(f"write the items, then at most one {SEP} and the answer, e.g. '3 1 4 {SEP} 4 1 3'")
    return items, answer


def answer_room(loaded: ToyModel, num_items: int, limit: int) -> int:
    """Most answer tokens that fit next to ``num_items`` items within ``limit`` positions."""
    if loaded.config.architecture == "decoder":
        return max(0, limit - num_items - 2)
    return max(0, limit - 1)


def _annotate(sequences: Sequence[list[str]]) -> tuple[list[list[str]], list[list[bool]], list[list[int | None]]]:
    """Tokens, special flags, and word ids (each symbol is its own word; specials have None)."""
    tokens, special, word_ids = [], [], []
    for sequence in sequences:
        flags = [t in SPECIAL_TOKENS for t in sequence]
        words: list[int | None] = []
        count = 0
        for flag in flags:
            words.append(None if flag else count)
            count += 0 if flag else 1
        tokens.append(list(sequence))
        special.append(flags)
        word_ids.append(words)
    return tokens, special, word_ids
