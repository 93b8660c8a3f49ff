"""Two inputs on one model (a minimal pair), head by head: per-cell difference, JS per query, statistics.

How the two patterns are put on one grid (``alignment``):

* ``"tokens"``: both texts have the same number of tokens; cell ``(i, j)`` of A faces cell ``(i, j)`` of B.
* ``"words"``: the lengths differ; tokens are merged into words (attention *to* a word sums its pieces,
  attention *from* a word averages them, :func:`attnviz.common.tokens.merge_words`) and the words the two
  texts share, in order (longest matching runs of equal words), are compared. Each kept row is
  renormalised over the kept words, so it stays a distribution.
* ``"statistics"``: no word in common; only the per-head statistics of each input are compared.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import torch
from torch import Tensor

from attnviz.captures.attention_capture import AttentionCapture, capture
from attnviz.common.errors import InputError
from attnviz.common.tokens import display_token, merge_words, word_groups, word_label
from attnviz.compare.divergence import query_divergences
from attnviz.compare.result import _number, record_header, statistics_of
from attnviz.core import AttentionSite
from attnviz.models.base import LoadedModel
from attnviz.models.specs import load_model
from attnviz.stats.compute import compute_statistics
from attnviz.stats.definitions import STATISTIC_NAMES
from attnviz.stats.result import HeadStatistics


@dataclass
class InputComparison:
    """The patterns of two inputs on one model, on a common grid (see the module docstring)."""

    model: str
    text_a: str
    text_b: str
    capture_a: AttentionCapture
    capture_b: AttentionCapture
    alignment: str  # "tokens", "words" or "statistics"
    labels_a: list[str]  # A's own token or word at each position of the common grid; [] for "statistics"
    labels_b: list[str]  # B's own token or word at each position of the grid (B's labels, never A's)
    positions_a: list[int]  # which grid position of A (token or word) each label is
    positions_b: list[int]
    patterns_a: dict[AttentionSite, Tensor]  # site -> [h, n, n] float32 on the grid (empty for "statistics")
    patterns_b: dict[AttentionSite, Tensor]
    stats_a: HeadStatistics
    stats_b: HeadStatistics

    @property
    def sites(self) -> list[AttentionSite]:
        return sorted(self.stats_a.sites)

    def difference(self, stack: str = "self", layer: int = 0) -> Tensor:
        """``[h, n, n]`` B − A on the grid."""
        site = AttentionSite(stack, layer)
        return self.patterns_b[site] - self.patterns_a[site]

    def query_divergence(self, stack: str = "self", layer: int = 0) -> tuple[Tensor, Tensor]:
        """``([h, n], [h, n])``: JS divergence (nats) and total variation of each query row on the grid."""
        site = AttentionSite(stack, layer)
        return query_divergences(self.patterns_a[site], self.patterns_b[site])

    def heads(self) -> list[dict]:
        """One JSON entry per head (the same fields as a model comparison's, status ``matched``)."""
        entries = []
        for site in self.sites:
            js = tv = None
            if site in self.patterns_a:
                per_query_js, per_query_tv = self.query_divergence(site.stack, site.layer)  # [h, n]
                js, tv = per_query_js.double().mean(-1), per_query_tv.double().mean(-1)  # [h]
            for position, head in enumerate(self.stats_a.original_ids(site)):
                a = statistics_of(self.stats_a, site, position)
                b = statistics_of(self.stats_b, site, position)
                entries.append(
                    {
                        "stack": site.stack,
                        "layer": site.layer,
                        "head": head,
                        "status": "matched",
                        "js_divergence": None if js is None else _number(float(js[position])),
                        "total_variation": None if tv is None else _number(float(tv[position])),
                        "a": {name: _number(value) for name, value in a.items()},
                        "b": {name: _number(value) for name, value in b.items()},
                        "delta": {name: _number(b[name] - a[name]) for name in STATISTIC_NAMES},
                    }
                )
        return entries

    def record(self) -> dict:
        """The JSON object of ``attnviz diff MODEL --text A --against B``."""
        heads = self.heads()
        layers = []
        for site in self.sites:
            mine = [h for h in heads if (h["stack"], h["layer"]) == (site.stack, site.layer)]
            row: dict = {"stack": site.stack, "layer": site.layer}
            for measure in ("js_divergence", "total_variation"):
                values = [h[measure] for h in mine if h[measure] is not None]
                row[measure] = _number(sum(values) / len(values)) if values else None
            row.update(matched=len(mine), only_a=0, only_b=0)
            layers.append(row)
        return {
            **record_header("inputs"),
            "model": self.model,
            "text_a": self.text_a,
            "text_b": self.text_b,
            "tokens_a": self.capture_a.tokens,
            "tokens_b": self.capture_b.tokens,
            "num_tokens_a": len(self.capture_a.tokens),
            "num_tokens_b": len(self.capture_b.tokens),
            "alignment": self.alignment,
            "grid_a": self.labels_a,
            "grid_b": self.labels_b,
            "layers": layers,
            "heads": heads,
        }


def compare_inputs(
    model: LoadedModel | str, text_a: str, text_b: str, *, max_length: int | None = None, local_window: int = 2
) -> InputComparison:
    """Compare ``model``'s attention on ``text_a`` and ``text_b`` head by head (see the module docstring)."""
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    if loaded.encoder_decoder:
        raise InputError(f"{loaded.name} is an encoder-decoder model: compare two inputs on an encoder or a decoder")
    capture_a = capture(loaded, text_a, max_length=max_length)
    capture_b = capture(loaded, text_b, max_length=max_length)
    stats_a, stats_b = (
        compute_statistics(loaded, [text], local_window=local_window, progress=False, max_length=max_length)
        for text in (text_a, text_b)
    )
    if len(capture_a.tokens) == len(capture_b.tokens):
        alignment = "tokens"
        positions = list(range(len(capture_a.tokens)))
        positions_a = positions_b = positions
        labels_a = [display_token(token) for token in capture_a.tokens]
        labels_b = [display_token(token) for token in capture_b.tokens]
        patterns_a = _sites(capture_a)
        patterns_b = _sites(capture_b)
    else:
        words_a, words_b = _word_labels(capture_a), _word_labels(capture_b)
        positions_a, positions_b = _matching_words([w.lower() for w in words_a], [w.lower() for w in words_b])
        if positions_a:
            alignment = "words"
            labels_a = [words_a[i] for i in positions_a]
            labels_b = [words_b[i] for i in positions_b]
            patterns_a = {site: _word_grid(capture_a, p, positions_a) for site, p in _sites(capture_a).items()}
            patterns_b = {site: _word_grid(capture_b, p, positions_b) for site, p in _sites(capture_b).items()}
        else:
            alignment, labels_a, labels_b, patterns_a, patterns_b = "statistics", [], [], {}, {}
    return InputComparison(
        model=loaded.name,
        text_a=text_a,
        text_b=text_b,
        capture_a=capture_a,
        capture_b=capture_b,
        alignment=alignment,
        labels_a=labels_a,
        labels_b=labels_b,
        positions_a=positions_a,
        positions_b=positions_b,
        patterns_a=patterns_a,
        patterns_b=patterns_b,
        stats_a=stats_a,
        stats_b=stats_b,
    )


def _sites(result: AttentionCapture) -> dict[AttentionSite, Tensor]:
    return {
        AttentionSite(stack, layer): pattern.float()
        for stack, layers in result.patterns.items()
        for layer, pattern in enumerate(layers)
        if result.is_recorded(layer, stack)  # a hybrid stack's layers without attention hold nothing
    }


def _word_labels(result: AttentionCapture) -> list[str]:
    return [word_label(result.tokens, group) for group in word_groups(result.word_ids)]


def _matching_words(labels_a: list[str], labels_b: list[str]) -> tuple[list[int], list[int]]:
    """Word positions of A and B that face each other: the longest runs of equal words, in order."""
    matcher = difflib.SequenceMatcher(None, labels_a, labels_b, autojunk=False)
    positions_a: list[int] = []
    positions_b: list[int] = []
    for block in matcher.get_matching_blocks():
        positions_a.extend(range(block.a, block.a + block.size))
        positions_b.extend(range(block.b, block.b + block.size))
    return positions_a, positions_b


def _word_grid(result: AttentionCapture, pattern: Tensor, keep: list[int]) -> Tensor:
    """``[h, q, k]`` token pattern -> ``[h, n, n]`` over the kept words, each row renormalised over them."""
    words = merge_words(pattern, result.word_ids, result.word_ids)  # [h, W, W]
    kept = words[:, keep][:, :, keep]  # [h, n, n]
    return kept / kept.sum(-1, keepdim=True).clamp_min(torch.finfo(kept.dtype).tiny)
