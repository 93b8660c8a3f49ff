"""The head atlas of a model already loaded (or wrapped), as a view a notebook shows inline.

The same page as ``attnviz report`` (:mod:`attnviz.render.atlas`), built from a
:class:`~attnviz.models.base.LoadedModel` instead of a checkpoint path, and returned instead of written.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnviz.atlas.build import measure_for_atlas
from attnviz.common.texts import load_texts
from attnviz.core.choices import Weighting
from attnviz.models.base import LoadedModel
from attnviz.render.atlas import ExtraColumns, atlas_html
from attnviz.render.inline import HtmlView
from attnviz.stats.thresholds import Thresholds


def head_atlas(
    loaded: LoadedModel,
    texts: Sequence[str] | None = None,
    *,
    examples: int = 3,
    extra_columns: ExtraColumns | None = None,
    thresholds: Thresholds | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
    seed: int = 0,
    progress: bool = False,
    weighting: Weighting = "weights",
) -> HtmlView:
    """Measure every head of ``loaded`` over ``texts`` (default: the shipped corpus; a toy model: its own task)
    and return the atlas page: ``.html``, ``.save(path)``, and shown inline in a notebook.

    ``examples``: short texts whose patterns the page shows; ``extra_columns``: per-head columns
    ``{name: {(stack, layer, head): value}}`` (e.g. head-function scores or pruning importance).
    ``weighting="norm"``: statistics and patterns of norm-based attention, rows renormalised (see ``build_head_atlas``).
    """
    if texts is None and loaded.own_examples(1, seed) is None:
        texts = load_texts()  # no task of its own: the shipped corpus, for the statistics and the examples alike
    stats, detection, captured = measure_for_atlas(
        loaded,
        texts,
        examples=examples,
        thresholds=thresholds,
        seed=seed,
        progress=progress,
        batch_size=batch_size,
        max_length=max_length,
        weighting=weighting,
    )
    page = atlas_html(stats, detection, captured, extra_columns=dict(extra_columns or {}), identity=stats.identity)
    return HtmlView(page, title=f"head atlas: {loaded.name}", height=900)
