"""Two models on the same batch, their patterns compared layer by layer while both run.

Model A runs in a worker thread with :class:`LayerRecorder` attached: it gathers the blocks of one
layer's pattern (``[b, h_a, q, k]``) and hands the layer over through a one-slot queue, then waits
until the slot is free before handing over the next. Model B runs in the calling thread with
:class:`DivergenceAccumulator` attached: each of B's blocks (``[b, h_b, blk, k]``) is compared with
the same rows of A's layer as soon as the core computes it, and reduced to per-head sums. So at most
three layers of A (one being gathered, one waiting, one being read) and one block of B exist at once,
whatever the corpus; neither model's pattern of the whole batch is ever kept. The two forward passes
also overlap, one layer apart.

The blocks of A and B need not have the same rows (the core sizes blocks by head count, and a
pruned model has fewer heads): B's rows are read from A's gathered layer.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from attnviz.compare.divergence import query_divergences
from attnviz.core import AttentionContext, AttentionSite
from attnviz.models.base import EncodedBatch, LoadedModel

#: how often a waiting thread looks whether the other side gave up (seconds)
_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class HeadPairs:
    """Which heads of one site are compared: weight positions in A and in B, matched pairwise."""

    a_index: tuple[int, ...]
    b_index: tuple[int, ...]


class _Cancelled(Exception):
    """The comparing side stopped: A's pass ends without handing over more layers."""


class _Done:
    """A's pass has finished: no more layers come."""


