"""Where each head's output really enters the residual stream: the input of the attention's output projection.

Every attention layer ends in an output projection that reads the heads' outputs concatenated,
``[..., heads × v_head_dim]`` (LLaMA's ``o_proj``, GPT-2's ``c_proj``, BERT's ``attention.output.dense``, T5's
``o``, OPT's ``out_proj``, GPT-NeoX's ``dense``, DistilBERT's ``out_lin``, ModernBERT's ``Wo``, …), head ``h`` in
features ``h·dv … h·dv+dv−1``. Some models change the heads' outputs between the attention and that projection
(Qwen3-Next's sigmoid gate per head, BitNet's sub-norm): what patching replaces, ablation zeroes and direct
logit attribution reads is therefore the projection's *input*, not the attention function's output.

The projection is found by watching one probe forward pass, for every family alike: it is the first linear layer
(``nn.Linear`` or GPT-2's ``Conv1D``) applied after the site's attention, inside the attention module's parent,
and it must read ``heads × v_head_dim`` features. The attention's moment is its call of attnviz's core; models
that compute their attention in their own eager code (GPT-Neo, BLOOM, Falcon, DeBERTa-v2, MPNet: the
*fallback*) are placed by the last softmax inside the module that returns the site's attention weights.

:class:`OutputProjection` also says whether the projection's input *is* the heads' attention output
(``direct``): ``Σ_j α_ij v_j`` per head, compared on the probe. Norm-based weighting needs that (a gate or a
norm that depends on the query makes a key's share of the output something other than ``α_ij ‖v_j W_O^h‖``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from attnviz.common.errors import UnsupportedModelError
from attnviz.core import AttentionContext, AttentionSite
from attnviz.core.attention import repeat_kv
from attnviz.models.blocked import unblock_local_pattern
from attnviz.models.eager_values import QUERY_DEPENDENT, SOFTMAXES, checked_fallback
from attnviz.models.placement import held_weight

if TYPE_CHECKING:
    from attnviz.models.base import LoadedModel


@dataclass(frozen=True)
class OutputProjection:
    """One site's output projection: the module whose input holds every head's output, head-major."""

    site: AttentionSite
    module: Any  # nn.Linear (weight [out, in]) or GPT-2's Conv1D (weight [in, out])
    name: str  # its qualified name in the model
    heads: int  # query heads
    head_dim: int  # features per head in the projection's input (the value head size)
    #: True when the input is exactly the heads' attention outputs (nothing in between; checked on a probe)
    direct: bool
    #: what sits between the attention and the projection, in words (empty when ``direct``)
    between: str = ""
    #: fallback sites: the module to run again with identity patterns to read the value vectors, and which
    #: softmax call (counted from that module's start) computes the pattern
    rerun: Any = None
    softmax_index: int = -1

    def matrix(self) -> Tensor:
        """``W`` ``[width, h·dv]``: the projection as applied to the concatenated heads (detached)."""
        weight = held_weight(self.module, "weight")  # read back from the disk where accelerate offloaded it
        assert weight is not None  # a linear layer has one
        return weight if isinstance(self.module, nn.Linear) else weight.t()

    def bias(self) -> Tensor | None:
        return held_weight(self.module, "bias")

    def slices(self) -> Tensor:
        """``[h, dv, width]`` float32: head ``h``'s ``W_O^h`` (``concat(z) W = Σ_h z_h W_O^h``), a view of a float32
        weight (no copy)."""
        by_input = self.matrix().float().t()  # [h·dv, width]
        return by_input.reshape(self.heads, self.head_dim, by_input.shape[1])


def is_linear(module: nn.Module) -> bool:
    """An ``nn.Linear`` (subclasses included) or a transformers ``Conv1D`` (GPT-2's linear layer, weight ``[in, out]``)."""
    return isinstance(module, nn.Linear) or (type(module).__name__ == "Conv1D" and hasattr(module, "nf"))


def in_features(module: nn.Module) -> int:
    weight: Any = module.weight
    return int(weight.shape[1] if isinstance(module, nn.Linear) else weight.shape[0])


def fallback_attentions(
    outputs: Any, encoder_decoder: bool, *, blocked: bool = False
) -> Iterator[tuple[AttentionSite, Tensor]]:
    """``(site, pattern [b, h, q, k])`` of every layer whose weights eager attention returned (fallback path);
    ``blocked``: LongT5's local patterns as the model returned them, ``[b, blocks, h, block, 3·block]``."""
    groups = (
        [("encoder", "encoder_attentions"), ("decoder", "decoder_attentions"), ("cross", "cross_attentions")]
        if encoder_decoder
        else [("self", "attentions")]
    )
    for stack, attribute in groups:
        for layer, pattern in enumerate(getattr(outputs, attribute, None) or ()):
            if pattern.dim() == 5 and not blocked:  # LongT5's local attention: [b, blocks, h, block, 3·block]
                states = getattr(outputs, "encoder_last_hidden_state", None)
                if states is None:
                    states = outputs.last_hidden_state
                pattern = unblock_local_pattern(pattern, states.shape[1])  # [b, h, q, k]
            yield AttentionSite(stack, layer), pattern


class _Timeline(TorchFunctionMode):
    """Numbers the events of one probe pass: module entries and exits, linear inputs, softmax calls."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = itertools.count()
        self.softmaxes: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in SOFTMAXES:
            self.softmaxes.append(next(self.clock))
        return func(*args, **(kwargs or {}))


class _Discovery:
    """What one probe pass shows: when each site attends, and every module call around it."""

    accepts_inputs = True

    def __init__(self, timeline: _Timeline) -> None:
        self.timeline = timeline
        self.attended: dict[AttentionSite, tuple[int, int, Tensor, list[Tensor]]] = {}  # time, heads, value, blocks
        self.modules: dict[AttentionSite, nn.Module] = {}
        self.linear_calls: list[tuple[int, nn.Module, Tensor]] = []  # time, module, input
        self.calls: dict[nn.Module, list[list]] = {}  # every call of a module: [enter, exit, output]
        self.other_calls: list[tuple[int, nn.Module]] = []

    def call_around(self, module: nn.Module, moment: int) -> tuple[int, int, Any]:
        """The call of ``module`` that was running at ``moment`` (enter, exit, output), or (-1, -1, None)."""
        for enter, leave, output in self.calls.get(module, ()):
            if enter < moment < leave:
                return enter, leave, output
        return -1, -1, None

    def observe_inputs(self, site, query, key, value, scaling) -> None:
        # value [b, kvh, k, dv]: its last dimension is the head output size, whatever the query's is
        self.attended[site] = (next(self.timeline.clock), query.shape[1], value.detach(), [])

    def observe(self, site: AttentionSite, pattern: Tensor, query_start: int, **_: object) -> None:
        if site in self.attended:  # models on eager attention report patterns only (no inputs): not needed here
            self.attended[site][3].append(pattern.detach().clone())  # [b, h, blk, k]


def find_output_projections(loaded: LoadedModel, *, fallback: bool) -> dict[AttentionSite, OutputProjection]:
    """Every site's :class:`OutputProjection`, from a probe pass (see the module docstring).

    Raises :class:`UnsupportedModelError` naming the site and the reason where no projection reads the heads'
    outputs in a form that splits per head.
    """
    model = loaded.model
    names = {module: name for name, module in model.named_modules()}
    timeline = _Timeline()
    found = _Discovery(timeline)

    def site_of(module: nn.Module) -> AttentionSite | None:
        site = loaded.site_of(module)
        if site is not None:
            found.modules[site] = module
        return site

    hooks = []
    for module in model.modules():
        hooks.append(module.register_forward_pre_hook(_entering(found, timeline)))
        hooks.append(module.register_forward_hook(_leaving(found, timeline)))
    batch = loaded.probe_batch()
    try:
        with torch.no_grad(), timeline:
            outputs = loaded.forward(batch, AttentionContext(observers=[found], site_of=site_of))
    finally:
        for hook in hooks:
            hook.remove()
    sites = _fallback_sites(loaded, found, outputs) if fallback else _core_sites(found)
    if not sites:
        raise UnsupportedModelError(f"no attention of {loaded.name} was seen on a probe input")
    projections, entering = {}, {}
    for site, (module, moment, heads, head_output) in sorted(sites.items(), key=lambda item: item[0]):
        projections[site], entering[site] = _projection_after(
            loaded, found, names, site, module, moment, heads, head_output
        )
    if fallback:
        patterns = dict(fallback_attentions(outputs, _pairs(loaded)))
        projections = checked_fallback(loaded, batch, projections, patterns, entering)
    return projections


def _pairs(loaded: LoadedModel) -> bool:
    return bool(getattr(loaded, "encoder_decoder", False))


def _entering(found: _Discovery, timeline: _Timeline):
    def hook(module: nn.Module, args: tuple) -> None:
        now = next(timeline.clock)
        if is_linear(module) and args and isinstance(args[0], Tensor):
            found.linear_calls.append((now, module, args[0].detach()))
        else:
            found.other_calls.append((now, module))
        found.calls.setdefault(module, []).append([now, -1, None])

    return hook


def _leaving(found: _Discovery, timeline: _Timeline):
    def hook(module: nn.Module, args: tuple, output: Any) -> None:
        running = [call for call in found.calls.get(module, ()) if call[1] < 0]
        if running:
            running[-1][1:] = [next(timeline.clock), output]

    return hook


def _core_sites(found: _Discovery) -> dict[AttentionSite, tuple[nn.Module, int, int, Tensor | None]]:
    """site -> (attention module, moment of attention, query heads, heads' output ``[b, q, h, dv]``)."""
    sites = {}
    for site, (moment, heads, value, blocks) in found.attended.items():
        pattern = torch.cat(blocks, dim=2) if blocks else None  # [b, h, q, k]
        output = None
        if pattern is not None:
            values = repeat_kv(value.float(), heads // value.shape[1])  # [b, h, k, dv]
            output = torch.matmul(pattern, values).transpose(1, 2)  # [b, q, h, dv]
        sites[site] = (found.modules[site], moment, heads, output)
    return sites


def _fallback_sites(loaded: LoadedModel, found: _Discovery, outputs: Any):
    """The same for models on eager attention: the module that returns each layer's weights (the innermost one),
    placed at its last softmax."""
    sites = {}
    for site, pattern in fallback_attentions(outputs, _pairs(loaded), blocked=True):  # the tensors modules returned
        holders = [
            (enter, leave, module)
            for module, calls in found.calls.items()
            for enter, leave, output in calls
            if isinstance(output, tuple) and any(item is pattern for item in output)
        ]
        if not holders:
            raise UnsupportedModelError(
                f"{loaded.name}: attnviz cannot tell which module computes the attention of {site.name} (no module "
                "returns the weights transformers reports), so it cannot find where its heads' outputs go"
            )
        enter, leave, module = max(holders, key=lambda holder: holder[0])  # the innermost: entered last
        inside = [moment for moment in found.timeline.softmaxes if enter < moment < leave]
        if not inside:
            raise UnsupportedModelError(
                f"{loaded.name}: the attention module of {site.name} ({type(module).__name__}) computes no softmax "
                "attnviz can see, so it cannot tell where its heads' outputs go"
            )
        sites[site] = (module, inside[-1], pattern.shape[-3], None)  # [b, h, q, k] or [b, blocks, h, blk, 3·blk]
    return sites


def _projection_after(loaded, found, names, site, module, moment, heads, head_output):
    """The output projection of ``site``: a linear layer called after ``moment`` inside the parent of ``module``
    that reads ``heads × dv`` features computed after the attention (see the module docstring)."""
    name = names.get(module, "")
    scope = name.rpartition(".")[0]
    prefix = scope + "." if scope else ""
    inside = [
        (time, linear, given) for time, linear, given in found.linear_calls if names.get(linear, "").startswith(prefix)
    ]
    # what the layer read before it attended (its hidden states, fed to the query projection): a linear layer
    # reading that after the attention (Beam's gate projection) computes something else
    earlier = {_storage(given) for time, _, given in inside if time < moment}
    following = [
        (time, linear, given) for time, linear, given in inside if time > moment and _storage(given) not in earlier
    ]
    if head_output is not None:
        width = heads * head_output.shape[-1]
        following = [call for call in following if in_features(call[1]) == width] or following
    else:
        following = [call for call in following if heads and in_features(call[1]) % heads == 0] or following
    if not following:
        raise UnsupportedModelError(
            f"{loaded.name}: no linear layer follows the attention of {site.name} ({name}), so attnviz finds no "
            "output projection that reads each head's output"
        )
    time, projection, given = following[0]
    _check_reads_the_attention(loaded, found, site, module, name, moment, time, names.get(projection, ""), given)
    width = in_features(projection)
    head_dim = head_output.shape[-1] if head_output is not None else width // max(heads, 1)
    if width != heads * head_dim or given.shape[-1] != width:
        raise UnsupportedModelError(
            f"{loaded.name}: the projection after the attention of {site.name} ({names.get(projection, '')}) reads "
            f"{width} features, not {heads} heads × {head_dim}: the heads' outputs enter it in a form attnviz cannot "
            "split per head"
        )
    between = [
        names.get(other, type(other).__name__)
        for moment_other, other in found.other_calls
        if moment < moment_other < time and names.get(other, "").startswith(prefix)
    ]
    direct = True
    if head_output is not None:
        entering = given.float().reshape(head_output.shape)  # [b, q, h, dv]
        scale = float(head_output.abs().max()) or 1.0
        # the same vector rounded to the model's dtype (bfloat16: 8 bits) is still the heads' output; a gate or a norm
        # changes it by far more
        tolerance = max(1e-4, 4 * torch.finfo(given.dtype).eps) if given.is_floating_point() else 1e-4
        direct = float((entering - head_output).abs().max()) <= tolerance * scale
    found_projection = OutputProjection(
        site=site,
        module=projection,
        name=names.get(projection, ""),
        heads=heads,
        head_dim=head_dim,
        direct=direct,
        between="" if direct else between_words(list(dict.fromkeys(between))),
        rerun=model_scope(loaded.model, scope) if head_output is None else None,
        softmax_index=_softmax_index(found, loaded.model, scope, moment) if head_output is None else -1,
    )
    return found_projection, given  # given: the projection's input on the probe, [b, q, h·dv]


def _storage(tensor: Tensor) -> tuple[int, tuple[int, ...]]:
    return tensor.data_ptr(), tuple(tensor.shape)


def _check_reads_the_attention(loaded, found, site, module, name, moment, time, projection_name, given) -> None:
    """A projection applied after the attention module returned (BERT's ``attention.output.dense``) must read what
    it returned: otherwise the linear layer found is something else (an MLP of a layer without output projection)."""
    _, leave, returned = found.call_around(module, moment)
    if leave < 0 or time < leave:
        return
    first = returned[0] if isinstance(returned, tuple) and returned else returned
    if not (
        isinstance(first, Tensor)
        and first.shape == given.shape
        and torch.allclose(first.float(), given.float(), rtol=1e-5, atol=1e-6)
    ):
        names = {sub: sub_name for sub_name, sub in module.named_modules()}
        after = [names[other] for when, other in found.other_calls if moment < when < leave and names.get(other)]
        inside = f" (after the attention it runs {', '.join(dict.fromkeys(after))}, no linear layer)" if after else ""
        raise UnsupportedModelError(
            f"{loaded.name}: no linear output projection reads the heads' outputs of {site.name} ({name}{inside}; "
            f"the next linear layer, {projection_name}, reads something else), so attnviz cannot split what each head "
            "writes"
        )


def model_scope(model: nn.Module, scope: str) -> nn.Module:
    return model.get_submodule(scope) if scope else model


def _softmax_index(found: _Discovery, model: nn.Module, scope: str, moment: int) -> int:
    enter, _, _ = found.call_around(model_scope(model, scope), moment)
    return sum(1 for time in found.timeline.softmaxes if enter < time < moment)


def between_words(modules: list[str]) -> str:
    if modules:
        return "something that changes each head's output (" + ", ".join(modules) + ")"
    return QUERY_DEPENDENT
