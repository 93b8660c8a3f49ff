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
from attnviz.core.recorder import PatternRecorder
from attnviz.core.stacks import STACKS, Stack, stack_of

__all__ = [
    "ATTENTION_NAME",
    "CONTEXT_KWARG",
    "STACKS",
    "AttentionContext",
    "AttentionObserver",
    "AttentionSite",
    "HeadMask",
    "PatternRecorder",
    "Stack",
    "attend",
    "register_attention",
    "repeat_kv",
    "softmax_pattern",
    "stack_of",
]
