"""attnviz's attention core: the math (:mod:`.attention`) and its transformers hook (:mod:`.hf`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz.common.lazy import exports_by_module, lazy_exports

if TYPE_CHECKING:  # for type checkers and IDEs; at run time each name is imported on first use
    from attnviz.core.attention import AttentionContext as AttentionContext
    from attnviz.core.attention import AttentionObserver as AttentionObserver
    from attnviz.core.attention import AttentionSite as AttentionSite
    from attnviz.core.attention import HeadMask as HeadMask
    from attnviz.core.attention import attend as attend
    from attnviz.core.attention import repeat_kv as repeat_kv
    from attnviz.core.attention import softmax_pattern as softmax_pattern
    from attnviz.core.hf import ATTENTION_NAME as ATTENTION_NAME
    from attnviz.core.hf import CONTEXT_KWARG as CONTEXT_KWARG
    from attnviz.core.hf import register_attention as register_attention
    from attnviz.core.recorder import PatternRecorder as PatternRecorder
    from attnviz.core.stacks import STACKS as STACKS
    from attnviz.core.stacks import Stack as Stack
    from attnviz.core.stacks import stack_of as stack_of

#: public name -> module that defines it
_EXPORTS = exports_by_module(
    {
        "attnviz.core.attention": (
            "AttentionContext",
            "AttentionObserver",
            "AttentionSite",
            "HeadMask",
            "attend",
            "repeat_kv",
            "softmax_pattern",
        ),
        "attnviz.core.hf": ("ATTENTION_NAME", "CONTEXT_KWARG", "register_attention"),
        "attnviz.core.recorder": ("PatternRecorder",),
        "attnviz.core.stacks": ("STACKS", "Stack", "stack_of"),
    }
)

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
