"""What each token carries: the first token's value norm and its share of the norm-weighted mass, per head.

A first-token "sink" takes much of a head's weight but, as Kobayashi et al. (2020) found for BERT's
``[CLS]``/``[SEP]``, often moves little: its transformed value vector ``f_h(x_0)`` is small. Per head,
over the corpus:

* ``first_value_norm``: mean ``‖f_h(x_0)‖`` of the first token (one per example);
* ``other_value_norm``: mean ``‖f_h(x_j)‖`` over the other real tokens;
* ``first_token_weight_share``: mean ``α_i0`` over the real queries (the weights' share of the first token);
* ``first_token_norm_share``: mean ``α_i0‖f_h(x_0)‖ / Σ_j α_ij‖f_h(x_j)‖`` (its share of the norm-weighted mass).

A sink that carries nothing has a high weight share, a low norm share and a first-token norm well below
the others'. :class:`TokenCarriers` is an observer of the attention core, streamed like the statistics:
it keeps ``[b, h, k]`` norms per call and reads each block of weights once (one matrix–vector product).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from attnviz.common.parallel import DataParallel
from attnviz.core import AttentionSite
from attnviz.core.kernel_calls import RowSummary
from attnviz.core.weighting import FactorCache, projection_factors, value_norms
from attnviz.models.base import EncodedBatch
from attnviz.stats import deferral
from attnviz.stats.kept_rows import KeptCalls

#: per-head fields, in JSON/CSV order
CARRIER_FIELDS: tuple[str, ...] = (
    "first_value_norm",
    "other_value_norm",
    "first_token_weight_share",
    "first_token_norm_share",
)
#: what each field means (column help in the head atlas)
CARRIER_HELP: dict[str, str] = {
    "first_value_norm": "mean ‖f_h(x₀)‖: the norm of the first token's value vector after the output projection",
    "other_value_norm": "mean ‖f_h(x_j)‖ of the other tokens",
    "first_token_weight_share": "mean αᵢ₀: the first token's share of the weights (probability)",
    "first_token_norm_share": "mean αᵢ₀‖f(x₀)‖ ÷ Σⱼ αᵢⱼ‖f(x_j)‖: its share of the norm-weighted mass (probability)",
}
_TINY = 1e-30


@dataclass
class CarrierStatistics:
    """``means[site]``: ``[4, h]`` float64, the :data:`CARRIER_FIELDS` of every head (NaN where nothing counted)."""

    means: dict[AttentionSite, Tensor]

    def matrix(self, name: str, stack: str = "self") -> Tensor:
        """``[layer, head]`` float64 of one field over the layers of ``stack`` (NaN where a layer has fewer heads)."""
        index = CARRIER_FIELDS.index(name)
        sites = sorted(site for site in self.means if site.stack == stack)
        width = max((self.means[site].shape[1] for site in sites), default=0)
        out = torch.full((len(sites), width), math.nan, dtype=torch.float64)
        for row, site in enumerate(sites):
            out[row, : self.means[site].shape[1]] = self.means[site][index]
        return out

    def head(self, site: AttentionSite, head: int) -> dict[str, float]:
        """The fields of one head (empty when the site was not measured)."""
        values = self.means.get(site)
        if values is None or head >= values.shape[1]:
            return {}
        return {name: float(values[index, head]) for index, name in enumerate(CARRIER_FIELDS)}


class TokenCarriers:
    """Attention observer that sums :data:`CARRIER_FIELDS` per head; call :meth:`begin_batch` before each pass.
    ``cache``: the model's :class:`~attnviz.core.weighting.FactorCache`, to reuse the norms' factors of an earlier
    call."""

    accepts_inputs = True
    accepts_key_prefix = True  # reads each block during observe only; later keys have weight 0
    #: the core may sum Σ_j α_ij ‖f(x_j)‖ itself while each row is in the cache (``weighted=`` in observe)
    accepts_weighted_sum = True
    #: the weights on key 0 may come from the core's row summary instead of a pattern (``summary_columns``)
    accepts_summary = True
    accepts_summary_only = True
    #: it reads only the values (``observe_inputs(site, None, None, value, None)`` on models with their own eager
    #: attention, value ``[b, h, k, d]``)
    accepts_values_only = True

    def __init__(self, projections: Mapping[AttentionSite, Tensor], *, cache: FactorCache | None = None) -> None:
        self.projections = dict(projections)
        self._sums: dict[AttentionSite, Tensor] = {}  # site -> [4, h] float64 on the host (see _fold)
        # rows counted per field, plain numbers (a tensor's += per layer costs more than the sums themselves)
        self._counts = {site: [0.0] * len(CARRIER_FIELDS) for site in self.projections}
        # (sites, their heads, field) -> [2, Σh] float64: sums of sites reduced side by side, not yet split (_fold)
        self._grouped = deferral.GroupSums()
        self._kept = KeptCalls()  # on a GPU, the batch's norms and rows until it ends (attnviz.stats.deferral)
        self._seen: set[AttentionSite] = set()
        self._factors = projection_factors(self.projections, cache=cache)  # site -> [h, d, d], once
        self._batch: EncodedBatch | None = None
        self._key_masks: dict[tuple, Tensor] = {}  # the batch's masks of real keys and real query rows, made once
        self._site: AttentionSite | None = None
        self._norms: Tensor | None = None  # [b, h, k] of the call in progress
        # One flat float32 buffer for every call's norms, grown to the largest [b, h, k] asked for. The norms live
        # from a layer's attention to the next one's, across the MLP: a fresh tensor per layer sat between the
        # MLP's freed blocks in the C heap and grew the process by ~15 MB a layer (0.3 GB over SmolLM2's 30 layers
        # at 4,096 tokens) where a plain forward grows by none.
        self._norms_buffer: Tensor | None = None

    def begin_batch(self, batch: EncodedBatch) -> None:
        self._flush()  # with the previous batch's masks
        self._batch = batch
        self._key_masks = {}

    def observe_inputs(
        self, site: AttentionSite, query: Tensor | None, key: Tensor | None, value: Tensor, scaling: float | None
    ) -> None:
        projections = self.projections.get(site)
        self._site, self._norms = site, None
        if projections is None or self._batch is None:
            return
        keeping = self.keeps_summary(value.device)  # the norms are kept until the batch ends: a tensor per call
        out = None if keeping else self._norms_out(value, projections.shape[0])
        norms = value_norms(value, projections, out, factor=self._factors[site])  # [b, h, k]
        self._norms = norms
        _, key_lengths = self._batch.query_key_lengths(site.stack)
        # counts from the lengths the host holds: reading them off the device would wait for the GPU at every layer
        others = sum(max(0, min(length, norms.shape[2]) - 1) for length in key_lengths)
        self._count(site, 0, (float(norms.shape[0]), float(others)))
        if keeping:
            self._kept.add_norms(site, norms)
            if self._kept.nbytes > deferral.DEFERRED_BYTES:
                self._flush()
            return
        self._add_norm_sums([site], [norms])

    def _add_norm_sums(self, sites: list[AttentionSite], norms: list[Tensor]) -> None:
        """Add the first key's and the other real keys' norms of ``norms`` (``[b, h, k]`` each, one site's, of one
        stack and shape) to fields 0 and 1."""
        together = _side_by_side(norms)  # [b, Σh, k]
        keys = self._key_mask(sites[0].stack, together.device)[:, None, :]  # [b, 1, k] real keys
        per_key = torch.where(keys, together, 0.0).double().sum(0)  # [Σh, k]
        sums = torch.stack((per_key[:, 0], per_key[:, 1:].sum(-1)))  # [2, Σh]: the first key, the others
        self._add(sites, [part.shape[1] for part in norms], 0, sums)

    def _key_mask(self, stack: str, device: torch.device) -> Tensor:
        """The batch's ``[b, k]`` real-key mask of ``stack`` on ``device``, made once per batch."""
        assert self._batch is not None
        key = (stack, device)
        if key not in self._key_masks:
            self._key_masks[key] = self._batch.key_padding_mask(stack).to(device)
        return self._key_masks[key]

    def _norms_out(self, value: Tensor, heads: int) -> Tensor:
        """A ``[b, h, k]`` float32 view of the reused norms buffer for ``value`` ``[b, kvh, k, d]``."""
        shape = (value.shape[0], heads, value.shape[2])
        numel = math.prod(shape)
        buffer = self._norms_buffer
        if buffer is None or buffer.numel() < numel or buffer.device != value.device:
            buffer = self._norms_buffer = torch.empty(numel, dtype=torch.float32, device=value.device)
        return buffer[:numel].view(shape)

    def keeps_summary(self, device: torch.device) -> bool:
        """Whether it keeps the norms and rows of calls on ``device`` until the batch ends
        (:mod:`attnviz.stats.deferral`)."""
        return deferral.defers(device)

    def key_weights(self, site: AttentionSite) -> Tensor | None:
        """``‖f(x_j)‖`` ``[b, h, k]`` of the call in progress at ``site`` (what the core may weigh rows by)."""
        return self._norms if site == self._site else None

    def summary_columns(self, site: AttentionSite) -> list[int]:
        """The key whose weight the carriers read from a row summary: the first."""
        return [0]

    def observe(
        self,
        site: AttentionSite,
        pattern: Tensor | None,
        query_start: int,
        weighted: Tensor | None = None,
        summary: RowSummary | None = None,
        owned: bool = False,
        **_: object,
    ) -> None:
        """``pattern``: ``[b, h, blk, c]`` weights of queries ``query_start …`` (None when ``summary`` holds key 0);
        ``weighted``: the core's ``Σ_j α_ij ‖f(x_j)‖`` ``[b, h, blk]`` of these rows, when it summed them (else
        computed here); ``owned``: ``summary`` and ``weighted`` are this observer's to keep."""
        if site != self._site or self._norms is None or self._batch is None:
            return
        if owned and pattern is None and summary is not None and weighted is not None and 0 in summary.columns:
            self._kept.add_rows(site, query_start, summary, weighted, self._norms)
            self._count(site, 2, self._row_counts(site, query_start, summary))
            if self._kept.nbytes > deferral.DEFERRED_BYTES:
                self._flush()
            return
        if pattern is None:
            weight_share = summary.column(0) if summary is not None else None  # [b, h, blk]
            if weight_share is None or weighted is None:
                raise ValueError("carriers without a pattern need the summary's key 0 and the weighted sums")
            moved = weighted
        else:
            norms = self._norms[..., : pattern.shape[-1]]  # [b, h, c]
            # [b, h, blk]: Σ_j α_ij ‖f(x_j)‖; einsum's product is a matrix-vector one, about 8× faster here
            # than matmul's of a [c, 1] matrix
            moved = weighted if weighted is not None else torch.einsum("bhqk,bhk->bhq", pattern, norms)
            weight_share = pattern[..., 0]  # [b, h, blk]
        self._add_share_sums([site], query_start, [weight_share], [moved], [self._norms])
        self._count(site, 2, self._row_counts(site, query_start, weight_share))

    def _row_counts(self, site: AttentionSite, query_start: int, rows: Tensor | RowSummary) -> tuple[float, float]:
        """How many real queries the rows ``query_start …`` of ``rows`` (``[…, blk]``) hold, for fields 2 and 3."""
        assert self._batch is not None
        count = (rows.values if isinstance(rows, RowSummary) else rows).shape[-1]
        query_lengths = self._batch.query_key_lengths(site.stack)[0]
        real = float(sum(max(0, min(length, query_start + count) - query_start) for length in query_lengths))
        return real, real

    def _add_share_sums(
        self,
        sites: list[AttentionSite],
        query_start: int,
        weight_shares: list[Tensor],
        moved: list[Tensor],
        norms: list[Tensor],
    ) -> None:
        """Add the weight and norm shares of key 0 (fields 2 and 3) of sites of one stack and shape: each site's
        ``α_i0`` and ``Σ_j α_ij ‖f(x_j)‖`` ``[b, h, blk]`` and its norms ``[b, h, k]``."""
        weight_share = _side_by_side(weight_shares)  # [b, Σh, blk]
        first_norms = _side_by_side([part[..., :1] for part in norms])  # [b, Σh, 1]
        norm_share = weight_share * first_norms / _side_by_side(moved).clamp(min=_TINY)  # [b, Σh, blk]
        real = self._real_rows(sites[0].stack, query_start, weight_share.shape[2], weight_share.device)  # [b, 1, blk]
        shares = torch.stack((weight_share, norm_share))  # [2, b, Σh, blk]
        sums = torch.where(real, shares, 0.0).double().sum(dim=(1, 3))  # [2, Σh]
        self._add(sites, [part.shape[1] for part in weight_shares], 2, sums)

    def _real_rows(self, stack: str, query_start: int, rows: int, device: torch.device) -> Tensor:
        """``[b, 1, rows]`` bool: which of the queries ``query_start …`` are real (not padding), made once per batch."""
        key = (stack, query_start, rows, device)
        if key not in self._key_masks:
            assert self._batch is not None
            lengths = torch.tensor(self._batch.query_key_lengths(stack)[0])  # [b]
            positions = torch.arange(query_start, query_start + rows)  # [rows]
            self._key_masks[key] = (positions[None, :] < lengths[:, None])[:, None, :].to(device)
        return self._key_masks[key]

    def _add(self, sites: list[AttentionSite], heads: list[int], field: int, sums: Tensor) -> None:
        """Add ``sums`` ``[2, Σh]`` (``sites`` side by side, ``heads`` each) to fields ``field`` and ``field + 1``."""
        # summed per group of sites as they came, split per site in the result (_fold): one operation per group
        self._grouped.add((tuple(sites), tuple(heads), field), sums)

    def _count(self, site: AttentionSite, field: int, counts: tuple[float, float]) -> None:
        """Count ``counts`` more rows in fields ``field`` and ``field + 1`` of ``site``."""
        if site not in self._counts:
            self._counts[site] = [0.0] * len(CARRIER_FIELDS)
        self._seen.add(site)
        self._counts[site][field] += counts[0]
        self._counts[site][field + 1] += counts[1]

    def _flush(self) -> None:
        """Reduce the calls kept (on a GPU: the batch's), sites of one stack and shape side by side."""
        norm_groups, row_groups = self._kept.take()
        for norms in norm_groups:
            self._add_norm_sums([site for site, _ in norms], [tensor for _, tensor in norms])
        for query_start, rows in row_groups:
            shares = [summary.column(0) for _, summary, _, _ in rows]  # [b, h, q] each (kept only with key 0)
            self._add_share_sums(
                [site for site, _, _, _ in rows],
                query_start,
                [share for share in shares if share is not None],
                [weighted for _, _, weighted, _ in rows],
                [norms for _, _, _, norms in rows],
            )

    def _fold(self) -> None:
        """Move the groups' sums into the per-site sums, on the host."""
        self._flush()
        for (sites, heads, field), sums in self._grouped.take_to_host():
            for site, part in zip(sites, sums.split(list(heads), dim=1)):  # [2, h] each
                if site not in self._sums:
                    self._sums[site] = _zeros(len(CARRIER_FIELDS), part.shape[1])
                self._sums[site][field : field + 2] += part

    def merge_across(self, parallel: DataParallel, layout: Mapping[AttentionSite, int]) -> None:
        """Sum over the processes of a data-parallel run (sites in ``layout`` order, zeros where unseen)."""
        self._fold()
        if not parallel.distributed:
            return
        sites = sorted(site for site in layout if site in self.projections)
        local = []
        for site in sites:
            sums = self._sums.get(site)
            local.append(sums if sums is not None else _zeros(len(CARRIER_FIELDS), layout[site]))
            local.append(torch.tensor(self._counts.get(site, [0.0] * len(CARRIER_FIELDS)), dtype=torch.float64))
        merged = parallel.sum(local)
        self._sums = {site: merged[2 * n] for n, site in enumerate(sites)}
        self._counts = {site: merged[2 * n + 1].tolist() for n, site in enumerate(sites)}
        self._seen = set(sites)

    def result(self) -> CarrierStatistics:
        self._fold()
        order = sorted(self._seen)
        if not order:
            return CarrierStatistics({})
        # every site at once, brought to the host in one copy (a GPU's sums: not one wait per layer)
        heads = [self._sums[site].shape[1] for site in order]
        sums = torch.cat([self._sums[site] for site in order], dim=1)  # [4, Σh], on the host (see _fold)
        counts = torch.tensor([self._counts[site] for site in order], dtype=torch.float64)  # [sites, 4]
        per_head = counts.repeat_interleave(torch.tensor(heads), dim=0).T  # [4, Σh]
        means = torch.where(per_head > 0, sums / per_head.clamp(min=1), math.nan).split(heads, dim=1)
        return CarrierStatistics({site: mean.clone() for site, mean in zip(order, means)})


def _side_by_side(parts: list[Tensor]) -> Tensor:
    """``[b, Σh, …]``: tensors ``[b, h, …]`` of several sites along the heads (the one itself, uncopied)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _zeros(*shape: int) -> Tensor:
    return torch.zeros(shape, dtype=torch.float64)
