"""Why a head attends where it does: its query and key vectors, one pair at a time and over a corpus.

* :func:`explain_logit` — the neuron view (bertviz) of one weight: the query vector ``q`` of one position,
  the key vector ``k`` of another and their product dimension by dimension; ``scaling · Σ_d q_d k_d`` is the
  logit the softmax turns into the weight. In a rotary model (RoPE) dimensions ``i`` and ``i + d_rot/2`` turn
  together at one frequency, so the logit splits by frequency band; a band whose share of the logits changes
  a lot from key to key is what makes the head positional (fast bands) or content-driven (slow bands).
* :func:`query_key_map` — an AttentionViz-style (Yeh et al. 2023) joint 2-D map of the head's queries and
  keys over a corpus. Softmax over keys is unchanged when every key moves by the same vector, and
  ``q·k`` when queries are scaled by ``c`` and keys by ``1/c``; so keys are translated to the queries'
  centroid and both scaled to the same mean norm before one projection (PCA by default) places them
  together: a query lands near the keys it attends to.

The vectors are the ones attnviz's core receives (after rotary position encoding; a grouped-query head reads
its key/value head), recorded through the core's ``observe_inputs`` hook in an ordinary forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnviz.common.display import NotebookDisplay
from attnviz.common.errors import InputError, ParameterError
from attnviz.common.selection import resolve_layers
from attnviz.core import AttentionSite
from attnviz.heads.choices import PROJECTIONS, Projection
from attnviz.models.base import EncodedBatch, LoadedModel

#: rotary frequency bands a breakdown is grouped into (at most)
ROTARY_BANDS = 8


class _HeadRecorder:
    """Observer keeping one head's queries ``[b, q, d]``, keys ``[b, k, d]`` and weights ``[b, q, k]`` at ``site``."""

    accepts_inputs = True

    def __init__(self, site: AttentionSite, head: int) -> None:
        self.site, self.head = site, head
        self.query: Tensor | None = None
        self.key: Tensor | None = None
        self.scaling: float | None = None
        self.heads = 0
        self._rows: list[Tensor] = []

    def observe_inputs(self, site, query: Tensor, key: Tensor, value: Tensor, scaling: float | None) -> None:
        if site != self.site:
            return
        self.heads = query.shape[1]
        if self.head >= self.heads:
            return
        group = self.heads // key.shape[1]  # query heads per key/value head
        self.query = query[:, self.head].detach().float().cpu()  # [b, q, d]
        self.key = key[:, self.head // group].detach().float().cpu()  # [b, k, d]
        self.scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
        self._rows = []

    def observe(self, site, pattern: Tensor, query_start: int) -> None:
        if site == self.site and self.head < pattern.shape[1]:
            self._rows.append(pattern[:, self.head].detach().float().cpu())  # [b, blk, k]

    @property
    def weights(self) -> Tensor:
        return torch.cat(self._rows, dim=1)  # [b, q, k]


def _record(loaded: LoadedModel, batch: EncodedBatch, layer: int, head: int) -> _HeadRecorder:
    """One forward pass of ``batch`` with the recorder at (``layer``, ``head``) of the first stack; checked."""
    stack = loaded.stacks()[0]
    (number,) = resolve_layers([layer], loaded.num_layers(stack), loaded.present_layers(stack), parameter="layer")
    site = AttentionSite(stack, number)
    heads = loaded.layout()[site]
    if not 0 <= head < heads:
        raise ParameterError("head", f"{{head}} {head} is out of range: layer {site.layer} has {heads} heads", head)
    recorder = _HeadRecorder(site, head)
    with torch.no_grad(), loaded.running():
        loaded.forward(batch, loaded.context([recorder]))
    if recorder.query is None or recorder.key is None:
        raise InputError(f"{loaded.name}: no attention call at {site.name} reached attnviz's core")
    return recorder


def _position(value: int | str, length: int, what: str) -> int:
    """A token position: an index (negative from the end) or ``last``."""
    if isinstance(value, str):
        if value.strip().lower() == "last":
            return length - 1
        try:
            value = int(value)
        except ValueError:
            raise ParameterError(what, f"{{{what}}} must be a token position or 'last', got {value!r}", value) from None
    if not -length <= value < length:
        raise ParameterError(what, f"{{{what}}} {value} is out of range: the text has {length} tokens", value)
    return value % length


@dataclass(repr=False)
class RotaryBand:
    """Consecutive rotary pairs: their frequencies, and their part of the chosen logit and of every key's."""

    pairs: tuple[int, int]  # first and last pair index i (dimensions i and i + d_rot/2)
    wavelength: tuple[float, float]  # 2π/ω in tokens, fastest and slowest pair of the band
    logit: float  # the band's part of the chosen key's logit
    spread: float  # standard deviation of the band's part over the keys the query sees


@dataclass(repr=False)
class LogitBreakdown(NotebookDisplay):
    """One weight of one head explained: ``logit = scaling · Σ_d query_d · key_d`` (plus the mask)."""

    model: str
    layer: int
    head: int
    tokens: list[str]
    query_position: int
    key_position: int
    query: Tensor  # [d]
    key: Tensor  # [d]
    scaling: float
    weight: float  # the softmax weight of this key in this query's row
    logits: Tensor  # [keys the query sees]: scaling · q·k of every key, for context
    bands: list[RotaryBand] = field(default_factory=list)  # rotary models only

    @property
    def products(self) -> Tensor:
        """``[d]``: ``query_d · key_d``; their sum times :attr:`scaling` is the logit."""
        return self.query * self.key

    @property
    def logit(self) -> float:
        return float(self.products.sum()) * self.scaling


def explain_logit(
    loaded: LoadedModel, text: str, *, layer: int, head: int, query: int | str = "last", key: int | str = 0
) -> LogitBreakdown:
    """The neuron view of head ``head`` of ``layer`` on ``text``: query position ``query``, key position ``key``.

    Positions are token indices (negative from the end) or ``"last"``. A causal model's query cannot see a
    later key: that is refused.
    """
    batch = loaded.encode([text])
    recorder = _record(loaded, batch, layer, head)
    tokens = batch.tokens[0]
    i, j = _position(query, len(tokens), "query"), _position(key, len(tokens), "key")
    if loaded.causal and j > i:
        raise ParameterError("key", f"{{key}} {j} is after the query {i}: a causal model's query sees keys 0–{i}", key)
    assert recorder.query is not None and recorder.key is not None and recorder.scaling is not None
    q, keys = recorder.query[0, i], recorder.key[0, : len(tokens)]  # [d], [k, d]
    visible = keys[: i + 1] if loaded.causal else keys
    logits = visible @ q * recorder.scaling  # [keys seen]
    bands = _rotary_bands(loaded.rotary_frequencies(), q, visible, j, recorder.scaling)
    return LogitBreakdown(
        model=loaded.name,
        layer=recorder.site.layer,
        head=head,
        tokens=list(tokens),
        query_position=i,
        key_position=j,
        query=q,
        key=keys[j],
        scaling=recorder.scaling,
        weight=float(recorder.weights[0, i, j]),
        logits=logits,
        bands=bands,
    )


def _rotary_bands(frequencies: Tensor | None, q: Tensor, keys: Tensor, j: int, scaling: float) -> list[RotaryBand]:
    """The logits split by rotary frequency band (none without rotary frequencies)."""
    if frequencies is None or frequencies.numel() == 0 or 2 * frequencies.numel() > q.numel():
        return []
    half = frequencies.numel()  # pairs (i, i + half) over the first 2·half dimensions
    per_pair = (q[:half] * keys[:, :half] + q[half : 2 * half] * keys[:, half : 2 * half]) * scaling  # [k, half]
    bands = []
    for chunk in torch.arange(half).chunk(min(ROTARY_BANDS, half)):
        first, last = int(chunk[0]), int(chunk[-1])
        part = per_pair[:, first : last + 1].sum(-1)  # [k]
        wavelength = (2 * torch.pi / frequencies[first]).item(), (2 * torch.pi / frequencies[last]).item()
        spread = float(part.std(unbiased=False)) if part.numel() > 1 else 0.0
        bands.append(RotaryBand((first, last), wavelength, float(part[j]), spread))
    return bands


@dataclass(repr=False)
class QueryKeyMap(NotebookDisplay):
    """A head's queries and keys over a corpus, placed together in 2-D (see the module docstring).

    Point ``n`` is a query (``kind[n] == "query"``) or a key of token ``positions[n]`` of example ``examples[n]``.
    ``links``: the strongest query → key weights, ``(query point, key point, weight)``, strongest first.
    """

    model: str
    layer: int
    head: int
    projection: str
    coordinates: Tensor  # [points, 2]
    kinds: list[str]  # "query" or "key"
    tokens: list[str]
    positions: list[int]
    examples: list[int]
    links: list[tuple[int, int, float]]
    explained: tuple[float, float] | None = None  # PCA: share of the variance along each axis


def query_key_map(
    loaded: LoadedModel,
    texts: Sequence[str],
    *,
    layer: int,
    head: int,
    projection: Projection = "pca",
    seed: int = 0,
    max_points: int = 2000,
    links: int = 60,
    batch_size: int = 8,
    max_length: int | None = 128,
) -> QueryKeyMap:
    """The joint 2-D map of head ``head`` of ``layer`` over ``texts`` (each cut to ``max_length`` tokens).

    ``projection``: ``"pca"`` (an SVD: the same map every time) or ``"tsne"`` (scikit-learn's t-SNE, placed
    with ``seed``). Above ``max_points`` queries and keys, tokens are drawn with ``seed``. ``links``: how many
    of the strongest query → key weights to keep.
    """
    if projection not in PROJECTIONS:
        raise ParameterError("projection", f"{{projection}} must be one of {', '.join(PROJECTIONS)}", projection)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:  # what t-SNE and numpy take
        raise ParameterError("seed", f"{{seed}} must be a whole number from 0 to {2**32 - 1:,}, got {seed!r}", seed)
    for name, value, low in (("max_points", max_points, 4), ("links", links, 0), ("batch_size", batch_size, 1)):
        if value < low:
            raise ParameterError(name, f"{{{name}}} must be at least {low}, got {value}", value)
    texts = [text for text in texts if text.strip()]
    if not texts:
        raise InputError("no text given: give at least one example")
    queries: list[Tensor] = []
    keys: list[Tensor] = []
    labels: list[str] = []
    positions: list[int] = []
    examples: list[int] = []
    strongest: list[tuple[int, int, float]] = []
    for start in range(0, len(texts), batch_size):
        batch = loaded.encode(texts[start : start + batch_size], max_length=max_length, truncate=True)
        recorder = _record(loaded, batch, layer, head)
        assert recorder.query is not None and recorder.key is not None
        weights = recorder.weights  # [b, q, k]
        for row, tokens in enumerate(batch.tokens):
            n, offset = len(tokens), len(labels)
            queries.append(recorder.query[row, :n])
            keys.append(recorder.key[row, :n])
            labels += tokens
            positions += range(n)
            examples += [start + row] * n
            best, at = weights[row, :n, :n].max(-1)  # [n] each query's strongest key
            strongest += [(offset + i, offset + int(at[i]), float(best[i])) for i in range(n)]
    q, k = torch.cat(queries), torch.cat(keys)  # [N, d] each
    chosen = torch.arange(q.shape[0])
    if 2 * q.shape[0] > max_points:  # draw tokens (both their query and key) with the seed
        generator = torch.Generator().manual_seed(seed)
        chosen = torch.randperm(q.shape[0], generator=generator)[: max_points // 2].sort().values
    coordinates, explained = _project(q[chosen], k[chosen], projection, seed)
    kept = {int(token): slot for slot, token in enumerate(chosen)}
    count = len(chosen)
    pairs = [(kept[a], count + kept[b], w) for a, b, w in strongest if a in kept and b in kept]
    pairs.sort(key=lambda link: -link[2])
    pick = chosen.tolist()
    return QueryKeyMap(
        model=loaded.name,
        layer=resolve_layers([layer], loaded.num_layers(), parameter="layer")[0],
        head=head,
        projection=projection,
        coordinates=coordinates,
        kinds=["query"] * count + ["key"] * count,
        tokens=[labels[i] for i in pick] * 2,
        positions=[positions[i] for i in pick] * 2,
        examples=[examples[i] for i in pick] * 2,
        links=pairs[:links],
        explained=explained,
    )


def _project(q: Tensor, k: Tensor, projection: str, seed: int) -> tuple[Tensor, tuple[float, float] | None]:
    """``[2N, 2]`` coordinates of queries then keys, normalised as in AttentionViz; PCA's explained shares."""
    k = k - k.mean(0) + q.mean(0)  # same centroid: each query's softmax over keys is unchanged
    ratio = (k.norm(dim=-1).mean() / q.norm(dim=-1).mean().clamp(min=1e-12)).sqrt()
    points = torch.cat([q * ratio, k / ratio]).double()  # same mean norm; every q·k unchanged
    centred = points - points.mean(0)
    if projection == "tsne":
        try:
            from sklearn.manifold import TSNE
        except ImportError:
            raise InputError("the t-SNE projection needs scikit-learn: pip install scikit-learn") from None
        perplexity = min(30.0, max(2.0, (len(points) - 1) / 3))
        placed = TSNE(2, perplexity=perplexity, random_state=seed, init="pca").fit_transform(centred.numpy())
        return torch.as_tensor(placed, dtype=torch.float32), None
    _, values, components = torch.linalg.svd(centred, full_matrices=False)  # deterministic, unlike a randomised PCA
    axes = components[:2]  # [2, d]
    signs = torch.sign(axes.gather(1, axes.abs().argmax(1, keepdim=True)))  # the largest loading positive
    axes = axes * torch.where(signs == 0, 1.0, signs)
    variance = values.square()
    shares = (variance[:2] / variance.sum().clamp(min=1e-300)).tolist()
    shares += [0.0] * (2 - len(shares))
    coordinates = centred @ axes.T  # [2N, 2]
    if coordinates.shape[1] < 2:
        coordinates = torch.nn.functional.pad(coordinates, (0, 2 - coordinates.shape[1]))
    return coordinates.float(), (shares[0], shares[1])
