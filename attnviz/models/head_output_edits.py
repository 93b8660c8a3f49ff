"""Head editors applied where each head's output enters the model: at the input of its output projection.

A :class:`~attnviz.core.patching.HeadEditor` in an :class:`~attnviz.core.AttentionContext` reads or replaces
each head's output. Hugging Face models apply its output edits here, in a forward pre-hook on every site's output
projection (:mod:`attnviz.models.head_outputs`), on ``[b, q, h, dv]``, the projection's input ``[b, q, h·dv]``
cut by head: the vector that really enters the projection, after any gate or sub-norm, on models that run on
attnviz's core and on models that compute their attention in their own eager code alike. Pattern edits still
happen in the core (:class:`~attnviz.core.patching.PatternEdits`), which eager-only models never call.

Models on eager attention also hand norm-based weighting its value vectors from here (:func:`replay_fallback`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch import Tensor

from attnviz.common.errors import UnsupportedModelError
from attnviz.core import AttentionContext, AttentionSite
from attnviz.core.patching import HeadEditor, PatternEdits
from attnviz.models.eager_values import reading_values
from attnviz.models.head_outputs import OutputProjection, fallback_attentions


def _editing(editor: HeadEditor, projection: OutputProjection):
    def hook(module: Any, args: tuple) -> tuple:
        merged = args[0]  # [b, q, h·dv]
        heads = merged.reshape(merged.shape[0], -1, projection.heads, projection.head_dim).clone()  # [b, q, h, dv]
        edited = editor.edit_output(projection.site, heads)
        return (edited.reshape(merged.shape), *args[1:])

    return hook


def wants_values(context: AttentionContext | None) -> bool:
    """Whether an observer of ``context`` reads each call's value vectors (norm-based weighting)."""
    return context is not None and any(getattr(o, "accepts_values_only", False) for o in context.observers)


@contextlib.contextmanager
def at_output_projections(
    name: str,
    projections: Mapping[AttentionSite, OutputProjection],
    context: AttentionContext,
    *,
    fallback: bool,
    values: dict[AttentionSite, Tensor],
) -> Iterator[AttentionContext]:
    """While active, ``context``'s head editor edits each projection's input; yields the context for the core.

    ``fallback``: the model computes its attention in its own eager code; then ``values`` fills with each site's
    value vectors ``[b, k, h, dv]`` when an observer reads them (:func:`wants_values`).
    """
    editor = context.head_editor
    hooks = []
    with contextlib.ExitStack() as stack:
        if editor is not None:
            if fallback and any(editor.edits_patterns(site) for site in projections):
                raise UnsupportedModelError(
                    f"{name} computes its attention in transformers' own eager code (it does not call the attention "
                    "interface), so attnviz cannot replace its patterns; patch the heads' outputs instead"
                )
            for projection in projections.values():
                if projection.heads == 0:  # a layer whose heads were all pruned: nothing to edit
                    continue
                hooks.append(projection.module.register_forward_pre_hook(_editing(editor, projection)))
            stack.callback(lambda: [hook.remove() for hook in hooks])
            context = dataclasses.replace(context, head_editor=PatternEdits(editor))
        if fallback and wants_values(context):
            stack.enter_context(reading_values(dict(projections), values))
        yield context


def replay_fallback(
    outputs: Any, context: AttentionContext, encoder_decoder: bool, values: Mapping[AttentionSite, Tensor]
) -> None:
    """Hand the patterns that eager attention returned to the observers (models on eager attention), each site's
    value vectors ``[b, h, k, dv]`` first to the observers that read them."""
    for site, pattern in fallback_attentions(outputs, encoder_decoder):
        for observer in context.observers:
            if getattr(observer, "accepts_values_only", False) and site in values:
                value = values[site].transpose(1, 2)  # [b, h, k, dv]: one value head per query head
                getattr(observer, "observe_inputs")(site, None, None, value, None)  # noqa: B009 (optional method)
            observer.observe(site, pattern.float(), 0)


def run_editing(
    name: str,
    projections: Callable[[], Mapping[AttentionSite, OutputProjection]],
    context: AttentionContext | None,
    *,
    fallback: bool,
    run: Callable[[AttentionContext | None, dict[AttentionSite, Tensor]], Any],
) -> Any:
    """``run(context, values)`` with ``context``'s head editor at the output projections (see
    :func:`at_output_projections`); ``projections`` is asked only when something needs them."""
    if context is None or (context.head_editor is None and not (fallback and wants_values(context))):
        return run(context, {})
    values: dict[AttentionSite, Tensor] = {}
    with at_output_projections(name, projections(), context, fallback=fallback, values=values) as inner:
        return run(inner, values)
