"""``find_circuit``: attribution over nodes or edges, averaged over prompt pairs, then faithful circuits.

Per group of same-length pairs: one clean and one corrupt forward pass (the references), then one corrupt
forward + backward (``atp``, ``eap``) or ``steps`` of them (``eap-ig``, batched). Scores are summed over the pairs
and divided by their number. The faithfulness curve and the verification then run batched patched passes
(:mod:`attnviz.circuit.faithfulness`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from attnviz.circuit.attribution import Reference, Setting, attribute, reference_runs
from attnviz.circuit.choices import METHODS, METRICS, Method, Metric
from attnviz.circuit.faithfulness import (
    curve_counts,
    keep_top,
    normalized,
    patched_metrics,
    ranking_of,
    smallest_reaching,
)
from attnviz.circuit.graph import Graph, Node, build_graph
from attnviz.circuit.pairs import PromptPair, group_pairs, pair_of
from attnviz.circuit.result import CircuitResult, EdgeScore, NodeScore
from attnviz.common.errors import InputError, ParameterError
from attnviz.common.parallel import SINGLE_PROCESS, DataParallel
from attnviz.common.progress import progress_bar
from attnviz.models.base import LoadedModel
from attnviz.models.identity import model_identity

#: rows per patched or interpolated forward pass by default
DEFAULT_BATCH_SIZE = 16
#: points of the faithfulness curve by default (0 and the whole graph included)
DEFAULT_CURVE_POINTS = 16


def find_circuit(
    loaded: LoadedModel,
    *,
    clean: str | None = None,
    corrupt: str | None = None,
    answer: str | None = None,
    wrong: str | None = None,
    pairs: Sequence[PromptPair | Mapping[str, str]] | None = None,
    method: Method = "eap",
    metric: Metric = "logit-diff",
    steps: int = 5,
    per_position: bool = False,
    verify: int = 0,
    target: float = 0.8,
    curve_points: int = DEFAULT_CURVE_POINTS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_length: int | None = None,
    parallel: DataParallel = SINGLE_PROCESS,
) -> CircuitResult:
    """The circuit that makes ``answer`` (rather than ``wrong``) follow ``clean`` and not ``corrupt``.

    Give one pair (``clean``, ``corrupt``, ``answer``, ``wrong``: the prompt rules of
    :func:`attnviz.patching.patch_heads`) or ``pairs`` (:class:`~attnviz.circuit.pairs.PromptPair` or mappings with
    those keys; scores are averaged over them). ``method``: ``"atp"`` (nodes), ``"eap"`` (edges) or ``"eap-ig"``
    (edges, ``steps`` integrated-gradient steps); ``metric``: ``"logit-diff"`` or ``"kl"``; ``per_position``:
    also keep the positions apart (pairs of one token length only); ``verify``: measure the top ``verify`` edges
    (nodes for ``atp``) exactly by path patching; ``target``: the faithfulness the smallest circuit must reach;
    ``curve_points``: circuits on the faithfulness curve; ``batch_size``: rows per patched forward pass;
    ``parallel``: this process's share of a data-parallel run (each process takes its share of the pairs, the
    sums are shared, every process returns the same result).
    """
    chosen = _pairs(clean, corrupt, answer, wrong, pairs)
    _check(method, metric, steps, verify, target, curve_points, batch_size)
    started = time.perf_counter()
    loaded.check_patching()
    readers = loaded.residual_readers()
    graph = build_graph(readers)
    layout = loaded.layout()
    output_weights = {}
    for site, (weight, _) in loaded.head_output_weights().items():
        if site in layout:
            output_weights[site] = weight.view(weight.shape[0], layout[site], -1)  # [w, h, d]
    setting = Setting(loaded, readers, graph, output_weights, metric, batch_size, parallel)
    passes = {"forward": 0, "backward": 0, "patched": 0}
    with loaded.running():
        every = group_pairs(loaded, chosen, max_length=max_length)  # every pair checked, on every process
        if per_position and len(every) > 1:
            raise ParameterError(
                "per_position", "{per_position} needs pairs of one token length (positions are kept apart)"
            )
        groups = every
        if parallel.distributed:  # this process's share of the pairs
            mine = [chosen[index] for index in parallel.shard([1.0] * len(chosen))]
            groups = group_pairs(loaded, mine, max_length=max_length) if mine else []
        kept = (every[0].clean.lengths[0],) if per_position else ()
        nodes_sum = torch.zeros(len(graph.senders), *kept, dtype=torch.float64)
        edges_sum = None if method == "atp" else torch.zeros(len(graph.senders), len(graph.receivers), *kept).double()
        metrics = torch.zeros(4, dtype=torch.float64)  # clean, corrupt metric; clean, corrupt logit difference
        references = []
        with progress_bar() as bar:
            task = bar.add_task(f"attribution · {loaded.name}", total=len(groups), status="")
            for group in groups:
                with torch.no_grad():
                    reference = reference_runs(setting, group)
                references.append((group, reference))
                scores = attribute(setting, group, reference, method, steps=steps, per_position=per_position)
                nodes_sum += scores.nodes
                if edges_sum is not None and scores.edges is not None:
                    edges_sum += scores.edges
                metrics += torch.stack([value.sum() for value in _metric_columns(reference)])
                runs = steps if method == "eap-ig" else 1
                passes["forward"] += 1 + runs  # the reference pass holds both prompts
                passes["backward"] += runs
                bar.update(task, advance=1)
        count = len(chosen)
        summed = parallel.sum([nodes_sum, metrics] + ([edges_sum] if edges_sum is not None else []))
        node_scores, metrics = summed[0] / count, summed[1] / count
        edge_scores = summed[2] / count if edges_sum is not None else None
        clean_metric, corrupt_metric, clean_diff, corrupt_diff = metrics.tolist()
        if abs(clean_metric - corrupt_metric) < 1e-6 * max(1.0, abs(clean_metric)):
            raise InputError(
                f"the clean and corrupt prompts give the same metric ({clean_metric:.4g}): there is nothing for a "
                "circuit to restore; choose corrupt prompts that change the answer"
            )
        edges = graph.edges()
        totals = node_scores if node_scores.dim() == 1 else node_scores.sum(-1)
        if edge_scores is not None:
            edge_totals = edge_scores if edge_scores.dim() == 2 else edge_scores.sum(-1)
            ranking, items = ranking_of(edge_totals, edges), int(edges.sum())
        else:  # atp: a node's circuit keeps every edge out of it
            ranking = ranking_of(totals, torch.ones(len(totals), dtype=torch.bool))[:, None].expand_as(edges)
            items = len(totals)
        counts = curve_counts(items, curve_points)
        with progress_bar() as bar:
            task = bar.add_task(f"faithfulness · {loaded.name}", total=len(counts) * len(references), status="")
            values = patched_metrics(
                setting, references, keep_top(ranking, edges, counts), source="clean",
                advance=lambda done: bar.update(task, advance=done),
            )  # fmt: skip
        curve = list(zip(counts, normalized(values, clean_metric, corrupt_metric), strict=True))
        circuit_size, circuit_value, bisections = smallest_reaching(
            setting, references, ranking, edges, curve, target, clean_metric, corrupt_metric
        )
        passes["patched"] = (len(counts) + bisections) * count
        verified = _verify(setting, references, graph, ranking, edges, edge_scores, totals, verify, corrupt_metric)
        passes["patched"] += len(verified) * count
    first = chosen[0]
    result = CircuitResult(
        model=loaded.name,
        method=method,
        metric=metric,
        clean=first.clean,
        corrupt=first.corrupt,
        answer=first.answer,
        wrong=first.wrong,
        pairs=count,
        tokens=every[0].clean.tokens[0] if len(every) == 1 else loaded.encode([first.clean]).tokens[0],
        clean_logit_diff=clean_diff,
        corrupt_logit_diff=corrupt_diff,
        clean_metric=clean_metric,
        corrupt_metric=corrupt_metric,
        faithfulness_curve=curve,
        circuit_edges=circuit_size,
        circuit_faithfulness=circuit_value,
        target=target,
        kept="edges" if edge_scores is not None else "nodes",
        verified=verified,
        steps=steps if method == "eap-ig" else 1,
        passes=passes,
    )
    _fill_scores(result, loaded, readers, graph, node_scores, edge_scores, ranking if edge_scores is not None else None)
    result.seconds = time.perf_counter() - started
    return result


def _pairs(clean, corrupt, answer, wrong, pairs) -> list[PromptPair]:
    single = [clean, corrupt, answer, wrong]
    if pairs is not None:
        if any(value is not None for value in single):
            raise ParameterError("pairs", "give either {pairs} or clean, corrupt, answer and wrong, not both")
        chosen = [pair_of(pair, f"pair {number}") for number, pair in enumerate(pairs, start=1)]
        if not chosen:
            raise ParameterError("pairs", "{pairs} is empty: give at least one prompt pair")
        return chosen
    missing = [name for name, value in zip(("clean", "corrupt", "answer", "wrong"), single, strict=True) if not value]
    if missing:
        raise ParameterError(missing[0], f"give {{{missing[0]}}}: a circuit needs clean, corrupt, answer and wrong")
    return [PromptPair(clean, corrupt, answer, wrong)]


def _check(method, metric, steps, verify, target, curve_points, batch_size) -> None:
    if method not in METHODS:
        raise ParameterError("method", f"{{method}} must be one of {', '.join(METHODS)}", method)
    if metric not in METRICS:
        raise ParameterError("metric", f"{{metric}} must be one of {', '.join(METRICS)}", metric)
    for name, value, least in (("steps", steps, 1), ("verify", verify, 0), ("curve_points", curve_points, 2)):
        if not isinstance(value, int) or value < least:
            raise ParameterError(name, f"{{{name}}} must be a whole number of at least {least}, got {value!r}", value)
    if batch_size < 1:
        raise ParameterError("batch_size", f"{{batch_size}} must be at least 1, got {batch_size}", batch_size)
    if not 0.0 < target <= 1.0:
        raise ParameterError("target", f"{{target}} is a faithfulness between 0 and 1, got {target}", target)


def _metric_columns(reference: Reference) -> list[torch.Tensor]:
    return [reference.clean_metric, reference.corrupt_metric, reference.clean_logit_diff, reference.corrupt_logit_diff]


def _verify(setting, references, graph: Graph, ranking, edges, edge_scores, totals, verify, corrupt_metric):
    """(index, estimate, exact effect) of the top ``verify`` edges (nodes for atp), measured by path patching."""
    if verify == 0:
        return []
    if edge_scores is not None:
        scores = edge_scores if edge_scores.dim() == 2 else edge_scores.sum(-1)
        count = min(verify, int(edges.sum()))
        flat = torch.nonzero((ranking < count).flatten()).flatten()
        flat = flat[torch.argsort(ranking.flatten()[flat])]
        drops = torch.zeros(count, *edges.shape, dtype=torch.bool)
        drops.view(count, -1)[torch.arange(count), flat] = True
        estimates = scores.flatten()[flat].tolist()
        indices = list(range(count))
    else:
        order = torch.argsort(totals.abs(), descending=True, stable=True)[:verify]
        drops = _node_drops(edges, order)
        estimates = totals[order].tolist()
        indices = order.tolist()
    exact = patched_metrics(setting, references, drops, source="corrupt") - corrupt_metric
    return [(index, estimate, value) for index, estimate, value in zip(indices, estimates, exact.tolist(), strict=True)]


def _node_drops(edges, order):
    drops = torch.zeros(len(order), *edges.shape, dtype=torch.bool)
    drops[torch.arange(len(order)), order] = edges[order]
    return drops


def _fill_scores(result, loaded, readers, graph: Graph, node_scores, edge_scores, ranking) -> None:
    identity = model_identity(loaded)
    sites = {layer.site.layer: layer.site for layer in readers.layers}
    layout = {number: loaded.layout()[site] for number, site in sites.items()}

    def number(node: Node) -> int | None:
        if node.head is None or identity is None or node.layer is None:
            return node.head
        if node.input in ("k", "v") and layout.get(node.layer) != _kv_count(graph, node.layer):
            return node.head  # key/value heads of grouped-query attention keep their own numbers
        return identity.ids(sites[node.layer].stack, node.layer, layout[node.layer])[node.head]

    for index, node in enumerate(graph.senders):
        value = node_scores[index]
        result.nodes.append(
            NodeScore(node.kind, node.layer, number(node), float(value.sum()),
                      value.tolist() if value.dim() else None)
        )  # fmt: skip
    if edge_scores is None:
        return
    order = torch.argsort(ranking.flatten())[: int(graph.edges().sum())]
    receivers = len(graph.receivers)
    for flat in order.tolist():
        sender, receiver = graph.senders[flat // receivers], graph.receivers[flat % receivers]
        value = edge_scores[flat // receivers, flat % receivers]
        result.edges.append(
            EdgeScore(
                (sender.kind, sender.layer, number(sender)),
                (receiver.kind, receiver.layer, number(receiver), receiver.input),
                float(value.sum()),
                value.tolist() if value.dim() else None,
            )
        )


def _kv_count(graph: Graph, layer: int) -> int:
    return sum(1 for node in graph.receivers if node.layer == layer and node.input == "k")
