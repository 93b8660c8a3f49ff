"""Encoding texts for a Hugging Face model (:meth:`HFModel.encode`): token strings, special flags and word ids
beside the tensors, the model's length limit (truncation with a warning, or a refusal), and an encoder-decoder's
decoder side (the start token alone, or target texts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from attnviz.common.errors import InputError, ModelSpecError, ParameterError
from attnviz.common.progress import warn
from attnviz.common.tokens import token_strings
from attnviz.common.wording import plural
from attnviz.models.base import EncodedBatch

if TYPE_CHECKING:  # HFModel calls this module
    from attnviz.models.hf import HFModel


def encode_texts(
    loaded: HFModel,
    texts: Sequence[str],
    *,
    targets: Sequence[str] | None = None,
    max_length: int | None = None,
    truncate: bool = True,
) -> EncodedBatch:
    """``texts`` (and an encoder-decoder's ``targets``) as one padded batch on the model's device."""
    texts = list(texts)
    if not texts:
        raise InputError("no text given")
    for text in texts:
        if not text.strip():
            raise InputError("the text is empty: give at least one word")
    enc, tokens, special, word_ids, truncated = _tokenize(loaded, texts, max_length, truncate, "text")
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    batch = EncodedBatch(inputs=inputs, tokens=tokens, special=special, word_ids=word_ids, truncated=truncated)
    if loaded.encoder_decoder:
        if targets is None:
            start = loaded.model.config.decoder_start_token_id
            if start is None:
                start = loaded.tokenizer.pad_token_id
            inputs["decoder_input_ids"] = torch.full((len(texts), 1), start, dtype=torch.long)
            inputs["decoder_attention_mask"] = torch.ones((len(texts), 1), dtype=torch.long)
            start_token = token_strings(loaded.tokenizer, [start])[0]
            batch.target_tokens = [[start_token] for _ in texts]
            batch.target_special = [[True] for _ in texts]
            batch.target_word_ids = [[None] for _ in texts]
        else:
            targets = list(targets)
            if len(targets) != len(texts) or any(not t.strip() for t in targets):
                raise InputError("give one non-empty target text per source text")
            tenc, ttokens, tspecial, twords, _ = _tokenize(loaded, targets, max_length, truncate, "target text")
            inputs["decoder_input_ids"] = tenc["input_ids"]
            inputs["decoder_attention_mask"] = tenc["attention_mask"]
            batch.target_tokens, batch.target_special, batch.target_word_ids = ttokens, tspecial, twords
    elif targets is not None:
        raise ParameterError(
            "targets", f"{loaded.name} is not an encoder-decoder model: {{targets}} applies only to those"
        )
    device = loaded.device
    batch.inputs = {k: v.to(device) for k, v in inputs.items()}
    return batch


def _check_ids_fit(loaded: HFModel, ids: Sequence[Sequence[int]]) -> None:
    """Refuse ids past the embedding table: a tokenizer whose ids skip numbers (or a mismatched one) can
    give them even when it has no more tokens than the table has rows (``check_weights`` sees only the count)."""
    rows = getattr(loaded.model.get_input_embeddings(), "num_embeddings", None)
    largest = max((max(row) for row in ids if row), default=-1)
    if isinstance(rows, int) and largest >= rows:
        token = loaded.tokenizer.convert_ids_to_tokens([largest])[0]
        raise ModelSpecError(
            f"the tokenizer of model {loaded.name!r} gives id {largest:,} ({token!r}) but its embedding table has "
            f"only {rows:,} rows: give the tokenizer that came with the weights"
        )


def _tokenize(loaded: HFModel, texts: Sequence[str], max_length: int | None, truncate: bool, what: str):
    """(the tokenizer's padded encoding, token strings, special flags, word ids, which texts were truncated)."""
    tokenizer = loaded.tokenizer
    limit = min(x for x in (max_length, loaded.max_length) if x) if (max_length or loaded.max_length) else None
    # verbose=False: attnviz says itself what a text longer than the limit becomes (below), not transformers' logger
    full = tokenizer(list(texts), add_special_tokens=True, verbose=False)["input_ids"]
    _check_ids_fit(loaded, full)
    truncated = [limit is not None and len(ids) > limit for ids in full]
    if any(truncated):
        longest = max(len(ids) for ids in full)
        if not truncate:
            raise ParameterError(
                "max_length",
                f"{what} has {longest} tokens, more than the limit of {limit}: "
                "shorten it, raise {max_length}, or allow truncation",
                limit,
            )
        count = sum(truncated)
        warn(f"{plural(count, what)} longer than {limit} tokens {'was' if count == 1 else 'were'} truncated to {limit}")
    enc = tokenizer(
        list(texts),
        padding=True,
        truncation=limit is not None,
        max_length=limit,
        return_tensors="pt",
        return_special_tokens_mask=True,
    )
    tokens, special, word_ids = [], [], []
    for i in range(len(texts)):
        length = int(enc["attention_mask"][i].sum())
        ids = enc["input_ids"][i, :length].tolist()
        tokens.append(token_strings(tokenizer, ids))
        special.append([bool(s) for s in enc["special_tokens_mask"][i, :length].tolist()])
        try:
            words = enc.word_ids(i)[:length]
        except (ValueError, AttributeError):  # slow tokenizers have no word ids
            words = list(range(length))
        word_ids.append([None if s else w for w, s in zip(words, special[-1])])
    return enc, tokens, special, word_ids, truncated
