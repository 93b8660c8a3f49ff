"""Head similarity: mean Jensen–Shannon divergence between the patterns of every pair of heads.

Clark et al. (2019, §6): for two heads and one query, both patterns are distributions over the
same keys; their divergence is ``JS(p, q) = ½ KL(p ‖ m) + ½ KL(q ‖ m)`` with ``m = ½ (p + q)``, in
nats (0 for identical distributions, at most ln 2). The matrix is its mean over every query of
every example. It is computed without expanding the KL terms per pair:
``JS = ½ (Σ p ln p + Σ q ln q) − Σ m ln m``, so each pair costs one pass over ``m``.

Memory stays bounded: one example (or one probe batch) is run at a time, and only the first
``max_tokens`` queries and keys of each pattern are kept (:data:`DEFAULT_MAX_TOKENS`). For a
causal head that cut is exact (query i never sees keys past i); for a bidirectional head each
kept row is renormalised over the kept keys. Only the first stack is compared (``self``, or
``encoder`` for encoder-decoder models), whose heads all share the same query and key tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from attnviz.common.errors import InputError
from attnviz.core import AttentionSite
from attnviz.core.stacks import is_causal_stack
from attnviz.heads.probes import ProbeSettings, probe_batches, resolve_settings
from attnviz.heads.result import HeadSimilarity
from attnviz.models.base import LoadedModel

#: Examples are cut to this many tokens (queries and keys).
DEFAULT_MAX_TOKENS = 64
#: Pairs of heads are processed in steps of about this many ``[pair, cell]`` elements (16 MiB per buffer).
PAIR_CHUNK_ELEMENTS = 2**22
#: At most this many corpus examples (or probe sequences) are averaged over.
DEFAULT_MAX_EXAMPLES = 8


class LeadingPatternRecorder:
    """Observer keeping, per site, the first ``max_tokens`` queries × keys of every pattern: ``[b, h, n, n]``."""

    accepts_key_prefix = True  # copies what it keeps before the core reuses the block

    def __init__(self, stack: str, max_tokens: int):
        self.stack = stack
        self.max_tokens = max_tokens
        self.patterns: dict[AttentionSite, Tensor] = {}

    def observe(self, site: AttentionSite | None, pattern: Tensor, query_start: int) -> None:
        if site is None or site.stack != self.stack or query_start >= self.max_tokens:
            return
        batch, heads, rows, width = pattern.shape
        keep_rows = min(rows, self.max_tokens - query_start)
        keep_keys = min(width, self.max_tokens)
        if site not in self.patterns:
            self.patterns[site] = pattern.new_zeros(batch, heads, self.max_tokens, self.max_tokens).cpu()
        block = pattern[:, :, :keep_rows, :keep_keys].float().cpu()  # [b, h, rows', keys']
        self.patterns[site][:, :, query_start : query_start + keep_rows, :keep_keys] = block


def pairwise_js(patterns: Tensor, causal: bool = False) -> Tensor:
    """Sum over queries of the JS divergence between every pair of heads.

    Args:
        patterns: ``[heads, query, key]`` float, each row a distribution (sums to 1).
        causal: the patterns are lower triangular (keys after the query have weight 0): only
            the triangle is read, half the work.

    Returns:
        ``[heads, heads]`` float64 sums over the queries (divide by their number for the mean),
        symmetric with a zero diagonal. Summing ``½ (Σ p ln p + Σ q ln q) − Σ m ln m`` over all
        cells of all queries at once gives the same sum as per query, in one pass per pair.
    """
    heads, queries, keys = patterns.shape
    if causal and queries == keys:
        rows, columns = torch.tril_indices(queries, keys)
        flat = patterns[:, rows, columns].float()  # [H, q(q+1)/2] the lower triangle
    else:
        flat = patterns.reshape(heads, queries * keys).float()  # [H, q·k]
    tiny = torch.finfo(torch.float32).tiny
    # Σ p ln p per head; ln(p + tiny) keeps 0·ln 0 = 0 (torch.special.entr is ~10× slower on the CPU)
    negentropy = (flat * (flat + tiny).log()).sum(-1).double()  # [H]
    total_mass = flat.sum(-1).double()  # [H] Σ p = number of queries
    pairs = torch.triu_indices(heads, heads, offset=1)  # [2, P]: every pair i < j once
    cells = flat.shape[1]
    chunk = max(1, PAIR_CHUNK_ELEMENTS // max(1, cells))  # pairs per step: few large kernels, not H small ones
    pair_sums = torch.empty(min(chunk, pairs.shape[1]), cells, dtype=flat.dtype)  # [chunk, cells] reused
    pair_logs = torch.empty_like(pair_sums)
    values = torch.empty(pairs.shape[1], dtype=torch.float64)  # [P]
    for start in range(0, pairs.shape[1], chunk):
        first, second = pairs[0, start : start + chunk], pairs[1, start : start + chunk]  # [c], [c]
        count = first.shape[0]
        # With s = p + q: Σ m ln m = ½ (Σ s ln s − ln 2 · Σ s), so one sum, one log and one dot per pair.
        s = torch.index_select(flat, 0, first, out=pair_sums[:count])  # [c, cells]
        s.add_(torch.index_select(flat, 0, second, out=pair_logs[:count]))
        log_s = torch.add(s, tiny, out=pair_logs[:count]).log_()  # [c, cells]
        s_log_s = log_s.mul_(s).sum(-1).double()  # [c]
        mixture_term = 0.5 * (s_log_s - math.log(2.0) * (total_mass[first] + total_mass[second]))
        values[start : start + count] = 0.5 * (negentropy[first] + negentropy[second]) - mixture_term
    result = torch.zeros(heads, heads, dtype=torch.float64)
    result[pairs[0], pairs[1]] = values.clamp_min(0.0)
    result[pairs[1], pairs[0]] = values.clamp_min(0.0)
    return result


def head_similarity(
    loaded: LoadedModel,
    *,
    texts: Sequence[str] | None = None,
    probe: ProbeSettings | None = None,
    max_examples: int | None = None,
    max_tokens: int | None = None,
) -> HeadSimilarity:
    """Mean JS divergence between every pair of heads of the first stack, over ``texts`` or the probes."""
    max_examples = DEFAULT_MAX_EXAMPLES if max_examples is None else max_examples
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if max_examples < 1 or max_tokens < 2:
        raise InputError("head similarity needs at least 1 example and 2 tokens per example")
    stack = loaded.stacks()[0]
    causal = is_causal_stack(stack, loaded.causal)
    totals: Tensor | None = None
    queries = 0
    heads: list[tuple[str, int, int]] = []
    for batch in _batches(loaded, texts, probe, max_examples, max_tokens):
        recorder = LeadingPatternRecorder(stack, max_tokens)
        with torch.no_grad():
            loaded.forward(batch, loaded.context([recorder]))
        sites = sorted(recorder.patterns)
        heads = [(site.stack, site.layer, head) for site in sites for head in range(recorder.patterns[site].shape[1])]
        lengths = batch.query_key_lengths(stack)[0]
        for example, length in enumerate(lengths):
            n = min(length, max_tokens)
            patterns = torch.cat([recorder.patterns[site][example, :, :n, :n] for site in sites])  # [H, n, n]
            if not causal:
                patterns = patterns / patterns.sum(-1, keepdim=True).clamp_min(1e-12)
            sums = pairwise_js(patterns, causal=causal)
            totals = sums if totals is None else totals + sums
            queries += n
    if totals is None or queries == 0:
        raise InputError("no example to compare heads on: give at least one text")
    return HeadSimilarity(
        heads=heads,
        divergence=totals / queries,
        source="corpus" if texts is not None else "probes",
        examples=min(max_examples, len(texts)) if texts is not None else max_examples,
        max_tokens=max_tokens,
    )


def _batches(loaded: LoadedModel, texts, probe, max_examples, max_tokens):
    """One text at a time (no padding), or the probe sequences in their batches, up to ``max_examples``.

    Probes are shortened so that both copies fit in ``max_tokens`` (T = 31 at the default 64).
    """
    if texts is not None:
        for text in list(texts)[:max_examples]:
            yield loaded.encode([text])
        return
    settings = resolve_settings(loaded, probe or ProbeSettings())
    # a probe short enough that both copies fit in the kept tokens (BOS + 2T + a closing [SEP] at most)
    length = max(2, min(settings.length, (max_tokens - 2) // 2))
    settings = ProbeSettings(length, max_examples, settings.seed, min(settings.batch_size, max_examples))
    for probe_batch in probe_batches(loaded, settings):
        yield probe_batch.batch


def embedding_2d(divergence: Tensor) -> Tensor:
    """Classical (Torgerson) MDS of a distance matrix: ``[n, n]`` → ``[n, 2]`` coordinates.

    Distances are ``sqrt(JS)`` (the Jensen–Shannon distance, a metric); double centring
    ``B = −½ J D² J`` and the two leading eigenvectors scaled by √eigenvalue.
    """
    distance_sq = divergence.double().clamp_min(0.0)  # D² = JS
    n = distance_sq.shape[0]
    centring = torch.eye(n, dtype=torch.float64) - 1.0 / n  # J
    gram = -0.5 * centring @ distance_sq @ centring  # B
    values, vectors = torch.linalg.eigh(gram)  # ascending
    top = values.flip(0)[:2].clamp_min(0.0)  # [2]
    coordinates = vectors.flip(1)[:, :2] * top.sqrt()  # [n, 2]
    if coordinates.shape[1] < 2:
        coordinates = torch.nn.functional.pad(coordinates, (0, 2 - coordinates.shape[1]))
    return coordinates.float()
