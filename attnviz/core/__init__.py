"""attnviz's attention core: the math (:mod:`.attention`) and its transformers hook (:mod:`.hf`)."""

from attnviz.core.attention import (
    AttentionContext,
    AttentionObserver,
    AttentionSite,
    HeadMask,
    attend,
    repeat_kv,
    softmax_pattern,
)
from attnviz.core.hf import ATTENTION_NAME, CONTEXT_KWARG, register_attention

__all__ = [
    "ATTENTION_NAME",
    "CONTEXT_KWARG",
    "AttentionContext",
    "AttentionObserver",
    "AttentionSite",
    "HeadMask",
    "attend",
    "register_attention",
    "repeat_kv",
    "softmax_pattern",
]
