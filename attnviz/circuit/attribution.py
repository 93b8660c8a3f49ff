"""Attribution patching of nodes and edges, and its integrated-gradients version, on one group of pairs.

With ``a`` a sender's activation and ``M`` the metric at the corrupt run:

* node (AtP): ``Σ_positions (a_clean − a_corrupt) · ∂M/∂a`` — a head's ``a`` is its output ``z`` ``[q, d]``;
* edge (EAP): ``Σ_positions (a_s,clean − a_s,corrupt) · ∂M/∂x_r`` with ``a_s`` what the sender adds to the
  stream and ``x_r`` the receiver's own copy of the stream (:mod:`attnviz.circuit.trace`). The stream is a sum
  and every reader reads it, so a sender's outgoing edges add up to its node score;
* EAP-IG: the gradients averaged over ``steps`` inputs between corrupt and clean (the embeddings interpolated at
  the midpoints of ``steps`` equal steps), then the same products.

Everything is summed over the rows (pairs) of the group; the caller divides by the number of pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnviz.circuit.choices import Method, Metric
from attnviz.circuit.graph import Graph
from attnviz.circuit.pairs import PairGroup, tile
from attnviz.circuit.trace import Trace
from attnviz.common.parallel import SINGLE_PROCESS, DataParallel
from attnviz.core import AttentionSite
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.readers import ResidualReaders


@dataclass
class Setting:
    """What every pass of one search shares."""

    loaded: LoadedModel
    readers: ResidualReaders
    graph: Graph
    output_weights: dict[AttentionSite, Tensor]  # [width, h, d] per site
    metric: Metric
    batch_size: int
    parallel: DataParallel = SINGLE_PROCESS  # this process's share of a data-parallel run (pairs are shared out)

    def trace(self, **options) -> Trace:
        return Trace(self.loaded, self.readers, self.graph, self.output_weights, **options)


@dataclass
class Reference:
    """The clean and corrupt runs of one group: metric per row, sender activations, head outputs."""

    clean_metric: Tensor  # [b] float64
    corrupt_metric: Tensor  # [b]
    clean_logit_diff: Tensor  # [b]
    corrupt_logit_diff: Tensor  # [b]
    clean_acts: Tensor  # [S, b, q, w]
    corrupt_acts: Tensor  # [S, b, q, w]
    clean_heads: dict[int, Tensor]  # layer index -> z [b, q, h, d]
    corrupt_heads: dict[int, Tensor]
    clean_logprobs: Tensor  # [b, vocab] at the answer position


@dataclass
class Scores:
    """Summed over the group's rows: nodes ``[S]`` (``[S, q]`` per position), edges ``[S, R]`` (``[S, R, q]``)."""

    nodes: Tensor
    edges: Tensor | None


