"""The interactive attention page of ``attnviz heatmap --out view.html``: a head view and a model view.

The page is built from patterns alone (no model): every chosen layer of every stack, all heads.
A short input keeps every cell (8-bit codes with one scale per row,
:mod:`attnviz.render.html_page`). Past :data:`FULL_PAGE_CELLS` cells a layer keeps a pooled
overview and each query row's strongest keys within a byte budget
(:mod:`attnviz.render.html_rows`), so the page's size stays bounded whatever the length.

:class:`PageBuilder` takes the patterns one layer (or one row block) at a time, so a page can be
built from a capture, from a stream of layers, or while the model runs
(:mod:`attnviz.render.html_stream`) without holding more than one layer.
Causal stacks carry, per query row, how many keys it may see, so the page draws the rest as masked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.captures.checks import check_capture_in_memory
from attnviz.common.errors import InputError
from attnviz.common.progress import warn
from attnviz.common.tokens import merge_visibility, merge_words
from attnviz.models.identity import HeadIdentity
from attnviz.render.capture_view import model_title
from attnviz.render.heatmap import causal_visibility
from attnviz.render.html_page import build_page, quantize_rows, write_page
from attnviz.render.html_rows import MIN_TOP, LayerReducer, TopBudget
from attnviz.render.selection import LayerSelection, resolve_layers

STACK_NAMES = {
    "self": "self-attention",
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "cross-attention (decoder → encoder)",
}
#: a page keeps every cell of every head up to this many cells in all (about 1.4 bytes each)
FULL_PAGE_CELLS = 12_000_000
#: the bytes a long page may spend on its layers (the whole page stays under 25 MB)
LONG_PAGE_BYTES = 21_000_000

StackLayers = Mapping[str, Sequence[int]]  # stack -> the layer indices on the page
Layout = Mapping[tuple[str, int], int]  # (stack, layer) -> heads


def stack_header(tokens: AttentionCapture, stack: str, words: bool) -> dict:
    """The part of a stack's payload that needs no pattern: labels and per-row visible key counts.

    ``tokens``: a capture (its patterns are not read; one without patterns is fine).
    """
    query_words, key_words = tokens.axis_word_ids(stack)
    queries, keys = tokens.axis_labels(stack, words)
    visible_counts = None  # null: every query sees every key
    if tokens.is_causal(stack):
        token_queries, token_keys = tokens.axis_tokens(stack)
        visible = causal_visibility(len(token_queries), len(token_keys))  # [query, key]
        if words:
            visible = merge_visibility(visible, query_words, key_words)  # [Wq, Wk]
        visible_counts = [int(n) for n in visible.sum(dim=1)]  # a prefix of keys per row
    return {
        "name": stack,
        "label": STACK_NAMES.get(stack, stack),
        "queries": queries,
        "keys": keys,
        "visible": visible_counts,
        "layers": [],
    }


class PageBuilder:
    """Collects one page's layers, one layer or one row block at a time, keeping only what the page stores.

    ``tokens``: a capture that gives the labels (its patterns are not read); ``layers``: stack ->
    layer indices on the page, in order; ``layout``: heads of each (stack, layer). Whether the page
    keeps every cell or reduces rows is decided up front from the sizes, so memory stays one layer's.
    """

    def __init__(
        self,
        tokens: AttentionCapture,
        layers: StackLayers,
        layout: Layout,
        *,
        title: str | None = None,
        words: bool = False,
        identity: HeadIdentity | None = None,
        full_cells: int = FULL_PAGE_CELLS,
        byte_budget: int = LONG_PAGE_BYTES,
    ):
        self.words = words
        self.identity = identity or tokens.identity or HeadIdentity()
        self.stacks = {stack: stack_header(tokens, stack, words) for stack in layers}
        self.word_ids = {stack: tokens.axis_word_ids(stack) for stack in layers}  # (query, key) word ids
        self.wanted = {stack: list(indices) for stack, indices in layers.items()}
        self.layout = layout
        self.pending: dict[tuple[str, int], dict] = {}
        self.reducers: dict[tuple[str, int], LayerReducer] = {}
        rows = cells = 0
        for stack, indices in self.wanted.items():
            queries, keys = len(self.stacks[stack]["queries"]), len(self.stacks[stack]["keys"])
            for layer in indices:
                rows += layout[stack, layer] * queries
                cells += layout[stack, layer] * queries * keys
        self.budget = None if cells <= full_cells else TopBudget(byte_budget, rows)
        if self.budget is not None and self.budget.least_bytes(rows) > byte_budget:
            warn(
                f"this page holds {rows:,} query rows: even with {MIN_TOP} keys per row it takes about "
                f"{self.budget.least_bytes(rows) / 1e6:.0f} MB (budget {byte_budget / 1e6:.0f} MB); "
                "choose fewer layers for a smaller page"
            )
        self.title = title or model_title(tokens)
        self.causal = tokens.causal

    @property
    def long(self) -> bool:
        """Whether the page reduces rows (True) or keeps every cell (False)."""
        return self.budget is not None

    def _header(self, stack: str, layer: int, heads: int) -> dict:
        return {
            "layer": layer,
            "heads": self.identity.ids(stack, layer, heads),
            "maskedHeads": self.identity.masked_ids(stack, layer),
        }

    def add_layer(self, stack: str, layer: int, pattern: Tensor) -> None:
        """One whole layer: ``pattern`` ``[head, query, key]`` of tokens (merged here when the page shows words)."""
        if self.words:
            query_words, key_words = self.word_ids[stack]
            pattern = merge_words(pattern, query_words, key_words)  # [head, Wq, Wk]
        self.add_block(stack, layer, pattern, 0)

    def add_block(self, stack: str, layer: int, block: Tensor, query_start: int) -> None:
        """Rows ``query_start …`` of a layer: ``[head, rows, c]`` with ``c`` ≤ keys leading keys (the rest are 0).

        Rows must come in order within a layer; the layer is encoded when its last row arrives.
        """
        if layer not in self.wanted.get(stack, ()):
            return
        header = self.stacks[stack]
        queries, keys = len(header["queries"]), len(header["keys"])
        heads, rows = block.shape[0], block.shape[1]
        site = (stack, layer)
        if self.budget is None:
            blocks = self.pending.setdefault(site, {"blocks": [], "rows": 0})
            if block.shape[2] < keys:  # a key-prefix block: the later keys are exactly 0
                block = torch.cat([block, block.new_zeros(heads, rows, keys - block.shape[2])], dim=2)
            blocks["blocks"].append(block.detach().float().cpu().clone())
            blocks["rows"] += rows
            if blocks["rows"] == queries:
                pattern = torch.cat(self.pending.pop(site)["blocks"], dim=1)  # [head, query, key]
                header["layers"].append({**self._header(stack, layer, heads), **quantize_rows(pattern)})
            return
        reducer = self.reducers.get(site)
        if reducer is None:
            reducer = self.reducers[site] = LayerReducer(heads, queries, keys, self.budget.next_top(heads * queries))
        reducer.add(block, query_start)
        if reducer.seen == queries:
            encoded = reducer.payload()
            del self.reducers[site]
            self.budget.spend(heads * queries, reducer.top, len(encoded["rows"]) + len(encoded["pooled"]))
            header["layers"].append({**self._header(stack, layer, heads), "mode": "rows", **encoded})

    def payload(self) -> dict:
        """Everything the page shows (every wanted layer must have been added)."""
        for stack, indices in self.wanted.items():
            done = [entry["layer"] for entry in self.stacks[stack]["layers"]]
            if sorted(done) != sorted(indices):
                raise ValueError(f"{stack}: layers {sorted(set(indices) - set(done))} never arrived")
            self.stacks[stack]["layers"].sort(key=lambda entry: indices.index(entry["layer"]))
        return {
            "format": "attnviz-view",
            "version": 2,
            "title": self.title,
            "words": self.words,
            "causal": self.causal,
            "long": self.long,
            "stacks": list(self.stacks.values()),
        }


def chosen_stacks(available: Sequence[str], stacks: Sequence[str] | None) -> list[str]:
    """The stacks on the page: ``stacks`` if given (each must exist), else all of them."""
    chosen = list(stacks) if stacks else list(available)
    for stack in chosen:
        if stack not in available:
            raise InputError(f"this capture has no {stack} attention (it has {', '.join(available)})")
    return chosen


def stack_payload(
    capture: AttentionCapture,
    stack: str,
    *,
    words: bool = False,
    layers: Sequence[int] | None = None,
    identity: HeadIdentity | None = None,
) -> dict:
    """JSON-ready description of one stack with every cell kept: labels, visible key counts, encoded layers."""
    indices = capture.recorded_layers(stack) if layers is None else list(layers)
    builder = _builder(capture, {stack: indices}, words, identity, full_cells=2**62)
    return builder.payload()["stacks"][0]


def _builder(capture, layers: StackLayers, words, identity, title=None, **limits) -> PageBuilder:
    layout = {(stack, layer): capture.layer(layer, stack).shape[0] for stack, ids in layers.items() for layer in ids}
    builder = PageBuilder(capture, layers, layout, title=title, words=words, identity=identity, **limits)
    for stack, ids in layers.items():
        for layer in ids:
            builder.add_layer(stack, layer, capture.layer(layer, stack))
    return builder


def attention_view_payload(
    capture: AttentionCapture,
    *,
    title: str | None = None,
    words: bool = False,
    layers: LayerSelection = None,
    stacks: Sequence[str] | None = None,
    identity: HeadIdentity | None = None,
    full_cells: int = FULL_PAGE_CELLS,
    byte_budget: int = LONG_PAGE_BYTES,
) -> dict:
    """Everything the page shows: the model's title and one stack payload per stack.

    ``layers``: indices (negative from the end) of the layers on the page, None (default) for all.
    Past ``full_cells`` cells in all, each row keeps its strongest keys within ``byte_budget`` bytes.
    """
    check_capture_in_memory(capture)  # a notebook user may have edited its tokens
    chosen = chosen_stacks(capture.stacks, stacks)
    wanted = {
        stack: capture.recorded_layers(stack) if layers is None else resolve_layers(layers, capture.num_layers(stack))
        for stack in chosen
        if layers is not None or capture.recorded_layers(stack)
    }
    builder = _builder(capture, wanted, words, identity, title, full_cells=full_cells, byte_budget=byte_budget)
    return builder.payload()


def attention_view_html(capture: AttentionCapture, **options) -> str:
    """The self-contained page (head view + model view) for ``capture``; options as :func:`attention_view_payload`."""
    return view_html(attention_view_payload(capture, **options))


def view_html(payload: dict) -> str:
    """The self-contained page of a payload (:meth:`PageBuilder.payload`)."""
    return build_page(f"attnviz · {payload['title']}", payload, ["common.js", "view.js"], ["style.css"])


def write_attention_view(path: str | Path, capture: AttentionCapture, **options) -> Path:
    """Write :func:`attention_view_html` to ``path`` (``.html``), atomically."""
    return write_page(path, attention_view_html(capture, **options))
