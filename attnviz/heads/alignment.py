"""How well cross-attention heads align words: the alignment error rate (AER) against gold links.

Gold alignments are Pharaoh-style ``i-j`` pairs over whitespace-separated words (``i`` a
source word, ``j`` a target word, from 0). Possible (not sure) links are written ``i?j``,
``i-j?``, ``ipj`` or ``i-j-P``; ``isj`` and ``i-j-S`` are sure links like ``i-j``.

With sure links S, possible links P ⊇ S and predicted links A (Och & Ney 2003)::

    AER = 1 − (|A ∩ S| + |A ∩ P|) / (|A| + |S|)

counted over the whole corpus (the sums run over every sentence pair before dividing).

A head predicts links from its cross-attention merged into words (attention *to* a source
word sums its pieces, attention *from* a target word averages its pieces, as in
:mod:`attnviz.common.tokens`; special tokens are left out). The row of a target word is, by default,
the decoder step that *predicts* it (the row one position earlier, whose input is the
previous token): that is where a translation model looks at the source to choose the
word. ``rows="reading"`` uses the word's own rows instead. Two rules turn weights into links:

* ``argmax``: each target word links to the source word it attends to most;
* ``threshold``: each target word links to every source word with weight ≥ ``threshold``.

Layer means (the average pattern of a layer's heads) are scored like heads, with head ``None``.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnviz.captures.attention_capture import AttentionCapture, capture_batch
from attnviz.common.encoding import check_utf8
from attnviz.common.errors import InputError, ParameterError, UnsupportedModelError
from attnviz.common.texts import json_records
from attnviz.common.tokens import merge_words, word_groups, word_piece
from attnviz.heads.choices import RowChoice
from attnviz.models.base import LoadedModel
from attnviz.outputs.files import read_text_file

_LINK = re.compile(r"^(\d+)(?:(-)(\d+)(\?|-[PpSs])?|([?pPsS])(\d+))$")


@dataclass(frozen=True)
class GoldAlignment:
    """Gold links of one sentence pair, as (source word, target word) pairs; ``possible`` includes ``sure``."""

    sure: frozenset[tuple[int, int]]
    possible: frozenset[tuple[int, int]]


@dataclass
class AlignmentPair:
    """One line of an alignment data file."""

    source: str
    target: str
    gold: GoldAlignment


@dataclass
class LinkCounts:
    """Corpus sums of |A ∩ S|, |A ∩ P|, |A| and |S|."""

    sure_hits: int = 0
    possible_hits: int = 0
    predicted: int = 0
    sure: int = 0

    def add(self, predicted: set[tuple[int, int]], gold: GoldAlignment) -> None:
        self.sure_hits += len(predicted & gold.sure)
        self.possible_hits += len(predicted & gold.possible)
        self.predicted += len(predicted)
        self.sure += len(gold.sure)

    @property
    def aer(self) -> float:
        total = self.predicted + self.sure
        return 1.0 - (self.sure_hits + self.possible_hits) / total if total else 0.0

    @property
    def precision(self) -> float:
        """|A ∩ P| / |A|."""
        return self.possible_hits / self.predicted if self.predicted else 0.0

    @property
    def recall(self) -> float:
        """|A ∩ S| / |S|."""
        return self.sure_hits / self.sure if self.sure else 0.0


@dataclass
class HeadAlignment:
    """Alignment quality of one cross-attention head (``head`` None: the layer's mean pattern)."""

    layer: int
    head: int | None
    aer: float  # argmax links
    threshold_aer: float  # links at or above the threshold
    precision: float  # argmax links
    recall: float  # argmax links


@dataclass
class AlignmentResult:
    """Every head's and layer mean's AER, best (lowest argmax AER) first."""

    model: str
    num_pairs: int
    threshold: float
    rows: str
    heads: list[HeadAlignment]

    def head(self, layer: int, head: int | None) -> HeadAlignment:
        for entry in self.heads:
            if entry.layer == layer and entry.head == head:
                return entry
        raise InputError(f"no cross-attention head {head} in layer {layer}")

    def aer_grid(self, threshold: bool = False) -> Tensor:
        """``[layer, head + 1]`` AER; the last column is the layer mean."""
        layers = max(h.layer for h in self.heads) + 1
        heads = max(h.head for h in self.heads if h.head is not None) + 1
        grid = torch.full((layers, heads + 1), float("nan"))
        for entry in self.heads:
            grid[entry.layer, heads if entry.head is None else entry.head] = (
                entry.threshold_aer if threshold else entry.aer
            )
        return grid

    def to_record(self) -> dict:
        return {
            "format": "attnviz-align",
            "version": 1,
            "model": self.model,
            "pairs": self.num_pairs,
            "threshold": self.threshold,
            "rows": self.rows,
            "heads": [asdict(h) for h in self.heads],
        }


# -- gold alignments ----------------------------------------------------------------------------


def parse_alignment(text: str) -> GoldAlignment:
    """Parse Pharaoh links (see the module docstring) into sure and possible (source, target) pairs."""
    sure, possible = set(), set()
    for link in text.split():
        match = _LINK.match(link)
        if match is None:
            raise InputError(
                f"alignment link {link!r} is not Pharaoh notation: write i-j (sure) or i?j, i-j?, ipj (possible)"
            )
        if match.group(2):
            pair, mark = (int(match.group(1)), int(match.group(3))), match.group(4) or ""
        else:
            pair, mark = (int(match.group(1)), int(match.group(6))), match.group(5)
        is_possible = mark.lstrip("-").lower() in ("?", "p")
        possible.add(pair)
        if not is_possible:
            sure.add(pair)
    return GoldAlignment(frozenset(sure), frozenset(possible))


def read_alignment_pairs(path: str | Path | None = None, *, text: str | None = None) -> list[AlignmentPair]:
    """Sentence pairs of a JSON Lines file (``{"source", "target", "alignment"}`` per line), or of ``text``."""
    name = "standard input" if path is None else str(path)
    if text is None and path is None:
        raise InputError("give an alignment data file or its text")
    content = text if text is not None else read_text_file(path, "alignment data file")  # type: ignore[arg-type]
    pairs = []
    numbered_lines = enumerate(content.splitlines(), start=1)
    for number, record in json_records(
        numbered_lines, lambda number, exc: f"{name}:{number}: not valid JSON ({exc.msg})"
    ):
        if not isinstance(record, dict) or not all(
            isinstance(record.get(key), str) for key in ("source", "target", "alignment")
        ):
            raise InputError(f'{name}:{number}: each line needs string "source", "target" and "alignment" fields')
        for key in ("source", "target"):
            check_utf8(record[key], f"{name}:{number}: the {key} field")  # a JSON escape may spell no text
        try:
            gold = parse_alignment(record["alignment"])
        except InputError as exc:
            raise InputError(f"{name}:{number}: {exc}") from exc
        source_words, target_words = record["source"].split(), record["target"].split()
        if not source_words or not target_words:
            raise InputError(f"{name}:{number}: source and target need at least one word each")
        for i, j in gold.possible:
            if i >= len(source_words) or j >= len(target_words):
                raise InputError(
                    f"{name}:{number}: link {i}-{j} is out of range: the source has {len(source_words)} words "
                    f"and the target {len(target_words)} (indices start at 0)"
                )
        pairs.append(AlignmentPair(record["source"], record["target"], gold))
    if not pairs:
        raise InputError(f"{name} has no sentence pairs: write one JSON object per line")
    return pairs


def alignment_error_rate(predicted: set[tuple[int, int]], gold: GoldAlignment) -> float:
    """AER of one sentence pair."""
    counts = LinkCounts()
    counts.add(predicted, gold)
    return counts.aer


# -- tokens to whitespace words --------------------------------------------------------------------


def _normalise(text: str) -> str:
    """Lower case without accents or spaces, so tokenizer words and whitespace words compare."""
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c) and not c.isspace())


