"""attnviz's attention core: the math (:mod:`.attention`) and its transformers hook (:mod:`.hf`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz.common.lazy import lazy_exports

if TYPE_CHECKING:  # for type checkers and IDEs; at run time each name is imported on first use
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

#: public name -> module that defines it
_EXPORTS = {
    "ATTENTION_NAME": "attnviz.core.hf",
    "CONTEXT_KWARG": "attnviz.core.hf",
    "STACKS": "attnviz.core.stacks",
    "AttentionContext": "attnviz.core.attention",
    "AttentionObserver": "attnviz.core.attention",
    "AttentionSite": "attnviz.core.attention",
    "HeadMask": "attnviz.core.attention",
    "PatternRecorder": "attnviz.core.recorder",
    "Stack": "attnviz.core.stacks",
    "attend": "attnviz.core.attention",
    "register_attention": "attnviz.core.hf",
    "repeat_kv": "attnviz.core.attention",
    "softmax_pattern": "attnviz.core.attention",
    "stack_of": "attnviz.core.stacks",
}

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
