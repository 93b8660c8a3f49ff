"""The toy transformer: encoder-only, decoder-only or encoder-decoder, built from one :class:`ToyConfig`.

nanoGPT-style pre-LayerNorm blocks::

    x = x + SelfAttention(LN(x))
    x = x + CrossAttention(LN(x), encoder_output)     (encoder-decoder decoders only)
    x = x + MLP(LN(x))

Every attention call goes through :func:`attnviz.core.attend` with its
:class:`~attnviz.core.AttentionSite` and the forward's
:class:`~attnviz.core.AttentionContext`, so capture, statistics and head
masks see toy models exactly as they see pretrained ones. Sites: ``self.L`` for
encoder-only and decoder-only models; ``encoder.L``, ``decoder.L`` and
``cross.L`` for encoder-decoder models.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnviz.core import AttentionContext, AttentionSite, attend
from attnviz.models.slicing import slice_linear
from attnviz.toy.config import ToyConfig
from attnviz.toy.variants import AttentionVariant


@dataclass
class ToyOutput:
    """What a forward pass returns."""

    logits: Tensor  # [b, q, vocab]: next-token / label scores of the output side (decoder side if any)
    last_hidden_state: Tensor  # [b, q, width]: final residual stream after the last LayerNorm
    encoder_last_hidden_state: Tensor | None = None  # [b, k, width]: encoder output (encoder-decoder only)


def additive_mask(key_valid: Tensor, query_length: int, causal: bool, dtype: torch.dtype) -> Tensor:
    """``[b, 1, q, k]`` additive mask: 0 where a query may look, ``finfo.min`` at padding keys (and the future).

    ``key_valid``: ``[b, k]`` bool, True at real keys. Built from one boolean so that
    two hidden reasons never add up to ``-inf``.
    """
    visible = key_valid[:, None, None, :]  # [b, 1, 1, k]
    if causal:
        key_length = key_valid.shape[1]
        future = torch.ones(query_length, key_length, dtype=torch.bool, device=key_valid.device).triu(1)  # [q, k]
        visible = visible & ~future  # [b, 1, q, k]
    else:
        visible = visible.expand(-1, -1, query_length, -1)  # [b, 1, q, k]
    zeros = torch.zeros(visible.shape, dtype=dtype, device=key_valid.device)
    return zeros.masked_fill(~visible, torch.finfo(dtype).min)


class ToyAttention(nn.Module):
    """Multi-head attention: project to heads, attend through the core, concatenate, project out."""

    def __init__(self, config: ToyConfig, site: AttentionSite, cross: bool, layer_seed: int):
        super().__init__()
        self.site = site
        self.heads = config.heads_at(site.stack, site.layer)
        self.head_dim = config.head_dim
        inner = self.heads * self.head_dim
        self.query = _linear(config.width, inner)
        self.key = _linear(config.width, inner)
        self.value = _linear(config.width, inner)
        self.output = _linear(inner, config.width)
        self.variant = AttentionVariant(config, self.heads, self_attention=not cross, layer_seed=layer_seed)
        self.dropout = config.dropout

    def forward(
        self, x: Tensor, memory: Tensor | None, mask: Tensor | None, context: AttentionContext | None
    ) -> Tensor:
        """``x``: ``[b, q, width]`` (queries); ``memory``: ``[b, k, width]`` (keys; None: self-attention)."""
        source = x if memory is None else memory
        batch, query_length, _ = x.shape
        key_length = source.shape[1]
        h, d = self.heads, self.head_dim
        if h == 0:  # every head pruned away: only the output projection's bias is left
            return self.output(x.new_zeros(batch, query_length, 0))
        query = self.query(x).view(batch, query_length, h, d).transpose(1, 2)  # [b, q, h·d] -> [b, h, q, d]
        key = self.key(source).view(batch, key_length, h, d).transpose(1, 2)  # [b, k, h·d] -> [b, h, k, d]
        value = self.value(source).view(batch, key_length, h, d).transpose(1, 2)  # [b, k, h·d] -> [b, h, k, d]
        heads = attend(
            query,
            key,
            value,
            mask=mask,
            pattern_fn=self.variant.pattern_function(),
            dropout=self.dropout,
            training=self.training,
            site=self.site,
            context=context,
        )  # [b, q, h, d]
        merged = heads.reshape(batch, query_length, h * d)  # [b, q, h, d] -> [b, q, h·d]: concatenate the heads
        return self.output(merged)  # [b, q, width]

    def keep_heads(self, keep: list[int]) -> None:
        """Physically remove every head not in ``keep``: q/k/v rows, output columns, per-head variant parameters."""
        index = torch.as_tensor(keep, dtype=torch.long)
        rows = (index[:, None] * self.head_dim + torch.arange(self.head_dim)[None, :]).reshape(-1)  # [h'·d]
        for name in ("query", "key", "value"):
            setattr(self, name, slice_linear(getattr(self, name), rows, dim=0))
        self.output = slice_linear(self.output, rows, dim=1)
        self.variant.keep_heads(index)
        self.heads = len(keep)


def _linear(in_features: int, out_features: int, **kwargs) -> nn.Linear:
    """``nn.Linear``, quiet about zero-sized weights (a layer whose heads were all pruned)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return nn.Linear(in_features, out_features, **kwargs)


class MLP(nn.Module):
    def __init__(self, config: ToyConfig):
        super().__init__()
        self.up = nn.Linear(config.width, config.hidden_width)
        self.down = nn.Linear(config.hidden_width, config.width)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(nn.functional.gelu(self.up(x)))


