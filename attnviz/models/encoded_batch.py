"""A padded batch of encoded examples (:class:`EncodedBatch`): what a model's forward pass reads, and what is needed
to read the attention patterns it produces. Every :class:`~attnviz.models.base.LoadedModel` encodes into one."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnviz.common.images import ImageGrid
from attnviz.core import AttentionSite
from attnviz.core.stacks import stack_of


@dataclass
class EncodedBatch:
    """A padded batch of examples, and what is needed to read the patterns it produces.

    Token lists are per example and unpadded; padding is always on the right, so
    token ``i`` of an example sits at position ``i`` of the padded sequence.
    For encoder-decoder models ``tokens`` is the source (encoder) side and
    ``target_*`` the decoder side.
    """

    inputs: dict[str, Tensor]  # keyword arguments of the model's forward
    tokens: list[list[str]]  # raw token strings (e.g. "Ġthe", "##ing")
    special: list[list[bool]]  # True where a token is a special token ([CLS], <s>, …)
    word_ids: list[list[int | None]]  # word index of each token; None for special tokens
    truncated: list[bool] = field(default_factory=list)  # example was cut to the maximum length
    target_tokens: list[list[str]] | None = None
    target_special: list[list[bool]] | None = None
    target_word_ids: list[list[int | None]] | None = None
    #: images (vision models): how the tokens cover the picture, the same for the whole batch
    image_grid: ImageGrid | None = None
    #: images (vision models): ``[b, H, W, 3]`` float32 0–1, each image as the model saw it (resized)
    images: Tensor | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def lengths(self) -> list[int]:
        return [len(t) for t in self.tokens]

    @property
    def target_lengths(self) -> list[int] | None:
        return None if self.target_tokens is None else [len(t) for t in self.target_tokens]

    def query_key_lengths(self, stack: str) -> tuple[list[int], list[int]]:
        """Per-example (query length, key length) of the patterns of ``stack``."""
        return stack_of(stack).pick(self.lengths, self.target_lengths)

    def query_key_tokens(self, stack: str) -> tuple[list[list[str]], list[list[str]]]:
        """Per-example (query tokens, key tokens) of ``stack``."""
        return stack_of(stack).pick(self.tokens, self.target_tokens)

    def query_key_special(self, stack: str) -> tuple[list[list[bool]], list[list[bool]]]:
        """Per-example (query special flags, key special flags) of ``stack``."""
        return stack_of(stack).pick(self.special, self.target_special)

    def key_padding_mask(self, stack: str) -> Tensor:
        """``[b, k]`` bool, True at real (non-padding) keys of ``stack``."""
        _, key_lengths = self.query_key_lengths(stack)
        width = max(key_lengths)
        return torch.arange(width)[None, :] < torch.tensor(key_lengths)[:, None]

    def token_widths(self) -> dict[str, int]:
        """``{stack: padded width}`` of the stacks whose keys are the batch's token ids (``self`` and ``encoder``:
        ``input_ids``; ``decoder``: ``decoder_input_ids``, else ``input_ids``); a stack whose keys are not read from
        token ids (pictures, audio frames, another side's tokens) is left out."""
        ids = self.inputs.get("input_ids")
        decoder = self.inputs.get("decoder_input_ids", ids)
        widths = {} if ids is None else {"self": int(ids.shape[1]), "encoder": int(ids.shape[1])}
        return widths | ({} if decoder is None else {"decoder": int(decoder.shape[1])})

    def check_keys_are_tokens(self, model_name: str, site: AttentionSite, keys: int) -> None:
        """Refuse, naming the site, a pattern over more keys than the batch has tokens where keys are its tokens:
        entries that are not tokens of the input (summaries of blocks of keys, memory or global tokens) have no
        place in a pattern over tokens, and dropping them would hide their weight."""
        from attnviz.common.errors import UnsupportedModelError

        width = self.token_widths().get(site.stack)
        if width is not None and keys > width:
            raise UnsupportedModelError(
                f"{model_name}: the attention of {site.stack}.{site.layer} reads {keys} keys where its input has "
                f"{width} tokens: it attends to entries that are not tokens of the input (compressed summaries of "
                "blocks of keys, memory or global tokens), which attnviz cannot show as a pattern over tokens"
            )
