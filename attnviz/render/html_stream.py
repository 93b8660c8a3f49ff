"""An attention page built while the model runs: no capture of every layer is ever held.

A capture of every layer and head costs ``layers · heads · n² · 4`` bytes (18 GB for SmolLM2 at
4,096 tokens). :func:`stream_attention_view` instead hands each block of rows the attention core
computes straight to a :class:`~attnviz.render.html_view.PageBuilder`, which keeps only what the page
stores, so memory stays that of one layer's reduction. Short inputs go through an ordinary capture
(which also allows ``words``); :func:`attention_view_of_text` picks the path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from attnviz.captures.attention_capture import AttentionCapture, capture
from attnviz.common.errors import InputError
from attnviz.common.progress import progress_bar
from attnviz.core import AttentionSite
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.identity import model_identity
from attnviz.outputs.files import check_output_path
from attnviz.render.html_page import HTML_SUFFIXES, write_page
from attnviz.render.html_view import PageBuilder, attention_view_payload, chosen_stacks, view_html
from attnviz.render.selection import LayerSelection, resolve_layers

#: inputs whose capture of the chosen layers would exceed this many bytes are streamed, not captured
CAPTURE_BYTES = 1 << 30


class _PageObserver:
    """Hands every block of rows of example 0 to a page builder (the core reuses the block's buffer)."""

    accepts_key_prefix = True

    def __init__(self, builder: PageBuilder, on_layer) -> None:
        self.builder, self.on_layer = builder, on_layer
        self.rows: dict[AttentionSite, int] = {}

    def observe(self, site: AttentionSite, pattern: Tensor, query_start: int) -> None:
        if site is None:
            return
        self.builder.add_block(site.stack, site.layer, pattern[0], query_start)  # [head, rows, c]
        self.rows[site] = self.rows.get(site, 0) + pattern.shape[2]
        queries = len(self.builder.stacks[site.stack]["queries"]) if site.stack in self.builder.stacks else 0
        if self.rows[site] == queries:
            self.on_layer()


def _tokens_of(batch: EncodedBatch, loaded: LoadedModel) -> AttentionCapture:
    """A capture without patterns: the labels, word boundaries and identity of the batch's one example."""
    return AttentionCapture(
        model=loaded.name,
        tokens=batch.tokens[0],
        causal=loaded.causal,
        patterns={},
        special=batch.special[0],
        word_ids=batch.word_ids[0],
        target_tokens=batch.target_tokens[0] if batch.target_tokens else None,
        target_special=batch.target_special[0] if batch.target_special else None,
        target_word_ids=batch.target_word_ids[0] if batch.target_word_ids else None,
        identity=model_identity(loaded),
    )


def stream_attention_view(
    loaded: LoadedModel,
    batch: EncodedBatch,
    *,
    layers: LayerSelection = None,
    stacks: Sequence[str] | None = None,
    title: str | None = None,
    observers: Sequence = (),
    **limits,
) -> dict:
    """The page's payload for the one example of ``batch``, built block by block while ``loaded`` runs.

    ``layers``/``stacks`` as :func:`~attnviz.render.html_view.attention_view_payload`; ``observers``: more
    observers of the same forward pass (statistics, a reference); ``limits``: ``full_cells`` and
    ``byte_budget`` of :class:`~attnviz.render.html_view.PageBuilder`.
    """
    if len(batch) != 1:
        raise InputError("a page shows one text: encode exactly one")
    layout = loaded.layout()  # site -> heads
    available = list(dict.fromkeys(site.stack for site in layout))
    chosen = chosen_stacks(available, stacks)
    wanted = {stack: resolve_layers(layers, loaded.num_layers(stack), loaded.present_layers(stack)) for stack in chosen}
    heads = {(site.stack, site.layer): count for site, count in layout.items()}
    builder = PageBuilder(_tokens_of(batch, loaded), wanted, heads, title=title, **limits)
    total = sum(len(ids) for ids in wanted.values())
    with progress_bar() as bar:
        task = bar.add_task("building the page", total=total)
        observer = _PageObserver(builder, lambda: bar.advance(task))
        with torch.no_grad():
            loaded.forward(batch, loaded.context([observer, *observers]))
    return builder.payload()


def attention_view_of_text(
    loaded: LoadedModel,
    text: str,
    *,
    target: str | None = None,
    max_length: int | None = None,
    truncate: bool = True,
    words: bool = False,
    layers: LayerSelection = None,
    stacks: Sequence[str] | None = None,
    title: str | None = None,
) -> tuple[dict, AttentionCapture]:
    """The page's payload for ``text``, and a capture of its tokens (with patterns only when it was captured).

    Captures the text when the chosen layers' patterns fit in :data:`CAPTURE_BYTES`, else streams
    them (:func:`stream_attention_view`); ``words`` needs the capture.
    """
    batch = loaded.encode(
        [text], targets=None if target is None else [target], max_length=max_length, truncate=truncate
    )
    tokens = _tokens_of(batch, loaded)
    layout = loaded.layout()
    chosen = chosen_stacks(list(dict.fromkeys(site.stack for site in layout)), stacks)
    size = 0
    for site, heads in layout.items():
        present = loaded.present_layers(site.stack)
        if site.stack in chosen and site.layer in resolve_layers(layers, loaded.num_layers(site.stack), present):
            queries, keys = tokens.axis_tokens(site.stack)
            size += 4 * heads * len(queries) * len(keys)
    if size <= CAPTURE_BYTES:
        result = capture(loaded, text, target=target, max_length=max_length, truncate=truncate)
        payload = attention_view_payload(result, title=title, words=words, layers=layers, stacks=stacks)
        return payload, result
    if words:
        raise InputError(
            f"merging words needs a capture of every chosen layer ({size / 2**30:.1f} GB at this length): "
            "choose fewer layers, or draw tokens"
        )
    return stream_attention_view(loaded, batch, layers=layers, stacks=stacks, title=title), tokens


def write_attention_view_of_text(
    path: str | Path, loaded: LoadedModel, text: str, **options
) -> tuple[Path, AttentionCapture]:
    """Write the page of ``text`` (options as :func:`attention_view_of_text`) atomically; the path and the tokens."""
    path = check_output_path(path, HTML_SUFFIXES)
    payload, tokens = attention_view_of_text(loaded, text, **options)
    return write_page(path, view_html(payload)), tokens