class Block(nn.Module):
    """One pre-LayerNorm transformer layer (with cross-attention in encoder-decoder decoders)."""

    def __init__(self, config: ToyConfig, stack: str, layer: int, cross: bool):
        super().__init__()
        seed = {"self": 0, "encoder": 100, "decoder": 200}[stack] + layer
        self.attention_norm = nn.LayerNorm(config.width)
        self.attention = ToyAttention(config, AttentionSite(stack, layer), cross=False, layer_seed=seed)
        self.cross_norm = nn.LayerNorm(config.width) if cross else None
        self.cross_attention = (
            ToyAttention(config, AttentionSite("cross", layer), cross=True, layer_seed=300 + layer) if cross else None
        )
        # mlp_width 0: an attention-only transformer (the classic setting for induction heads)
        self.mlp_norm = nn.LayerNorm(config.width) if config.hidden_width else None
        self.mlp = MLP(config) if config.hidden_width else None
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: Tensor,
        self_mask: Tensor,
        memory: Tensor | None = None,
        cross_mask: Tensor | None = None,
        context: AttentionContext | None = None,
    ) -> Tensor:
        x = x + self.dropout(self.attention(self.attention_norm(x), None, self_mask, context))
        if self.cross_attention is not None and self.cross_norm is not None:
            x = x + self.dropout(self.cross_attention(self.cross_norm(x), memory, cross_mask, context))
        if self.mlp is None or self.mlp_norm is None:
            return x
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


class ToyTransformer(nn.Module):
    """Token + learned position embeddings, a stack of blocks (or two), a final LayerNorm and an output head."""

    def __init__(self, config: ToyConfig):
        super().__init__()
        config.validate()
        self.config = config
        arch = config.architecture
        self.token_embedding = nn.Embedding(config.vocab_size, config.width)
        self.position_embedding = (
            nn.Embedding(config.max_positions, config.width) if config.absolute_positions else None
        )
        self.embedding_dropout = nn.Dropout(config.dropout)
        # encoder-only: encoder blocks at sites self.L; decoder-only: decoder blocks at sites self.L
        single = arch != "encoder-decoder"
        self.encoder = (
            nn.ModuleList(
                Block(config, "self" if single else "encoder", layer, cross=False) for layer in range(config.num_layers)
            )
            if arch != "decoder"
            else None
        )
        self.decoder = (
            nn.ModuleList(
                Block(config, "self" if single else "decoder", layer, cross=not single)
                for layer in range(config.decoder_layers)
            )
            if arch != "encoder"
            else None
        )
        # encoder-decoder: the decoder's positions get their own table, and the encoder output its own LayerNorm
        self.decoder_position_embedding = (
            nn.Embedding(config.max_positions, config.width) if not single and config.absolute_positions else None
        )
        self.encoder_norm = nn.LayerNorm(config.width) if not single else None
        self.final_norm = nn.LayerNorm(config.width)
        self.lm_head = nn.Linear(config.width, config.vocab_size)
        self.apply(_init_weights)

    def attention_modules(self) -> dict[AttentionSite, ToyAttention]:
        """Every attention module by its site."""
        return {m.site: m for m in self.modules() if isinstance(m, ToyAttention)}

    def _embed(self, ids: Tensor, positions: nn.Embedding | None) -> Tensor:
        x = self.token_embedding(ids)  # [b, n, width]
        if positions is not None:
            x = x + positions(torch.arange(ids.shape[1], device=ids.device))[None]  # [1, n, width] broadcast
        return self.embedding_dropout(x)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        context: AttentionContext | None = None,
    ) -> ToyOutput:
        """``input_ids``/``attention_mask``: ``[b, n]`` (source side); ``decoder_*``: ``[b, m]`` (encoder-decoder)."""
        dtype = self.token_embedding.weight.dtype
        valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        if self.config.architecture != "encoder-decoder":
            causal = self.config.architecture == "decoder"
            blocks = self.decoder if causal else self.encoder
            mask = additive_mask(valid, input_ids.shape[1], causal, dtype)  # [b, 1, n, n]
            x = self._embed(input_ids, self.position_embedding)
            assert blocks is not None  # the stack this architecture has
            for block in blocks:
                x = block(x, mask, context=context)
            x = self.final_norm(x)
            return ToyOutput(self.lm_head(x), x)

        if decoder_input_ids is None:
            raise ValueError("an encoder-decoder toy model needs decoder_input_ids")
        decoder_valid = (
            torch.ones_like(decoder_input_ids, dtype=torch.bool)
            if decoder_attention_mask is None
            else decoder_attention_mask.bool()
        )
        target_length = decoder_input_ids.shape[1]
        encoder_mask = additive_mask(valid, input_ids.shape[1], False, dtype)  # [b, 1, n, n]
        decoder_mask = additive_mask(decoder_valid, target_length, True, dtype)  # [b, 1, m, m]
        cross_mask = additive_mask(valid, target_length, False, dtype)  # [b, 1, m, n]
        memory = self._embed(input_ids, self.position_embedding)
        assert self.encoder is not None and self.decoder is not None and self.encoder_norm is not None
        for block in self.encoder:
            memory = block(memory, encoder_mask, context=context)
        memory = self.encoder_norm(memory)
        x = self._embed(decoder_input_ids, self.decoder_position_embedding)
        for block in self.decoder:
            x = block(x, decoder_mask, memory, cross_mask, context=context)
        x = self.final_norm(x)
        return ToyOutput(self.lm_head(x), x, memory)


def _init_weights(module: nn.Module) -> None:
    """GPT-2 / nanoGPT initialisation: N(0, 0.02) weights, zero biases."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
