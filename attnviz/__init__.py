"""attnviz: see what a transformer's attention heads do, and which of them matter.

The main entry points, in the order data flows through them::

    import attnviz

    model = attnviz.load_model("minilm")                      # load (or attnviz.wrap(your_model, tokenizer))
    result = attnviz.capture(model, "The cat sat.")             # capture: AttentionCapture
    stats = attnviz.compute_statistics(model, texts)           # statistics, streamed
    detection = attnviz.detect_heads(stats)                    # collapsed / unfocused / labels
    functions = attnviz.head_functions(model)                  # induction / duplicate / previous-token heads
    matrix = attnviz.rollout(result)                           # attention rollout [query, key]
    rows = attnviz.capture_query_rows(model, long_text, "last")  # one query's row per head, any length
    effects = attnviz.patch_heads(model, clean=…, corrupt=…, answer=…, wrong=…)  # which heads make this answer
    circuit = attnviz.find_circuit(model, clean=…, corrupt=…, answer=…, wrong=…)  # which heads feed which
    outcome = attnviz.prune_model(model, attnviz.PruneConfig(ratio=0.3), texts=texts)

Names are imported lazily, so ``import attnviz`` does not import torch or transformers
until one of them is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz.common.lazy import lazy_exports

__version__ = "0.1.0"

#: public name -> module that defines it
_EXPORTS = {
    "load_model": "attnviz.models.specs",
    "wrap": "attnviz.models.wrapped",
    "head_view": "attnviz.render.inline",
    "model_view": "attnviz.render.inline",
    "show": "attnviz.render.inline",
    "HtmlView": "attnviz.render.inline",
    "head_atlas": "attnviz.atlas.inline",
    "LoadedModel": "attnviz.models.base",
    "capture": "attnviz.captures.attention_capture",
    "AttentionCapture": "attnviz.captures.result",
    "PatternRecorder": "attnviz.captures.attention_capture",
    "attend": "attnviz.core",
    "AttentionContext": "attnviz.core",
    "AttentionSite": "attnviz.core",
    "HeadMask": "attnviz.core",
    "compute_statistics": "attnviz.stats",
    "detect_heads": "attnviz.stats",
    "PRESETS": "attnviz.stats",
    "StatisticsAccumulator": "attnviz.stats",
    "prune_model": "attnviz.prune",
    "save_outcome": "attnviz.prune",
    "PruneConfig": "attnviz.prune",
    "PruneStrategy": "attnviz.prune",
    "render_heatmaps": "attnviz.render.heatmap",
    "capture_heatmap": "attnviz.render.capture_view",
    "capture_image": "attnviz.captures.images",
    "caption_capture": "attnviz.captures.captioning",
    "caption_heatmap": "attnviz.render.caption_overlay",
    "capture_query_rows": "attnviz.captures.query_rows",
    "query_rows_of_capture": "attnviz.captures.query_rows",
    "QueryRows": "attnviz.captures.query_rows",
    "query_strip": "attnviz.render.query_strip",
    "image_heatmap": "attnviz.render.image_overlay",
    "compute_image_statistics": "attnviz.stats.images",
    "save_figure": "attnviz.render.heatmap",
    "build_toy_model": "attnviz.toy",
    "train_toy_model": "attnviz.toy",
    "load_toy_model": "attnviz.toy",
    "AttnvizError": "attnviz.common.errors",
    "compare_models": "attnviz.compare",
    "compare_inputs": "attnviz.compare",
    "head_functions": "attnviz.heads",
    "patch_heads": "attnviz.patching",
    "PatchResult": "attnviz.patching",
    "find_circuit": "attnviz.circuit",
    "CircuitResult": "attnviz.circuit",
    "head_similarity": "attnviz.heads",
    "rollout": "attnviz.heads",
    "HeadFunctions": "attnviz.heads",
    "ProbeSettings": "attnviz.heads",
    "FunctionThresholds": "attnviz.heads",
    "explain_logit": "attnviz.heads.query_key",
    "query_key_map": "attnviz.heads.query_key",
    "query_key_figure": "attnviz.render.query_key",
}

__all__ = [
    "PRESETS",
    "AttentionCapture",
    "AttentionContext",
    "AttentionSite",
    "AttnvizError",
    "CircuitResult",
    "FunctionThresholds",
    "HeadFunctions",
    "HeadMask",
    "HtmlView",
    "LoadedModel",
    "PatchResult",
    "PatternRecorder",
    "ProbeSettings",
    "PruneConfig",
    "PruneStrategy",
    "QueryRows",
    "StatisticsAccumulator",
    "__version__",
    "attend",
    "build_toy_model",
    "caption_capture",
    "caption_heatmap",
    "capture",
    "capture_heatmap",
    "capture_image",
    "capture_query_rows",
    "compare_inputs",
    "compare_models",
    "compute_image_statistics",
    "compute_statistics",
    "detect_heads",
    "explain_logit",
    "find_circuit",
    "head_atlas",
    "head_functions",
    "head_similarity",
    "head_view",
    "image_heatmap",
    "load_model",
    "load_toy_model",
    "model_view",
    "patch_heads",
    "prune_model",
    "query_key_figure",
    "query_key_map",
    "query_rows_of_capture",
    "query_strip",
    "render_heatmaps",
    "rollout",
    "save_figure",
    "save_outcome",
    "show",
    "train_toy_model",
    "wrap",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from attnviz.atlas.inline import head_atlas
    from attnviz.captures.attention_capture import PatternRecorder, capture
    from attnviz.captures.captioning import caption_capture
    from attnviz.captures.images import capture_image
    from attnviz.captures.query_rows import QueryRows, capture_query_rows, query_rows_of_capture
    from attnviz.captures.result import AttentionCapture
    from attnviz.circuit import CircuitResult, find_circuit
    from attnviz.common.errors import AttnvizError
    from attnviz.compare import compare_inputs, compare_models
    from attnviz.core import AttentionContext, AttentionSite, HeadMask, attend
    from attnviz.heads import FunctionThresholds, HeadFunctions, ProbeSettings, head_functions, head_similarity, rollout
    from attnviz.models.base import LoadedModel
    from attnviz.models.specs import load_model
    from attnviz.models.wrapped import wrap
    from attnviz.patching import PatchResult, patch_heads
    from attnviz.prune import PruneConfig, PruneStrategy, prune_model, save_outcome
    from attnviz.render.caption_overlay import caption_heatmap
    from attnviz.render.capture_view import capture_heatmap
    from attnviz.render.heatmap import render_heatmaps, save_figure
    from attnviz.render.image_overlay import image_heatmap
    from attnviz.render.inline import HtmlView, head_view, model_view, show
    from attnviz.render.query_strip import query_strip
    from attnviz.stats import PRESETS, StatisticsAccumulator, compute_statistics, detect_heads
    from attnviz.stats.images import compute_image_statistics
    from attnviz.toy import build_toy_model, load_toy_model, train_toy_model


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
