"""Per-head statistics of a vision transformer over a folder of images, streamed like the text statistics.

Every statistic of :mod:`attnviz.stats.definitions` is accumulated by the usual
:class:`~attnviz.stats.accumulator.StatisticsAccumulator`; on images two of them are measured on
the picture instead of along the token sequence, by :class:`ImageGridAccumulator` beside it:

* ``mean_distance``: for each patch query, ``Σⱼ Aᵢⱼ·dᵢⱼ / Σⱼ Aᵢⱼ`` over the patch keys ``j``, with
  ``dᵢⱼ`` the Euclidean distance between the two patches on the grid, in patches (extra tokens
  have no place on the picture, so they are left out of this average);
* ``normalized_distance``: that divided by the farthest patch the query patch could reach.

``special_tokens`` is the share of attention to the extra tokens ([CLS], [DIST], registers). Two
statistics are added per head (:class:`ImageHeadStatistics`):

* ``sink_patches``: the share of attention to the image's *sink patches*, the few patches
  (``max(1, round(2 % of the patches))``) that draw the most attention in the layer, summed over
  heads and queries: the high-norm artefact tokens of Darcet et al. (2023), "Vision Transformers Need
  Registers". Mean over images of the mean over every query;
* a *sink head* flag: at least :data:`SINK_HEAD_SHARE` of the head's attention goes to those patches.

Nothing of a pattern is kept: per site only ``[b, h, key]`` column sums of the current batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from rich.progress import Progress
from torch import Tensor

from attnviz.captures.images import ImageSource, image_batches
from attnviz.common.errors import InputError
from attnviz.common.images import ImageGrid
from attnviz.common.progress import progress_bar
from attnviz.core import AttentionSite
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.identity import model_identity
from attnviz.models.vision import vision_model_of
from attnviz.stats.accumulator import StatisticsAccumulator
from attnviz.stats.definitions import STATISTIC_INDEX
from attnviz.stats.result import HeadStatistics, mean_std_records

#: share of the patches that count as sink patches (at least one)
SINK_PATCH_SHARE = 0.02
#: a head giving at least this share of its attention to the sink patches is flagged as a sink head
SINK_HEAD_SHARE = 0.5
IMAGE_STATISTIC_NAMES = ("sink_patches",)


def sink_patch_count(num_patches: int) -> int:
    """How many patches are taken as sink patches: ``max(1, round(2 % of them))``."""
    return max(1, round(SINK_PATCH_SHARE * num_patches))


def grid_distances(grid: ImageGrid) -> tuple[Tensor, Tensor]:
    """``[n, n]`` Euclidean distance in patches between token positions (0 where either is an extra token),
    and ``[n]`` the farthest patch each patch token can reach (1 for extra tokens)."""
    rows = torch.arange(grid.num_patches) // grid.cols  # [p]
    cols = torch.arange(grid.num_patches) % grid.cols  # [p]
    coordinates = torch.stack((rows, cols), dim=1).float()  # [p, 2]
    patch = torch.cdist(coordinates, coordinates)  # [p, p]
    distances = torch.zeros(grid.num_tokens, grid.num_tokens)  # [n, n]
    distances[grid.num_extra :, grid.num_extra :] = patch
    reach = torch.ones(grid.num_tokens)  # [n]
    reach[grid.num_extra :] = patch.amax(dim=1).clamp(min=1.0)
    return distances, reach


class _Sums:
    """Float64 running sum, sum of squares and count of per-head values."""

    def __init__(self) -> None:
        self.sum: Tensor | None = None  # [h]
        self.squares: Tensor | None = None  # [h]
        self.count = 0.0

    def add_items(self, items: Tensor) -> None:
        """``items``: ``[n, h]`` per-item values."""
        items = items.double()
        total, squares = items.sum(0).cpu(), items.square().sum(0).cpu()
        if self.sum is None or self.squares is None:
            self.sum, self.squares = total, squares
        else:
            self.sum += total
            self.squares += squares
        self.count += items.shape[0]

    def mean_std(self) -> tuple[Tensor, Tensor]:
        assert self.sum is not None and self.squares is not None
        mean = self.sum / max(self.count, 1.0)
        return mean, (self.squares / max(self.count, 1.0) - mean.square()).clamp(min=0).sqrt()


class ImageGridAccumulator:
    """An attention observer for images: grid distances per patch query, column sums for the sink patches."""

    def __init__(self) -> None:
        self.distance: dict[AttentionSite, _Sums] = {}
        self.normalized: dict[AttentionSite, _Sums] = {}
        self.sink: dict[AttentionSite, _Sums] = {}
        self._grid: ImageGrid | None = None
        self._distances: Tensor | None = None  # [n, n]
        self._reach: Tensor | None = None  # [n]
        self._columns: dict[AttentionSite, Tensor] = {}  # [b, h, k] attention received, summed over queries

    def begin_batch(self, batch: EncodedBatch) -> None:
        self.flush()
        if batch.image_grid is None:
            raise InputError("image statistics need a batch of images")
        if batch.image_grid != self._grid:
            self._grid = batch.image_grid
            self._distances, self._reach = grid_distances(batch.image_grid)

    def observe(self, site: AttentionSite | None, pattern: Tensor, query_start: int) -> None:
        if site is None or self._grid is None:
            return
        grid = self._grid
        rows = pattern.shape[2]
        pattern = pattern.float()  # [b, h, blk, k]
        columns = pattern.sum(dim=2)  # [b, h, k]
        self._columns[site] = columns if site not in self._columns else self._columns[site] + columns
        first_patch = max(grid.num_extra - query_start, 0)  # the block's first patch query
        if first_patch >= rows:
            return
        queries = pattern[:, :, first_patch:, :]  # [b, h, pq, k]: patch queries only
        start = query_start + first_patch
        assert self._distances is not None and self._reach is not None  # set when the batch began
        distances = self._distances[start : start + queries.shape[2]].to(pattern.device)  # [pq, k]
        reach = self._reach[start : start + queries.shape[2]].to(pattern.device)  # [pq]
        on_patches = queries[..., grid.num_extra :].sum(-1).clamp(min=torch.finfo(torch.float32).tiny)  # [b, h, pq]
        distance = (queries * distances).sum(-1) / on_patches  # [b, h, pq] patches
        heads = pattern.shape[1]
        self.distance.setdefault(site, _Sums()).add_items(distance.permute(0, 2, 1).reshape(-1, heads))
        normalized = (distance / reach).permute(0, 2, 1).reshape(-1, heads)  # [b·pq, h]
        self.normalized.setdefault(site, _Sums()).add_items(normalized)

    def flush(self) -> None:
        """Find each image's sink patches in each layer and add every head's share to them."""
        grid = self._grid
        for site, columns in self._columns.items():
            assert grid is not None
            received = columns[:, :, grid.num_extra :]  # [b, h, p] attention each patch received
            sinks = received.sum(dim=1).topk(sink_patch_count(grid.num_patches), dim=-1).indices  # [b, s]
            index = sinks[:, None, :].expand(-1, received.shape[1], -1)  # [b, h, s]
            share = received.gather(-1, index).sum(-1) / grid.num_tokens  # [b, h] mean over every query
            self.sink.setdefault(site, _Sums()).add_items(share)
        self._columns = {}


@dataclass
class ImageHeadStatistics:
    """What images add to a model's :class:`HeadStatistics`: the sink-patch share per head, and sink heads."""

    grid: ImageGrid
    sink_patches: dict[AttentionSite, Tensor]  # [h] float64 mean share of attention to the sink patches
    sink_patches_std: dict[AttentionSite, Tensor]  # [h] float64 over images
    num_sink_patches: int
    sink_heads: list[tuple[AttentionSite, int]] = field(default_factory=list)
    images: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "grid": self.grid.to_dict(),
            "extra_tokens": self.grid.token_labels()[: self.grid.num_extra],
            "num_sink_patches": self.num_sink_patches,
            "sink_head_share": SINK_HEAD_SHARE,
            "distance_unit": "patches",
            "images": self.images,
            "heads": mean_std_records(
                "sink_patches",
                self.sink_patches,
                self.sink_patches_std,
                lambda site, head: {"sink_head": (site, head) in self.sink_heads},
            ),
        }