def whitespace_word_ids(
    tokens: Sequence[str], word_ids: Sequence[int | None], text: str, where: str
) -> list[int | None]:
    """For each token, the index of the whitespace-separated word of ``text`` it belongs to (None: special).

    The tokenizer's own words (``word_ids``) may split a whitespace word further (``mat.`` →
    ``mat``, ``.``); their characters are matched against the text's words in order.
    """
    words = text.split()
    ends, total = [], 0
    for word in words:
        total += len(_normalise(word))
        ends.append(total)  # character position where each whitespace word ends
    result: list[int | None] = [None] * len(tokens)
    consumed, current = 0, 0
    for group in word_groups(word_ids):
        if word_ids[group[0]] is None:
            continue
        label = _normalise("".join(word_piece(tokens, i, k) for k, i in enumerate(group)))
        while current < len(words) - 1 and consumed >= ends[current]:
            current += 1
        for index in group:
            result[index] = current
        consumed += len(label)
    if consumed != total:
        raise InputError(
            f"{where}: the tokens do not spell the words of {text!r} (unknown tokens or truncation): "
            "simplify the text or allow a longer maximum length"
        )
    return result


# -- scoring ------------------------------------------------------------------------------------------


def word_cross_attention(capture: AttentionCapture, pair: AlignmentPair, rows: RowChoice, where: str) -> Tensor:
    """``[layer, head, target word, source word]`` cross-attention of one captured pair."""
    if capture.target_tokens is None or capture.word_ids is None or capture.target_word_ids is None:
        raise InputError(f"{where}: the capture has no target side or no word ids: capture an encoder-decoder model")
    source_ids = whitespace_word_ids(capture.tokens, capture.word_ids, pair.source, where)
    target_ids = whitespace_word_ids(capture.target_tokens, capture.target_word_ids, pair.target, where)
    patterns = capture.stacked("cross")  # [layer, head, q, k]
    if rows == "predicting":
        # the row that predicts token p is row p − 1 (its input is token p − 1); the first token has none
        patterns = torch.cat([torch.zeros_like(patterns[..., :1, :]), patterns[..., :-1, :]], dim=-2)
    merged = merge_words(patterns, target_ids, source_ids)  # [layer, head, Wq, Wk] incl. special groups
    keep_rows = [i for i, g in enumerate(word_groups(target_ids)) if target_ids[g[0]] is not None]
    keep_columns = [i for i, g in enumerate(word_groups(source_ids)) if source_ids[g[0]] is not None]
    return merged[..., keep_rows, :][..., keep_columns]  # [layer, head, target words, source words]