class _Handoff:
    """A one-slot queue of ``(site, layer pattern)`` from A's thread to B's, that either side can abandon."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._cancelled = threading.Event()

    def put(self, item: object) -> None:
        while True:
            if self._cancelled.is_set():
                raise _Cancelled
            try:
                self._queue.put(item, timeout=_POLL_SECONDS)
                return
            except queue.Full:
                continue

    def get(self, worker: threading.Thread) -> object:
        while True:
            try:
                return self._queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if not worker.is_alive() and self._queue.empty():
                    return _Done()

    def cancel(self) -> None:
        self._cancelled.set()


class LayerRecorder:
    """Observer on model A: gathers each compared layer's pattern and hands it to the comparing side.

    It takes full-width blocks of its own (no ``accepts_key_prefix``), so it may keep them until
    the layer is complete.
    """

    def __init__(self, sites: Mapping[AttentionSite, HeadPairs], handoff: _Handoff):
        self.sites = sites
        self.handoff = handoff
        self._site: AttentionSite | None = None
        self._blocks: list[Tensor] = []  # each [b, h_a, blk, k], in query order

    def observe(self, site: AttentionSite | None, pattern: Tensor, query_start: int) -> None:
        if site is None or site not in self.sites:
            return
        if site != self._site:
            self._send()
            self._site = site
        self._blocks.append(pattern[:, list(self.sites[site].a_index)])  # [b, m, blk, k]: matched heads only

    def finish(self) -> None:
        self._send()

    def _send(self) -> None:
        if self._site is not None and self._blocks:
            layer = self._blocks[0] if len(self._blocks) == 1 else torch.cat(self._blocks, dim=2)  # [b, m, q, k]
            self._blocks = []
            self.handoff.put((self._site, layer))
        self._site = None


class DivergenceAccumulator:
    """Observer on model B: per-head sums of the JS divergence and total variation against A, per site.

    ``js_sums[site]``, ``tv_sums[site]``: ``[m]`` float64 sums over the counted queries of the
    matched heads (in :class:`HeadPairs` order); ``counts[site]``: how many queries were counted.
    """

    accepts_key_prefix = False  # compares every key against A's full-width rows

    def __init__(self, sites: Mapping[AttentionSite, HeadPairs]):
        self.sites = sites
        self.js_sums: dict[AttentionSite, Tensor] = {}
        self.tv_sums: dict[AttentionSite, Tensor] = {}
        self.counts: dict[AttentionSite, int] = {}
        self._handoff: _Handoff | None = None
        self._worker: threading.Thread | None = None
        self._layer: tuple[AttentionSite, Tensor] | None = None
        self._counted: dict[str, Tensor] = {}  # stack -> [b, q] bool: the queries that count in this batch

    def begin_batch(self, batch: EncodedBatch, handoff: _Handoff, worker: threading.Thread) -> None:
        self._handoff, self._worker, self._layer = handoff, worker, None
        self._counted = {}
        for stack in {site.stack for site in self.sites}:
            try:
                lengths, _ = batch.query_key_lengths(stack)
            except (TypeError, ValueError):  # a stack this batch has no side for
                continue
            width = max(lengths, default=0)
            self._counted[stack] = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]  # [b, q]

    def observe(self, site: AttentionSite | None, pattern: Tensor, query_start: int) -> None:
        if site is None or site not in self.sites:
            return
        layer = self._layer_of(site)  # [b, m, q, k]
        rows = pattern.shape[2]
        a_rows = layer[:, :, query_start : query_start + rows].to(pattern.device)  # [b, m, blk, k]
        b_rows = pattern[:, list(self.sites[site].b_index)]  # [b, m, blk, k]
        js, tv = query_divergences(a_rows, b_rows)  # each [b, m, blk]
        counted = self._counted[site.stack][:, query_start : query_start + rows].to(pattern.device)  # [b, blk]
        weight = counted[:, None, :].double()  # [b, 1, blk]
        js_sum = (js.double() * weight).sum(dim=(0, 2)).cpu()  # [m]
        tv_sum = (tv.double() * weight).sum(dim=(0, 2)).cpu()  # [m]
        if site in self.js_sums:
            self.js_sums[site] += js_sum
            self.tv_sums[site] += tv_sum
        else:
            self.js_sums[site], self.tv_sums[site] = js_sum, tv_sum
        self.counts[site] = self.counts.get(site, 0) + int(counted.sum())

    def _layer_of(self, site: AttentionSite) -> Tensor:
        """A's layer at ``site``: the current one, or the next handed over (A runs the sites in the same order)."""
        if self._layer is not None and self._layer[0] == site:
            return self._layer[1]
        assert self._handoff is not None and self._worker is not None
        item = self._handoff.get(self._worker)
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, _Done):
            raise RuntimeError(f"model A computed no pattern at {site.name} for this batch")  # noqa: TRY004 (a bug, not a type)
        received_site: AttentionSite = item[0]  # type: ignore[index]
        layer: Tensor = item[1]  # type: ignore[index]
        if received_site != site:
            raise RuntimeError(
                f"the two models run their layers in different orders ({received_site.name}, {site.name})"
            )
        self._layer = (site, layer)
        return layer

    def finish_batch(self) -> None:
        """Wait for the end of A's pass; re-raise its error if it failed."""
        assert self._handoff is not None and self._worker is not None
        self._layer = None
        item = self._handoff.get(self._worker)
        if isinstance(item, BaseException):
            raise item
        if not isinstance(item, _Done):
            site = item[0]  # type: ignore[index]
            raise RuntimeError(f"model A computed a pattern at {site.name} that model B did not")  # noqa: TRY004


def run_paired(
    model_a: LoadedModel,
    batch_a: EncodedBatch,
    context_a: AttentionContext,
    recorder: LayerRecorder,
    model_b: LoadedModel,
    batch_b: EncodedBatch,
    context_b: AttentionContext,
    divergence: DivergenceAccumulator,
) -> None:
    """One batch through A (worker thread, ``recorder`` among ``context_a``'s observers) and B (this thread)."""
    handoff = _Handoff()
    recorder.handoff = handoff

    def run_a() -> None:
        try:
            with torch.no_grad():  # grad mode is per thread
                model_a.forward(batch_a, context_a)
            recorder.finish()
            handoff.put(_Done())
        except _Cancelled:
            return
        except BaseException as exc:  # noqa: BLE001 (handed to the comparing side, which raises it there)
            try:
                handoff.put(exc)
            except _Cancelled:
                return

    # the worker sees the caller's context variables (the progress reporter, for notices)
    worker = threading.Thread(target=contextvars.copy_context().run, args=(run_a,), name="attnviz-model-a", daemon=True)
    divergence.begin_batch(batch_b, handoff, worker)
    worker.start()
    try:
        with torch.no_grad():
            model_b.forward(batch_b, context_b)
        divergence.finish_batch()
    except BaseException:
        handoff.cancel()
        raise
    finally:
        worker.join()
