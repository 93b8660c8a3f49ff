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

from attnviz.common.errors import UnsupportedModelError
from attnviz.core.attention import AttentionContext, AttentionSite, attend, softmax_pattern
from attnviz.core.hf_mask import LayoutMask, core_mask
from attnviz.core.key_range import KeyLayout
from attnviz.core.stacks import stack_of

#: The name under which attnviz's core is registered. It must not contain
#: "sdpa", "flash" or "flex_attention": transformers pattern-matches those.
ATTENTION_NAME = "attnviz"

#: The forward keyword argument that carries the :class:`AttentionContext`.
CONTEXT_KWARG = "attnviz_context"
#: The attribute that carries it to attention modules whose callers drop the forward's keyword arguments
#: (GPT-2's cross-attention in transformers 5), set only for the duration of a call (:func:`context_on_modules`).
CONTEXT_ATTRIBUTE = "_attnviz_context"

_registered = False

#: keyword arguments some families hand their attention function that change its numbers and that the core does
#: not apply (each with what it is): such a call is refused, never computed without them
UNAPPLIED_ARGUMENTS = {"sinks": "per-token attention sinks computed from the hidden states"}


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
    for name, what in UNAPPLIED_ARGUMENTS.items():
        if kwargs.get(name) is not None:
            raise UnsupportedModelError(
                f"{type(module).__name__} passes {what} ({name!r}) to its attention function, "
                "which attnviz's attention core does not apply: attnviz refuses this model rather than show other "
                "numbers than it computes"
            )
    context: AttentionContext | None = kwargs.get(CONTEXT_KWARG)
    if context is None:
        context = getattr(module, CONTEXT_ATTRIBUTE, None)
    head_dim = query.shape[-1]
    scale = head_dim**-0.5 if scaling is None else scaling
    # T5 adds a relative-position bias to the scores; Gemma 2 soft-caps them; gpt-oss adds a sink to each row.
    pattern_fn = softmax_pattern(
        scale, bias=kwargs.get("position_bias"), softcap=kwargs.get("softcap"), sinks=kwargs.get("s_aux")
    )
    layout: KeyLayout | None = None  # the mask said in words (a LayoutMask of this call's shape)
    if isinstance(attention_mask, LayoutMask):
        shaped = tuple(attention_mask.shape[-2:]) == (query.shape[2], key.shape[2])
        if attention_mask.described and shaped and attention_mask.shape[0] in (1, query.shape[0]):
            layout, attention_mask = attention_mask.key_layout.to(query.device), None
        else:
            attention_mask = attention_mask.dense()
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
        mask=layout if layout is not None else attention_mask,
        causal=layout is None
        and _causal_without_mask(module, query, key, attention_mask, kwargs.get("is_causal"), site),
        pattern_fn=pattern_fn,
        dropout=dropout,
        training=module.training,
        site=site,
        context=context,
    )
    return output, None


def _causal_without_mask(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    attention_mask: Tensor | None,
    is_causal: bool | None,
    site: AttentionSite | None = None,
) -> bool:
    """Whether a call without a mask is causal: transformers' own rule for sdpa (``is_causal`` given, else the
    module's, else True; more than one query; no mask), for the calls :func:`core_mask` left without one. A
    decoder's self-attention always is, whatever its module says (NLLB-MoE's decoder modules say ``is_causal =
    False``, and only eager's explicit mask kept them causal)."""
    if attention_mask is not None or query.shape[2] <= 1 or query.shape[2] != key.shape[2]:
        return False
    if site is not None and stack_of(site.stack).always_causal:
        return True
    return bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))


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
