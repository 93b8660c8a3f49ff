"""Plugging the attention core into Hugging Face transformers (version 5).

transformers looks attention functions up by name in ``AttentionInterface``
and builds the attention mask with the function registered under the same name
in ``AttentionMaskInterface``. Both entries are needed: with no mask entry the
mask is skipped and a causal model silently attends to the future.

Registration is explicit: call :func:`register_attention` (the loader does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor, nn

from attnviz.core.attention import AttentionContext, attend, softmax_pattern

#: The name under which attnviz's core is registered. It must not contain
#: "sdpa", "flash" or "flex_attention": transformers pattern-matches those.
ATTENTION_NAME = "attnviz"

#: The forward keyword argument that carries the :class:`AttentionContext`.
CONTEXT_KWARG = "attnviz_context"
#: The attribute that carries it to attention modules whose callers drop the forward's keyword arguments
#: (GPT-2's cross-attention in transformers 5), set only for the duration of a call (:func:`context_on_modules`).
CONTEXT_ATTRIBUTE = "_attnviz_context"

_registered = False


def hf_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature, computed by :func:`attend`.

    ``query``: ``[b, h, q, d]``; ``key``/``value``: ``[b, kvh, k, d]`` and ``[b, kvh, k, dv]``; ``attention_mask``:
    additive ``[b, 1, q, k]`` (from ``eager_mask``) or ``None``; ``s_aux`` (keyword): per-head attention sink logits
    ``[h]`` (gpt-oss and the families that share its attention). Returns the output as ``[b, q, h, dv]`` and no
    weights (patterns go to the context's observers instead).
    """
    context: AttentionContext | None = kwargs.get(CONTEXT_KWARG)
    if context is None:
        context = getattr(module, CONTEXT_ATTRIBUTE, None)
    head_dim = query.shape[-1]
    scale = head_dim**-0.5 if scaling is None else scaling
    # T5 adds a relative-position bias to the scores; Gemma 2 soft-caps them; gpt-oss adds a sink to each row.
    pattern_fn = softmax_pattern(
        scale, bias=kwargs.get("position_bias"), softcap=kwargs.get("softcap"), sinks=kwargs.get("s_aux")
    )
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        # Some families hand over a boolean mask (True = may attend); make it additive.
        attention_mask = (~attention_mask).to(query.dtype) * torch.finfo(query.dtype).min
    if attention_mask is not None and attention_mask.shape[-1] != key.shape[-2]:
        attention_mask = attention_mask[..., : key.shape[-2]]
    site = context.site_of(module) if context is not None else None
    output = attend(
        query,
        key,
        value,
        mask=attention_mask,
        causal=_causal_without_mask(module, query, key, attention_mask, kwargs.get("is_causal")),
        pattern_fn=pattern_fn,
        dropout=dropout,
        training=module.training,
        site=site,
        context=context,
    )
    return output, None


def _causal_without_mask(
    module: nn.Module, query: Tensor, key: Tensor, attention_mask: Tensor | None, is_causal: bool | None
) -> bool:
    """Whether a call without a mask is causal: transformers' own rule for sdpa (``is_causal`` given, else the
    module's, else True; more than one query; no mask), for the calls :func:`core_mask` left without one."""
    if attention_mask is not None or query.shape[2] <= 1 or query.shape[2] != key.shape[2]:
        return False
    return bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))


def core_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    *,
    allow_is_causal_skip: bool = False,
    **kwargs,
) -> Tensor | None:
    """The mask transformers builds for attnviz's attention: ``None`` where the mask would be the plain causal
    triangle (as many keys as queries, no padding, no window: the core then applies causality itself without a
    ``[q, k]`` tensor, 268 MB at 8,192 tokens), else transformers' additive ``eager_mask``."""
    from transformers import masking_utils

    if allow_is_causal_skip and q_length == kv_length > 1 and q_offset == 0:
        padding = masking_utils.prepare_padding_mask(kwargs.get("attention_mask"), kv_length, kv_offset)
        window = kwargs.get("local_size")
        if (padding is None or bool(padding.all())) and (window is None or kv_length < window):
            return None
    return masking_utils.eager_mask(batch_size, q_length, kv_length, q_offset, kv_offset, **kwargs)


@contextlib.contextmanager
def context_on_modules(modules: Iterable[nn.Module], context: AttentionContext | None) -> Iterator[None]:
    """Hand ``context`` to ``modules`` as an attribute for the duration of the block (removed afterwards, also
    on error): for attention modules that their callers run without the forward's keyword arguments."""
    modules = list(modules) if context is not None else []
    for module in modules:
        setattr(module, CONTEXT_ATTRIBUTE, context)
    try:
        yield
    finally:
        for module in modules:
            if CONTEXT_ATTRIBUTE in vars(module):
                delattr(module, CONTEXT_ATTRIBUTE)


def register_attention() -> str:
    """Register the core with transformers under :data:`ATTENTION_NAME`; returns the name.

    Safe to call more than once.
    """
    global _registered
    if not _registered:
        from transformers import AttentionInterface, AttentionMaskInterface

        AttentionInterface.register(ATTENTION_NAME, hf_attention_forward)
        AttentionMaskInterface.register(ATTENTION_NAME, core_mask)
        _registered = True
    return ATTENTION_NAME
