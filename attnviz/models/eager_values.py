"""The value vectors of models that compute their attention in their own eager code (GPT-Neo, BLOOM, Falcon, …).

attnviz's core hands norm-based weighting each call's values; these models never call it. Their values are read
instead by running each attention module a second time, right after its own call, with its softmax replaced by the
identity pattern: every position's output is then its own value vector ``x_j W_V^h + b_V^h``, read at the input of
the output projection (:mod:`attnviz.models.head_outputs`). The model's own outputs are left unchanged, and
transformers' output-recording hooks do not see the second run.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from attnviz.core import AttentionSite

if TYPE_CHECKING:
    from attnviz.models.head_outputs import OutputProjection

#: what sits between the attention and the output projection when no module call shows it (an inline gate)
QUERY_DEPENDENT = "a query-dependent change of each head's output (a gate or a normalisation)"
#: the functions an eager attention computes its pattern with
SOFTMAXES = {torch.softmax, torch.nn.functional.softmax, Tensor.softmax, torch.Tensor.softmax}


class _IdentityPattern(TorchFunctionMode):
    """Replaces softmax call number ``index`` by the identity pattern: each query then outputs its own value."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        self.calls = 0
        self.applied = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func in SOFTMAXES:
            self.calls += 1
            if self.calls - 1 == self.index and result.shape[-1] == result.shape[-2]:  # queries = keys
                eye = torch.eye(result.shape[-1], dtype=result.dtype, device=result.device)
                result = eye.expand(result.shape).contiguous()
                self.applied = True
        return result


@contextlib.contextmanager
def reading_values(projections: dict[AttentionSite, OutputProjection], values: dict[AttentionSite, Tensor]):
    """While active, every fallback site's module runs a second time after its own call, with the identity pattern,
    and ``values[site]`` gets each head's value vectors as its projection sees them, ``[b, k, h, dv]``.
    The model's own outputs are unchanged."""
    hooks = []
    running: set[nn.Module] = set()
    for site, projection in projections.items():
        if projection.rerun is None:
            continue

        def after(module, args, kwargs, output, site=site, projection=projection):
            if module in running:
                return
            seen: list[Tensor] = []
            grab = projection.module.register_forward_pre_hook(lambda _, inputs: seen.append(inputs[0].detach()))
            running.add(module)
            try:
                with _IdentityPattern(projection.softmax_index) as identity, _forward_hooks_off(module):
                    module(*args, **kwargs)
            finally:
                running.discard(module)
                grab.remove()
            if seen and identity.applied:
                head = seen[0]  # [b, k, h·dv]
                values[site] = head.reshape(*head.shape[:-1], projection.heads, projection.head_dim)
            return

        hooks.append(projection.rerun.register_forward_hook(after, with_kwargs=True))
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


@contextlib.contextmanager
def _forward_hooks_off(module: nn.Module) -> Iterator[None]:
    """The forward hooks of ``module`` and its submodules left out for a while: transformers records attention
    weights and hidden states with such hooks, and the second run must not add to what the model returns."""
    saved = [(sub, sub._forward_hooks, sub._forward_hooks_with_kwargs) for sub in module.modules()]
    for sub, _, _ in saved:
        sub._forward_hooks, sub._forward_hooks_with_kwargs = OrderedDict(), OrderedDict()
    try:
        yield
    finally:
        for sub, hooks, with_kwargs in saved:
            sub._forward_hooks, sub._forward_hooks_with_kwargs = hooks, with_kwargs


def checked_fallback(loaded, batch, projections, patterns, entering) -> dict[AttentionSite, OutputProjection]:
    """Fallback sites are ``direct`` when the projection's input equals ``Σ_j α_ij v_j`` with the values read by
    :func:`reading_values` (``patterns``: ``[b, h, q, k]``, ``entering``: the inputs ``[b, q, h·dv]`` of the probe)."""
    values: dict[AttentionSite, Tensor] = {}
    with torch.no_grad(), reading_values(projections, values):
        loaded.forward(batch)
    checked = {}
    for site, projection in projections.items():
        value = values.get(site)  # [b, k, h, dv]
        direct = value is not None
        if value is not None:
            expected = torch.einsum("bhqk,bkhd->bqhd", patterns[site].float(), value.float())  # [b, q, h, dv]
            given = entering[site].float().reshape(expected.shape)
            scale = float(expected.abs().max()) or 1.0
            direct = float((given - expected).abs().max()) <= 1e-4 * scale
        between = "" if direct else QUERY_DEPENDENT
        if value is None:
            between = "attention computed in the model's own eager code, whose value vectors attnviz cannot read here"
        checked[site] = dataclasses.replace(projection, direct=direct, between=between)
    return checked
