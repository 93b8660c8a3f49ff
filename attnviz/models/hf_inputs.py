"""Inputs built from a Hugging Face tokenizer directly, where :meth:`HFModel.encode` would not fit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from attnviz.errors import InputError
from attnviz.models.base import EncodedBatch

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
        tokens=[tokenizer.convert_ids_to_tokens(ids)],
        special=[special],
        word_ids=[[None if flag else i for i, flag in enumerate(special)]],
        truncated=[True],
    )