def compute_image_statistics(
    loaded: LoadedModel,
    images: Sequence[ImageSource],
    *,
    batch_size: int = 8,
    progress: bool = True,
    names: Sequence[str] | None = None,
) -> HeadStatistics:
    """Every per-head statistic of a vision model over ``images`` (paths, bytes or PIL images), streamed.

    Images are read one batch at a time. The result's ``mean_distance`` and ``normalized_distance``
    are measured on the patch grid (see the module docstring) and ``result.image`` holds the
    sink-patch shares and sink heads. A captioner (:class:`~attnviz.models.caption.CaptionModel`) first
    writes its caption of each image (greedy, at most :data:`CAPTION_TOKENS` tokens), then every stack is
    measured over image and caption: ``encoder`` as a vision model's heads, ``decoder`` along the caption,
    ``cross`` from the caption's tokens to the image's (no grid distance: a word has no place on the picture).
    """
    vision = vision_model_of(loaded)
    images = list(images)
    captioner = vision.encoder_decoder  # a captioner: measured over the captions it writes (greedy)
    if not images:
        raise InputError("no image given: give at least one image")
    if batch_size < 1:
        raise InputError(f"the batch size must be at least 1, got {batch_size}")
    accumulator = StatisticsAccumulator(causal=False)
    grid_accumulator = ImageGridAccumulator()
    context = vision.context([accumulator, _ImageQueries(grid_accumulator)])
    started = time.perf_counter()
    grid = None
    with progress_bar() if progress else Progress(disable=True) as bar:
        task = bar.add_task(f"statistics · {vision.name}", total=len(images), status="")
        for batch in _batches(vision, images, batch_size, captioner):
            grid = batch.image_grid
            accumulator.begin_batch(batch)
            grid_accumulator.begin_batch(batch)
            with torch.no_grad():
                vision.forward(batch, context)
            bar.update(task, advance=len(batch), status=f"{accumulator.num_tokens} tokens")
    grid_accumulator.flush()
    stats = HeadStatistics.from_accumulator(accumulator, vision.name, seconds=time.perf_counter() - started)
    stats.identity = model_identity(vision)
    assert grid is not None
    for site, numbers in stats.sites.items():
        for name, sums in (
            ("mean_distance", grid_accumulator.distance),
            ("normalized_distance", grid_accumulator.normalized),
        ):
            index = STATISTIC_INDEX[name]
            if site in sums:
                mean, std = sums[site].mean_std()
                numbers.mean[index], numbers.std[index] = mean, std
                numbers.count[index] = sums[site].count / numbers.mean.shape[1]
            elif (
                site.stack in _IMAGE_QUERY_STACKS or site.stack == "cross"
            ):  # no patch query (cannot happen with a grid of one patch)
                numbers.mean[index] = numbers.std[index] = math.nan
        if site.stack == "cross":  # a caption token and an image token share no position: no own, previous or
            for name in _POSITIONAL:  # nearby token to measure, and no flag to raise from one
                numbers.mean[STATISTIC_INDEX[name]] = numbers.std[STATISTIC_INDEX[name]] = math.nan
    shares = {site: sums.mean_std() for site, sums in sorted(grid_accumulator.sink.items())}
    stats.image = ImageHeadStatistics(
        grid=grid,
        sink_patches={site: mean for site, (mean, _) in shares.items()},
        sink_patches_std={site: std for site, (_, std) in shares.items()},
        num_sink_patches=sink_patch_count(grid.num_patches),
        sink_heads=flag_sink_heads({site: mean for site, (mean, _) in shares.items()}),
        images=list(names) if names is not None else [],
    )
    return stats