def metric_of(
    logits: Tensor, group: PairGroup, metric: Metric, clean_logprobs: Tensor | None, times: int = 1
) -> Tensor:
    """``[times·b]`` the metric of each row of ``logits`` ``[times·b, q, vocab]`` (rows tiled like :func:`tile`)."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    positions = group.positions.to(logits.device).repeat(times)
    final = logits[rows, positions].float()  # [n, vocab]
    if metric == "kl":
        assert clean_logprobs is not None
        reference = clean_logprobs.to(final.device).repeat(times, 1)  # [n, vocab]
        return (reference.exp() * (reference - final.log_softmax(-1))).sum(-1)
    answers, wrongs = group.answers.to(logits.device).repeat(times), group.wrongs.to(logits.device).repeat(times)
    return final[rows, answers] - final[rows, wrongs]


def logit_diff(logits: Tensor, group: PairGroup) -> Tensor:
    return metric_of(logits, group, "logit-diff", None)


def reference_runs(setting: Setting, group: PairGroup) -> Reference:
    """The clean and corrupt prompts of ``group`` as one forward pass of ``2b`` rows (no gradients)."""
    size = len(group)
    trace = setting.trace()
    logits = trace.run(group.both)  # [2b, q, vocab]: the clean rows, then the corrupt rows
    clean_logits, corrupt_logits = logits[:size], logits[size:]
    rows = torch.arange(size)
    clean_logprobs = clean_logits[rows, group.positions.to(logits.device)].float().log_softmax(-1)
    assert trace.acts is not None
    return Reference(
        clean_metric=metric_of(clean_logits, group, setting.metric, clean_logprobs).double().cpu(),
        corrupt_metric=metric_of(corrupt_logits, group, setting.metric, clean_logprobs).double().cpu(),
        clean_logit_diff=logit_diff(clean_logits, group).double().cpu(),
        corrupt_logit_diff=logit_diff(corrupt_logits, group).double().cpu(),
        clean_acts=trace.acts[:, :size],
        corrupt_acts=trace.acts[:, size:],
        clean_heads={index: z.detach()[:size] for index, z in trace.head_outputs.items()},
        corrupt_heads={index: z.detach()[size:] for index, z in trace.head_outputs.items()},
        clean_logprobs=clean_logprobs,
    )


def attribute(
    setting: Setting, group: PairGroup, reference: Reference, method: Method, *, steps: int, per_position: bool
) -> Scores:
    """Node scores, and edge scores unless ``method`` is ``atp`` (see the module docstring)."""
    edges_wanted = method != "atp"
    if method == "eap-ig":
        gradients = _integrated_gradients(setting, group, reference, steps, edges_wanted)
    else:
        trace = setting.trace(gradients=True, split=edges_wanted)
        logits = trace.run(group.corrupt)
        gradients = trace.gradients(metric_of(logits, group, setting.metric, reference.clean_logprobs).sum())
    keep = "q" if per_position else ""
    graph = setting.graph
    delta = (reference.clean_acts - reference.corrupt_acts).double()  # [S, b, q, w]
    nodes = delta.new_zeros(len(graph.senders), *((delta.shape[2],) if per_position else ()))
    nodes[0] = torch.einsum(f"bqw,bqw->{keep}", delta[0], gradients["embed"].double())
    for index, span in enumerate(graph.head_senders):
        change = (reference.clean_heads[index] - reference.corrupt_heads[index]).double()  # [b, q, h, d]
        nodes[span.start : span.stop] = torch.einsum(f"bqhd,bqhd->h{keep}", change, gradients["heads"][index].double())
    for index, sender in enumerate(graph.mlp_senders):
        if sender is not None:
            nodes[sender] = torch.einsum(f"bqw,bqw->{keep}", delta[sender], gradients["mlps"][index].double())
    if not edges_wanted:
        return Scores(nodes.cpu(), None)
    receivers = gradients["receivers"].double()  # [R, b, q, w]
    edges = torch.einsum(f"sbqw,rbqw->sr{keep}", delta, receivers)
    mask = graph.edges().to(edges.device)
    edges = edges * (mask[:, :, None] if per_position else mask)
    return Scores(nodes.cpu(), edges.cpu())


def _integrated_gradients(
    setting: Setting, group: PairGroup, reference: Reference, steps: int, edges_wanted: bool
) -> dict:
    """The gradients of :meth:`Trace.gradients` averaged over ``steps`` interpolated inputs (rows tiled, in
    chunks of at most ``batch_size`` rows)."""
    size = len(group)
    clean_embed, corrupt_embed = reference.clean_acts[0], reference.corrupt_acts[0]  # [b, q, w]
    per_chunk = max(1, setting.batch_size // size)
    total: dict | None = None
    for start in range(0, steps, per_chunk):
        alphas = [(k + 0.5) / steps for k in range(start, min(steps, start + per_chunk))]
        times = len(alphas)
        weights = torch.as_tensor(alphas, dtype=clean_embed.dtype, device=clean_embed.device)
        weights = weights.repeat_interleave(size)[:, None, None]  # [t·b, 1, 1]
        embed = corrupt_embed.repeat(times, 1, 1) + weights * (clean_embed - corrupt_embed).repeat(times, 1, 1)
        batch: EncodedBatch = tile(group.corrupt, times)
        trace = setting.trace(gradients=True, split=edges_wanted, embed=embed)
        logits = trace.run(batch)
        found = trace.gradients(metric_of(logits, group, setting.metric, reference.clean_logprobs, times).sum())
        folded = _fold(found, times, size)
        total = folded if total is None else _add(total, folded)
    assert total is not None
    return _scale(total, 1.0 / steps)


def _fold(found: dict, times: int, size: int) -> dict:
    """Sum the ``times`` tiles of every gradient's batch dimension back onto the group's ``size`` rows."""

    def fold(value: Tensor, dim: int) -> Tensor:
        shape = (*value.shape[:dim], times, size, *value.shape[dim + 1 :])
        return value.reshape(shape).sum(dim)

    result = {"embed": fold(found["embed"], 0), "heads": {}, "mlps": {}}
    result["heads"] = {index: fold(value, 0) for index, value in found["heads"].items()}
    result["mlps"] = {index: fold(value, 0) for index, value in found["mlps"].items()}
    if "receivers" in found:
        result["receivers"] = fold(found["receivers"], 1)
    return result


def _add(one: dict, other: dict) -> dict:
    result = {"embed": one["embed"] + other["embed"]}
    result["heads"] = {index: value + other["heads"][index] for index, value in one["heads"].items()}
    result["mlps"] = {index: value + other["mlps"][index] for index, value in one["mlps"].items()}
    if "receivers" in one:
        result["receivers"] = one["receivers"] + other["receivers"]
    return result


def _scale(one: dict, factor: float) -> dict:
    result = {"embed": one["embed"] * factor}
    result["heads"] = {index: value * factor for index, value in one["heads"].items()}
    result["mlps"] = {index: value * factor for index, value in one["mlps"].items()}
    if "receivers" in one:
        result["receivers"] = one["receivers"] * factor
    return result
