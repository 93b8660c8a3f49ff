"""One query's attention over every key, per layer and head: the rows a long-context strip draws.

A full capture holds ``layers · heads · n²`` weights (18 GB for SmolLM2 at 4,096 tokens). To show one
query, :func:`capture_query_rows` runs the model with an observer of the attention core that keeps only
that query's row, and tells the core so (``AttentionContext.observed_queries``): each layer then runs the
model's own fast path (torch's fused attention) for its output and computes the pattern of that one row
apart (:mod:`attnviz.core.sdpa_rows`). What is kept is ``layers · heads · n`` floats (4.4 MB there), and the
pass costs about one plain sdpa forward. :func:`query_rows_of_capture` takes
the same rows from a capture already made (or loaded from a file); :func:`query_rows` does either, as it is given
a model and a text or a capture.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from attnviz.captures.result import AttentionCapture
from attnviz.common.display import NotebookDisplay
from attnviz.common.errors import InputError, ParameterError, UnsupportedModelError
from attnviz.common.progress import progress_bar
from attnviz.common.selection import HeadSelection, LayerSelection, MeanOfHeads, resolve_heads, resolve_layers
from attnviz.common.tokens import last_content_position
from attnviz.core import AttentionSite
from attnviz.core.stacks import is_causal_stack, stack_of
from attnviz.models.base import LoadedModel
from attnviz.models.identity import model_identity

__all__ = [
    "LAST",
    "QueryPosition",
    "QueryRows",
    "capture_query_rows",
    "query_rows",
    "query_rows_of_capture",
    "resolve_query",
]

#: the last query of the text that is not whitespace (``query="last"``): a trailing newline or space is skipped
#: (``-1`` is the very last token)
LAST = "last"
#: a query's position on the query axis: an index (negative ones count from the end) or ``"last"``
QueryPosition = int | Literal["last"]


@dataclass(repr=False)  # its own short repr; notebooks show the strips (attnviz.render.inline)
class QueryRows(NotebookDisplay):
    """Attention of one query over every key, for the chosen layers and heads.

    ``rows[i]`` is float32 ``[head, key]``: layer ``layers[i]``, one row per head number in ``heads[i]``
    (a pruned model's heads keep their original numbers), or a single row, the mean of the layer's heads,
    when ``mean_of_heads``. Each row sums to 1 over the keys the query can see.
    """

    model: str
    stack: str
    query: int  # position of the query on the query axis, 0-based
    query_tokens: list[str]
    key_tokens: list[str]
    layers: list[int]
    heads: list[list[int]]  # per layer: head numbers, in the order of the rows (all heads when averaged)
    rows: list[Tensor]  # per layer: float32 [head, key] ([1, key] when mean_of_heads)
    visible: Tensor | None = None  # [key] bool: keys the query can see; None when it sees every key
    mean_of_heads: bool = False

    def __repr__(self) -> str:
        strips = sum(row.shape[0] for row in self.rows)
        return (
            f"QueryRows(model={self.model!r}, query={self.query} ({self.query_token!r}), "
            f"{len(self.key_tokens)} keys, {len(self.layers)} layers, {strips} strips)"
        )

    @property
    def query_token(self) -> str:
        return self.query_tokens[self.query]

    def labels(self) -> list[str]:
        """One short label per strip, in the order of :meth:`matrix`: ``L3 H2``, or ``L3 mean``."""
        if self.mean_of_heads:
            return [f"L{layer} mean" for layer in self.layers]
        return [f"L{layer} H{head}" for layer, heads in zip(self.layers, self.heads) for head in heads]

    def matrix(self) -> Tensor:
        """Every strip as one float32 ``[strip, key]`` tensor, layer by layer, heads in order."""
        return torch.cat(self.rows, dim=0)

    def row(self, layer: int, head: int | None = None) -> Tensor:
        """``[key]``: the row of ``layer`` (an index of :attr:`layers`' values) and head number ``head``
        (None when the heads were averaged)."""
        if layer not in self.layers:
            raise InputError(f"layer {layer} was not recorded: these rows hold layers {self.layers}")
        index = self.layers.index(layer)
        if self.mean_of_heads or head is None:
            if not self.mean_of_heads:
                raise InputError("give a head number: these rows hold the heads one by one")
            return self.rows[index][0]
        if head not in self.heads[index]:
            raise InputError(f"head {head} was not recorded for layer {layer}: it holds heads {self.heads[index]}")
        return self.rows[index][self.heads[index].index(head)]

    def top_keys(self, count: int = 5) -> list[list[int]]:
        """Per strip (as :meth:`matrix`): the ``count`` visible keys of largest weight, largest first.

        Fewer when the query sees fewer keys (a causal model's first queries).
        """
        matrix = self.matrix()  # [strip, key]
        if self.visible is not None:
            matrix = matrix.masked_fill(~self.visible, float("-inf"))
            count = min(count, int(self.visible.sum()))
        count = min(count, matrix.shape[1])
        return torch.topk(matrix, count, dim=1).indices.tolist()


def resolve_query(query: QueryPosition, count: int, tokens: Sequence[str] | None = None) -> int:
    """``query`` as an index in ``0..count-1``: negative indices count from the end; ``"last"`` is the last of
    ``tokens`` that is not whitespace (the last position without ``tokens``)."""
    if query == LAST:
        return last_content_position(tokens) if tokens else count - 1
    if isinstance(query, bool) or not isinstance(query, int):
        raise ParameterError(
            "query", "{query} is a query position: give an integer (negative counts from the end) or last", query
        )
    if not -count <= query < count:
        raise ParameterError(
            "query",
            f"{{query}} {query} is out of range: the text has {count} tokens (0–{count - 1}, or -1 / last for the last)",
            query,
        )
    return query % count


def _visibility(causal: bool, query: int, query_len: int, key_len: int) -> Tensor | None:
    """``[key]`` bool of a causal stack (query ``i`` sees keys ``0..i``, aligned at the end), else None."""
    if not causal:
        return None
    return torch.arange(key_len) <= query + key_len - query_len


def _chosen_heads(heads: HeadSelection, ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """(positions in the layer's pattern tensor, head numbers) of the chosen heads; every head for the mean."""
    selection = resolve_heads(heads, ids)
    positions = list(range(len(ids))) if isinstance(selection, MeanOfHeads) else selection
    return positions, [ids[position] for position in positions]


class _QueryRowObserver:
    """Copies one query's row of the chosen heads out of every block the core computes (example 0).

    The core hands over ``[b, h, block, c]`` in a buffer it may reuse (``c`` ≤ the key count; later keys
    weigh exactly 0), so the row is copied into a ``[chosen heads, key]`` tensor of its own.
    ``on_layer`` is called once per layer of the stack as it passes (progress).
    """

    accepts_key_prefix = True

    def __init__(
        self,
        stack: str,
        query: int,
        heads: dict[int, list[int]],
        key_len: int,
        on_layer: Callable[[], None] = lambda: None,
    ) -> None:
        self.stack, self.query, self.heads, self.key_len = stack, query, heads, key_len
        self.rows: dict[int, Tensor] = {}
        self.on_layer = on_layer
        self._passed: set[int] = set()

    def observe(self, site: AttentionSite, pattern: Tensor, query_start: int) -> None:
        if site is None or site.stack != self.stack:
            return
        if site.layer not in self._passed:
            self._passed.add(site.layer)
            self.on_layer()
        if site.layer not in self.heads:
            return
        offset = self.query - query_start
        if not 0 <= offset < pattern.shape[2]:
            return
        positions = self.heads[site.layer]
        width = pattern.shape[3]
        row = torch.zeros(len(positions), self.key_len, dtype=torch.float32)  # [chosen heads, key]
        row[:, :width] = pattern[0, positions, offset, :].float().cpu()
        self.rows[site.layer] = row


def query_rows(
    source: LoadedModel | AttentionCapture, text: str | int | None = None, query: QueryPosition = "last", **options: Any
) -> QueryRows:
    """One query's attention over every key, per layer and head: ``query_rows(model, text, query)`` runs the model
    keeping only that row (any length: :func:`capture_query_rows`); ``query_rows(capture, query)`` takes it from a
    capture (:func:`query_rows_of_capture`; a capture holds its text, so its second argument is the query).

    ``query``: a token position (negative counts from the end) or ``"last"`` (default). ``options``: ``layers``
    (indices, negative from the end; None: all), ``heads`` (head numbers, None for all, or
    :data:`~attnviz.common.selection.MEAN_OF_HEADS`), ``stack``; with a model also ``target``, ``max_length``,
    ``truncate``, as :func:`capture_query_rows` takes them.
    """
    if isinstance(source, AttentionCapture):
        chosen: Any = query if text is None else text  # the query, checked by resolve_query
        return query_rows_of_capture(source, chosen, **options)
    if not isinstance(text, str):
        raise ParameterError("text", f"give the text whose query to keep: query_rows(model, text, query), not {text!r}")
    return capture_query_rows(source, text, query, **options)


def capture_query_rows(
    loaded: LoadedModel,
    text: str,
    query: QueryPosition,
    layers: LayerSelection = None,
    heads: HeadSelection = None,
    *,
    stack: str | None = None,
    target: str | None = None,
    max_length: int | None = None,
    truncate: bool = True,
) -> QueryRows:
    """Run ``loaded`` on ``text`` and keep only query ``query``'s attention over every key.

    ``query``: a token position (negative counts from the end) or ``"last"``; ``layers``: indices
    (negative from the end) or None for every layer; ``heads``: head numbers, None for all, or
    :data:`~attnviz.common.selection.MEAN_OF_HEADS` for one averaged row per layer. ``stack`` defaults
    to the model's first (``self``, or ``encoder``); ``decoder`` and ``cross`` need the decoder text
    ``target``, whose tokens are then the queries. Memory: the rows kept, ``layers · heads · keys``
    floats, plus one block of the core; never a whole ``[query, key]`` pattern.
    """
    if loaded.modality != "text":
        raise InputError(f"{loaded.name} reads images: pick its query patch with attnviz.heatmap(capture, query=...)")
    stack = stack or loaded.stacks()[0]
    if stack not in loaded.stacks():
        raise InputError(f"{loaded.name} has no {stack} attention; it has {', '.join(loaded.stacks())}")
    if stack_of(stack).query_side == "target" and target is None:
        raise ParameterError("target", f"the queries of {stack} attention are the decoder's tokens: give {{target}}")
    batch = loaded.encode(
        [text],
        targets=None if target is None or not loaded.encoder_decoder else [target],
        max_length=max_length,
        truncate=truncate,
    )
    query_tokens, key_tokens = (tokens[0] for tokens in batch.query_key_tokens(stack))
    index = resolve_query(query, len(query_tokens), query_tokens)  # refused before the model runs
    counts = {site.layer: count for site, count in loaded.layout().items() if site.stack == stack}
    layer_ids = resolve_layers(layers, loaded.num_layers(stack), loaded.present_layers(stack))
    identity = model_identity(loaded)
    chosen = {}
    for layer in layer_ids:
        ids = identity.ids(stack, layer, counts[layer]) if identity else list(range(counts[layer]))
        chosen[layer] = _chosen_heads(heads, ids)
    with progress_bar() as bar:
        task = bar.add_task(f"{loaded.name} · query {index} · layers", total=len(counts), status="")
        observer = _QueryRowObserver(
            stack,
            index,
            {layer: positions for layer, (positions, _) in chosen.items()},
            len(key_tokens),
            on_layer=lambda: bar.advance(task),
        )
        # the core computes only this query's row; each layer's output takes torch's fused attention
        context = dataclasses.replace(loaded.context([observer]), observed_queries=range(index, index + 1))
        with torch.no_grad():
            loaded.forward(batch, context)
    missing = [layer for layer in layer_ids if layer not in observer.rows]
    if missing:
        raise UnsupportedModelError(
            f"{loaded.name}: the attention of {stack} layers {missing} did not pass through attnviz's core"
        )
    rows = [observer.rows[layer] for layer in layer_ids]  # [head, key] each
    numbers = [chosen[layer][1] for layer in layer_ids]
    causal = is_causal_stack(stack, loaded.causal)
    return _query_rows(loaded.name, stack, index, (query_tokens, key_tokens), layer_ids, numbers, rows, causal, heads)


def query_rows_of_capture(
    capture: AttentionCapture,
    query: QueryPosition,
    layers: LayerSelection = None,
    heads: HeadSelection = None,
    *,
    stack: str | None = None,
) -> QueryRows:
    """The rows :func:`capture_query_rows` keeps, taken from a capture (selections as there)."""
    if capture.image_grid is not None:
        raise InputError("this capture is of an image: pick its query patch with attnviz.heatmap(capture, query=...)")
    stack = stack or capture.stacks[0]
    layer_ids = resolve_layers(layers, capture.num_layers(stack))  # refuses a stack the capture lacks
    tokens = capture.axis_tokens(stack)
    index = resolve_query(query, len(tokens[0]), tokens[0])
    head_numbers, rows = [], []
    for layer in layer_ids:
        patterns = capture.layer(layer, stack)  # [head, query, key]
        ids = capture.identity.ids(stack, layer, patterns.shape[0]) if capture.identity else None
        positions, numbers = _chosen_heads(heads, ids if ids is not None else list(range(patterns.shape[0])))
        rows.append(patterns[positions, index, :].detach().float().cpu().clone())  # [head, key]
        head_numbers.append(numbers)
    causal = capture.is_causal(stack)
    return _query_rows(capture.model, stack, index, tokens, layer_ids, head_numbers, rows, causal, heads)


def _query_rows(
    model: str,
    stack: str,
    index: int,
    tokens: tuple[Sequence[str], Sequence[str]],
    layers: list[int],
    heads: list[list[int]],
    rows: list[Tensor],
    causal: bool,
    selection: HeadSelection,
) -> QueryRows:
    """The :class:`QueryRows` of ``rows`` (``[head, key]`` per layer), averaged over heads for ``MEAN_OF_HEADS``."""
    query_tokens, key_tokens = tokens
    mean = isinstance(selection, MeanOfHeads)
    return QueryRows(
        model=model,
        stack=stack,
        query=index,
        query_tokens=list(query_tokens),
        key_tokens=list(key_tokens),
        layers=layers,
        heads=heads,
        rows=[row.mean(dim=0, keepdim=True) for row in rows] if mean else rows,
        visible=_visibility(causal, index, len(query_tokens), len(key_tokens)),
        mean_of_heads=mean,
    )