#: statistics that compare a query's position with its keys': none between a caption and an image
_POSITIONAL = ("diagonal", "previous_token", "local_ratio")
#: stacks whose queries are the image's tokens (a vision model's self-attention, a captioner's encoder)
_IMAGE_QUERY_STACKS = ("self", "encoder")


class _ImageQueries:
    """Hands the grid accumulator only the sites whose queries are image tokens (not a captioner's words)."""

    def __init__(self, inner: ImageGridAccumulator) -> None:
        self.inner = inner

    def observe(self, site: AttentionSite | None, pattern: Tensor, query_start: int) -> None:
        if site is not None and site.stack in _IMAGE_QUERY_STACKS:
            self.inner.observe(site, pattern, query_start)


def _batches(vision, images: Sequence[ImageSource], batch_size: int, captioner: bool):
    """Batches of ``images``; for a captioner, with the caption it writes about each (its own words, greedy)."""
    if not captioner:
        yield from image_batches(vision, images, batch_size)
        return
    from attnviz.captures.captioning import caption_batches

    for start in range(0, len(images), batch_size):
        yield from caption_batches(
            vision, images[start : start + batch_size], batch_size, max_new_tokens=CAPTION_TOKENS
        )


#: the most tokens a captioner writes per image for its statistics (fewer where its decoder has fewer positions)
CAPTION_TOKENS = 32


def flag_sink_heads(shares: dict[AttentionSite, Tensor]) -> list[tuple[AttentionSite, int]]:
    """The heads whose mean share of attention on the sink patches (``[h]`` per site) is at least :data:`SINK_HEAD_SHARE`."""
    return [
        (site, head)
        for site, values in shares.items()
        for head in range(values.shape[0])
        if values[head] >= SINK_HEAD_SHARE
    ]


def sink_summary(stats: HeadStatistics) -> str:
    """One line on the sink patches and sink heads of an image statistics result."""
    image = stats.image
    if image is None:
        return ""
    heads = ", ".join(
        f"L{site.layer}H{head} ({float(image.sink_patches[site][head]):.0%})" for site, head in image.sink_heads
    )
    found = f"sink heads: {heads}" if heads else "no sink head"
    return (
        f"{image.grid.rows}×{image.grid.cols} patches; distances in patches on the grid; sink patches: the "
        f"{image.num_sink_patches} most attended per image and layer; {found} "
        f"(≥ {SINK_HEAD_SHARE:.0%} of a head's attention on them)"
    )
