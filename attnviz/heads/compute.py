"""``head_functions``: probe a model, label its heads, and optionally add corpus statistics and similarity."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from attnviz.common.progress import status
from attnviz.common.wording import plural
from attnviz.core.kernel import prepare_kernel
from attnviz.heads.labels import FunctionThresholds
from attnviz.heads.probes import ProbeSettings, probe_batches, resolve_settings
from attnviz.heads.result import HeadFunctions
from attnviz.heads.scores import ProbeScoreAccumulator
from attnviz.models.base import LoadedModel


def probe_scores(loaded: LoadedModel, settings: ProbeSettings | None = None) -> tuple[ProbeSettings, dict]:
    """Run the probes through ``loaded`` with a :class:`ProbeScoreAccumulator` attached.

    Returns the resolved settings and ``{site: [score, h]}`` float64 means.
    """
    settings = resolve_settings(loaded, settings or ProbeSettings())
    accumulator = ProbeScoreAccumulator(causal=loaded.causal)
    # the probes are a corpus pass too, where the fused kernel pays for its build (see attnviz.core.kernel)
    context = dataclasses.replace(loaded.context([accumulator]), fused_softmax=prepare_kernel())
    for probe in probe_batches(loaded, settings):
        accumulator.begin_batch(probe)
        with torch.no_grad():
            loaded.forward(probe.batch, context)
    return settings, accumulator.means()


def head_functions(
    loaded: LoadedModel,
    *,
    probe: ProbeSettings | None = None,
    thresholds: FunctionThresholds | None = None,
    texts: Sequence[str] | None = None,
    stats_thresholds=None,
    batch_size: int = 8,
    max_length: int | None = None,
    truncate: bool = True,
    similarity: bool = False,
    similarity_examples: int | None = None,
    similarity_tokens: int | None = None,
) -> HeadFunctions:
    """Score and label every head of ``loaded``.

    Args:
        loaded: the model (:func:`attnviz.load_model`).
        probe: probe length, number of sequences, seed (defaults: :mod:`attnviz.heads.probes`).
        thresholds: label thresholds (defaults: :mod:`attnviz.heads.labels`).
        texts: a corpus; when given, ``attnviz stats``' statistics and flags over it are added
            (``stats_thresholds``: their :class:`~attnviz.stats.Thresholds`, default ``normalized``).
        similarity: also compute the mean Jensen–Shannon divergence between heads, over
            ``texts`` when given, else over the probes (:func:`attnviz.heads.similarity.head_similarity`).
    """
    thresholds = thresholds or FunctionThresholds()
    settings = resolve_settings(loaded, probe or ProbeSettings())
    with status(f"probing {loaded.name}: {settings.sequences} sequences of 2 × {settings.length} random tokens"):
        settings, scores = probe_scores(loaded, settings)
    result = HeadFunctions(
        model=loaded.name, causal=loaded.causal, probe=settings, scores=scores, thresholds=thresholds
    )
    if texts is not None:
        from attnviz.stats import compute_statistics, detect_heads

        texts = list(texts)
        with status(f"corpus statistics over {plural(len(texts), 'example')}"):
            result.statistics = compute_statistics(
                loaded, texts, batch_size=batch_size, max_length=max_length, truncate=truncate, progress=False
            )
        result.detection = detect_heads(result.statistics, stats_thresholds)
    if similarity:
        from attnviz.heads.similarity import head_similarity

        with status("head similarity (Jensen–Shannon divergence)"):
            result.similarity = head_similarity(
                loaded,
                texts=texts,
                probe=settings,
                max_examples=similarity_examples,
                max_tokens=similarity_tokens,
            )
    return result
