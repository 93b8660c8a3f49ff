"""The text side of a model that reads a picture or a sound and writes text about it (an image captioner, Whisper).

:class:`WritesText` is mixed into such a model's class: it turns a caption or a transcript into the decoder's
input (the model's prefix tokens, then the text's tokens: teacher forcing), names those tokens, and refuses a text
longer than the decoder's positions. Row ``t`` of the decoder and cross-attention is the query of target token
``t``, whose output predicts token ``t + 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attnviz.common.errors import InputError, UnsupportedModelError
from attnviz.models.encoded_batch import EncodedBatch

#: config fields that bound a decoder's positions, the first one set wins
_POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_target_positions")


def decoder_positions(config: Any) -> int | None:
    """The decoder's positions (prefix and text together) from its config; None when it has no limit."""
    limit = next(
        (getattr(config, field) for field in _POSITION_FIELDS if isinstance(getattr(config, field, None), int)), None
    )
    return limit if isinstance(limit, int) and 0 < limit < 1_000_000 else None


class WritesText:
    """What a model that writes a target text about its source shares (see the module docstring)."""

    name: str
    tokenizer: Any
    model: Any
    #: decoder positions (prefix + text); None when the decoder has no limit
    max_length: int | None
    #: what the text and the source are called in messages: ``caption`` of an ``image``, ``transcript`` of ``audio``
    text_name: str = "caption"
    source_name: str = "image"

    @property
    def start_id(self) -> int:
        """The decoder start token (the config's ``decoder_start_token_id``, else the tokenizer's BOS)."""
        for source in (self.model.config, getattr(self.model, "generation_config", None)):
            value = getattr(source, "decoder_start_token_id", None)
            if value is not None:
                return int(value)
        value = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.tokenizer.cls_token_id
        if value is None:
            raise UnsupportedModelError(
                f"{self.name}: its config names no decoder_start_token_id and its tokenizer no BOS token, so "
                f"the {self.text_name} cannot start"
            )
        return int(value)

    def decoder_prefix(self) -> list[int]:
        """The tokens every decoder input starts with: the start token (Whisper: its prompt tokens)."""
        return [self.start_id]

    def add_decoder_side(
        self,
        batch: EncodedBatch,
        targets: Sequence[str] | None = None,
        token_ids: Sequence[Sequence[int]] | None = None,
    ) -> EncodedBatch:
        """``batch`` with its decoder side: the prefix, then each text's tokens (teacher forcing), from ``targets``
        (texts) or ``token_ids``; else the prefix alone. Right-padded ``decoder_input_ids`` ``[b, t]``."""
        prefix = self.decoder_prefix()
        if token_ids is not None:
            rows = [[*prefix, *ids] for ids in token_ids]
        elif targets is None:
            rows = [list(prefix) for _ in range(len(batch))]
        else:
            targets = list(targets)
            if len(targets) != len(batch):
                raise self._one_text_each(len(batch), len(targets))
            rows = []
            for target in targets:
                if not target.strip():
                    raise InputError(f"the {self.text_name} is empty: give at least one word")
                rows.append([*prefix, *self.caption_ids(target)])
        if len(rows) != len(batch):
            raise self._one_text_each(len(batch), len(rows))
        self.check_caption_length(max(len(row) for row in rows), f"the {self.text_name}")
        width = max(len(row) for row in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else prefix[0]
        ids = torch.full((len(rows), width), pad, dtype=torch.long)  # [b, t], padded on the right
        mask = torch.zeros((len(rows), width), dtype=torch.long)  # [b, t]
        for index, row in enumerate(rows):
            ids[index, : len(row)] = torch.tensor(row)
            mask[index, : len(row)] = 1
        device = next(iter(batch.inputs.values())).device  # where the source side already is
        batch.inputs["decoder_input_ids"] = ids.to(device)
        batch.inputs["decoder_attention_mask"] = mask.to(device)
        labelled = [self.caption_tokens(row) for row in rows]
        batch.target_tokens = [tokens for tokens, _, _ in labelled]
        batch.target_special = [special for _, special, _ in labelled]
        batch.target_word_ids = [words for _, _, words in labelled]
        return batch

    def _one_text_each(self, sources: int, texts: int) -> InputError:
        return InputError(
            f"give one {self.text_name} per {self.source_name} ({sources} {self.source_name} inputs, {texts} "
            f"{self.text_name}s)"
        )

    def caption_ids(self, target: str) -> list[int]:
        """The token ids of ``target``; :class:`InputError` naming the words the tokenizer does not know
        (each would be its unknown token: the overlays of ``<unk>`` say nothing of the word)."""
        ids = list(self.tokenizer(target, add_special_tokens=False)["input_ids"])
        unknown_id = getattr(self.tokenizer, "unk_token_id", None)
        if unknown_id is None or unknown_id not in ids:
            return ids
        unknown = [
            word for word in target.split() if unknown_id in self.tokenizer(word, add_special_tokens=False)["input_ids"]
        ]
        vocabulary = sorted(
            token
            for token in self.tokenizer.get_vocab()
            if token not in set(getattr(self.tokenizer, "all_special_tokens", ()))
        )
        known = f": it knows {', '.join(vocabulary)}" if len(vocabulary) <= 40 else ""
        raise InputError(
            f"{self.name} does not know the word{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(word) for word in unknown or [target])} of the {self.text_name} (each would be read as "
            f"{self.tokenizer.unk_token}){known}"
        )

    def caption_tokens(self, ids: Sequence[int]) -> tuple[list[str], list[bool], list[int | None]]:
        """(token strings, special flags, word ids) of decoder token ``ids``."""
        from attnviz.common.tokens import token_strings, word_ids_from_markers

        tokens = token_strings(self.tokenizer, ids)  # byte-level tokens decoded, as every model encodes
        special_ids = set(self.tokenizer.all_special_ids) | set(self.decoder_prefix())
        special = [token_id in special_ids for token_id in ids]
        return tokens, special, word_ids_from_markers(tokens, special)

    def check_caption_length(self, positions: int, what: str) -> None:
        """Refuse ``positions`` decoder positions (prefix included) beyond what the decoder allows."""
        if self.max_length is not None and positions > self.max_length:
            raise InputError(
                f"{what} needs {positions} decoder positions (the start token included), but {self.name}'s decoder "
                f"allows {self.max_length}: give a shorter {self.text_name}"
            )

    def decoder_arguments(self, context: Any) -> dict[str, Any]:
        """The forward's arguments that carry ``context`` to the decoder when the encoder's output is given."""
        from attnviz.core import CONTEXT_KWARG

        return {CONTEXT_KWARG: context}

    def encode_source(self, batch: EncodedBatch, context: Any) -> Any:
        """The encoder's output for ``batch``'s source side (its attention through ``context``)."""
        raise NotImplementedError

    def cross_context(self, context: Any) -> Any:
        """A context manager around a run: some decoders need the context put on their cross-attention modules."""
        import contextlib

        return contextlib.nullcontext()
