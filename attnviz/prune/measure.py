"""Cost of a model: parameter count and forward latency, measured side by side.

Latency is the median wall time of ``repeats`` forward passes (no gradients,
no observers, after warm-up passes) on one input of a fixed length. Models
compared are timed in alternation, round after round, so that drift of the
machine (frequency scaling, other processes) affects them alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from attnviz.errors import InputError
from attnviz.models.base import EncodedBatch, LoadedModel, parameter_count  # noqa: F401 (re-exported)


def text_latency_batch(loaded: LoadedModel, texts: Sequence[str], tokens: int) -> EncodedBatch:
    """One example of exactly ``tokens`` tokens (special tokens included), cut from ``texts`` repeated.

    Built from the tokenizer directly so that the cut is silent; capped at the model's maximum length.
    """
    tokenizer = getattr(loaded, "tokenizer", None)
    if tokenizer is None:
        return loaded.encode([" ".join(texts)], max_length=tokens)
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
        tokens=[tokenizer.convert_ids_to_tokens(ids)],
        special=[special],
        word_ids=[[None if flag else i for i, flag in enumerate(special)]],
        truncated=[True],
    )


def toy_latency_batch(loaded: LoadedModel, tokens: int, seed: int = 0) -> EncodedBatch:
    """One toy example of ``tokens`` random symbols (capped at the model's position table), on every input side."""
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


def output_tensor(outputs: Any) -> Tensor:
    """The main output tensor of a forward pass: logits, else the last hidden state, else the first entry."""
    if isinstance(outputs, Tensor):
        return outputs
    for name in ("logits", "last_hidden_state"):
        value = getattr(outputs, name, None)
        if isinstance(value, Tensor):
            return value
    if isinstance(outputs, dict):
        for name in ("logits", "last_hidden_state"):
            if isinstance(outputs.get(name), Tensor):
                return outputs[name]
    return outputs[0]


def forward_output(loaded: LoadedModel, batch: EncodedBatch, context=None) -> Tensor:
    """``loaded``'s main output on ``batch`` (logits for LMs), without gradients."""
    with torch.no_grad():
        try:
            outputs = loaded.forward(batch, context, logits=True)
        except TypeError:  # loaded models without an LM head option (toy models)
            outputs = loaded.forward(batch, context)
    return output_tensor(outputs).double()


def measure_latency(
    models: Sequence[LoadedModel], batch: EncodedBatch, *, repeats: int = 5, warmup: int = 2
) -> list[float]:
    """Median forward latency in milliseconds of each model on ``batch``, timed in alternation."""
    timings: list[list[float]] = [[] for _ in models]

    def run(loaded: LoadedModel) -> float:
        if loaded.device.type == "cuda":
            torch.cuda.synchronize(loaded.device)
        start = time.perf_counter()
        with torch.no_grad():
            loaded.forward(batch)
        if loaded.device.type == "cuda":
            torch.cuda.synchronize(loaded.device)
        return (time.perf_counter() - start) * 1000.0

    for _ in range(warmup):
        for loaded in models:
            run(loaded)
    for _ in range(repeats):
        for index, loaded in enumerate(models):
            timings[index].append(run(loaded))
    return [statistics.median(values) for values in timings]