def predicted_links(weights: Tensor, threshold: float | None) -> set[tuple[int, int]]:
    """(source, target) links of a ``[target word, source word]`` matrix: argmax per row, or all ≥ threshold."""
    if threshold is None:
        return {(int(source), target) for target, source in enumerate(weights.argmax(dim=-1).tolist())}
    targets, sources = torch.nonzero(weights >= threshold, as_tuple=True)
    return set(zip(sources.tolist(), targets.tolist()))


def align_heads(
    loaded: LoadedModel,
    pairs: Sequence[AlignmentPair],
    *,
    threshold: float = 0.3,
    rows: RowChoice = "predicting",
    batch_size: int = 16,
    max_length: int | None = None,
    progress=None,
) -> AlignmentResult:
    """AER of every cross-attention head and layer mean of ``loaded`` on ``pairs`` (best first).

    ``progress``: optional callable ``progress(done, total)`` called after each batch.
    """
    if loaded.modality == "image":
        raise UnsupportedModelError(
            f"{loaded.name} is a vision model: align scores cross-attention against word alignments of sentence "
            "pairs, a text tool; it needs an encoder-decoder text model"
        )
    if not loaded.encoder_decoder or "cross" not in loaded.stacks():
        raise UnsupportedModelError(f"{loaded.name} has no cross-attention: alignment needs an encoder-decoder model")
    if not 0.0 < threshold <= 1.0:
        raise ParameterError("threshold", f"{{threshold}} (link weight) must lie in (0, 1], got {threshold}")
    if rows not in ("predicting", "reading"):
        raise ParameterError("rows", f"{{rows}} must be predicting or reading, got {rows!r}")
    argmax_counts: dict[tuple[int, int | None], LinkCounts] = {}
    threshold_counts: dict[tuple[int, int | None], LinkCounts] = {}
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        captures = capture_batch(
            loaded, [p.source for p in chunk], targets=[p.target for p in chunk], max_length=max_length
        )
        for offset, (pair, capture) in enumerate(zip(chunk, captures)):
            words = word_cross_attention(capture, pair, rows, f"pair {start + offset + 1}")  # [L, H, Wt, Ws]
            layer_means = words.mean(dim=1)  # [L, Wt, Ws]
            for layer in range(words.shape[0]):
                candidates = [(h, words[layer, h]) for h in range(words.shape[1])] + [(None, layer_means[layer])]
                for head, weights in candidates:
                    key = (layer, head)
                    argmax_counts.setdefault(key, LinkCounts()).add(predicted_links(weights, None), pair.gold)
                    threshold_counts.setdefault(key, LinkCounts()).add(predicted_links(weights, threshold), pair.gold)
        if progress is not None:
            progress(min(start + batch_size, len(pairs)), len(pairs))
    heads = [
        HeadAlignment(
            layer=layer,
            head=head,
            aer=counts.aer,
            threshold_aer=threshold_counts[(layer, head)].aer,
            precision=counts.precision,
            recall=counts.recall,
        )
        for (layer, head), counts in argmax_counts.items()
    ]
    heads.sort(key=lambda h: (h.aer, h.threshold_aer, h.layer, -1 if h.head is None else h.head))
    return AlignmentResult(model=loaded.name, num_pairs=len(pairs), threshold=threshold, rows=rows, heads=heads)


def write_alignment_json(path: str | Path, result: AlignmentResult) -> Path:
    """Write :meth:`AlignmentResult.to_record` as JSON, atomically."""
    from attnviz.outputs.files import write_text_atomic

    return write_text_atomic(path, json.dumps(result.to_record(), indent=2) + "\n")
