"""attnviz: see what a transformer's attention heads do, and which of them matter.

The whole public surface, in the order data flows through it (the input decides the modality: a text, texts, an
image, an image with its caption, or a wav file with its transcript for Whisper; ``generate`` lets the model write
after a text, a text with its picture, an image or a wav file)::

    import attnviz

    model = attnviz.load_model("minilm")                       # load; or attnviz.wrap(your_model, tokenizer)
    result = attnviz.capture(model, "The cat sat.")             # AttentionCapture; an image: capture(vit, "cat.png")
    written = attnviz.generate(lm, "The cat", max_new_tokens=8)  # it writes: .capture, .text, .token_ids; an
                                                                #   image for a captioner, audio for Whisper
    rows = attnviz.query_rows(model, long_text, "last")         # one query's row per head, any length
    stats = attnviz.compute_statistics(model, texts)            # streamed statistics, of texts or images
    detection = attnviz.detect_heads(stats)                     # collapsed / unfocused / sink / positional heads
    functions = attnviz.head_functions(model)                   # induction / duplicate / previous-token heads
    similar = attnviz.head_similarity(model, texts=texts)       # which heads attend alike
    matrix = attnviz.rollout(result)                            # attention rollout [query, key]
    breakdown = attnviz.explain_logit(model, text, layer=2, head=7, query=3, key=0)  # why one weight
    mapping = attnviz.query_key_map(model, texts, layer=2, head=7)  # a head's queries and keys together
    effects = attnviz.patch_heads(model, clean=…, corrupt=…, answer=…, wrong=…)  # which heads make this answer
    circuit = attnviz.find_circuit(model, clean=…, corrupt=…, answer=…, wrong=…)  # which heads feed which
    diff = attnviz.compare_models(model, other, texts)          # or attnviz.compare_inputs(model, text_a, text_b)
    figure = attnviz.heatmap(result)                            # any of the above that is drawn: text, image,
    attnviz.save_figure(figure, "cat.png")                      #   caption, strips, query-key
    attnviz.show(stats)                                         # any result, inline in a notebook
    attnviz.head_view(result), attnviz.model_view(result), attnviz.head_atlas(model)
    outcome = attnviz.prune_model(model, attnviz.PruneConfig(ratio=0.3), texts=texts)
    attnviz.save_outcome(outcome, "pruned", source="minilm")  # a smaller checkpoint that load_model reads
    # every error attnviz raises on purpose is an attnviz.AttnvizError

Rarer names live in their packages: toy models in ``attnviz.toy``, the attention core in ``attnviz.core``, and
``attnviz.stats``, ``attnviz.heads``, ``attnviz.prune``, ``attnviz.patching``, ``attnviz.circuit``, ``attnviz.captures``,
``attnviz.render``. Names are imported lazily, so ``import attnviz`` does not import torch or transformers until
one of them is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz.common.lazy import lazy_exports

__version__ = "0.1.0"

#: public name -> module that defines it
_EXPORTS = {
    "load_model": "attnviz.models.specs",
    "wrap": "attnviz.models.wrapped",
    "capture": "attnviz.captures.attention_capture",
    "AttentionCapture": "attnviz.captures.result",
    "generate": "attnviz.captures.writing",
    "Generation": "attnviz.captures.generation",
    "query_rows": "attnviz.captures.query_rows",
    "compute_statistics": "attnviz.stats",
    "detect_heads": "attnviz.stats",
    "head_functions": "attnviz.heads",
    "head_similarity": "attnviz.heads",
    "rollout": "attnviz.heads",
    "explain_logit": "attnviz.heads.query_key",
    "query_key_map": "attnviz.heads.query_key",
    "patch_heads": "attnviz.patching",
    "find_circuit": "attnviz.circuit",
    "compare_models": "attnviz.compare",
    "compare_inputs": "attnviz.compare",
    "heatmap": "attnviz.render.capture_view",
    "save_figure": "attnviz.render.heatmap",
    "show": "attnviz.render.inline",
    "head_view": "attnviz.render.inline",
    "model_view": "attnviz.render.inline",
    "head_atlas": "attnviz.atlas.inline",
    "prune_model": "attnviz.prune",
    "PruneConfig": "attnviz.prune",
    "save_outcome": "attnviz.prune",
    "AttnvizError": "attnviz.common.errors",
}

#: names that left the top level: old name -> (module, attribute, what to use instead); each use warns
_DEPRECATED = {
    "capture_image": ("attnviz.captures.images", "capture_image", "attnviz.capture(model, image)"),
    "caption_capture": (
        "attnviz.captures.writing",
        "_caption_capture",
        "attnviz.capture(model, image, target=caption) (to let it write: attnviz.generate(model, image, max_new_tokens=N))",
    ),
    "compute_image_statistics": (
        "attnviz.stats.images",
        "compute_image_statistics",
        "attnviz.compute_statistics(model, images)",
    ),
    "capture_query_rows": (
        "attnviz.captures.query_rows",
        "capture_query_rows",
        "attnviz.query_rows(model, text, query)",
    ),
    "query_rows_of_capture": (
        "attnviz.captures.query_rows",
        "query_rows_of_capture",
        "attnviz.query_rows(capture, query)",
    ),
    "render_heatmaps": (
        "attnviz.render.heatmap",
        "render_heatmaps",
        "attnviz.heatmap(capture) (panels: attnviz.render.heatmap.render_heatmaps)",
    ),
    "capture_heatmap": ("attnviz.render.capture_view", "capture_heatmap", "attnviz.heatmap(capture)"),
    "image_heatmap": ("attnviz.render.image_overlay", "image_heatmap", "attnviz.heatmap(capture)"),
    "caption_heatmap": ("attnviz.render.caption_overlay", "caption_heatmap", "attnviz.heatmap(capture)"),
    "query_strip": ("attnviz.render.query_strip", "query_strip", "attnviz.heatmap(rows)"),
    "query_key_figure": ("attnviz.render.query_key", "query_key_figure", "attnviz.heatmap((breakdown, mapping))"),
    **{
        name: (module, name, f"{module}.{name}")
        for module, names in {
            "attnviz.models.base": ["LoadedModel"],
            "attnviz.core": ["attend", "AttentionContext", "AttentionSite", "HeadMask", "PatternRecorder"],
            "attnviz.stats": ["PRESETS", "StatisticsAccumulator"],
            "attnviz.heads": ["HeadFunctions", "ProbeSettings", "FunctionThresholds"],
            "attnviz.patching": ["PatchResult"],
            "attnviz.prune": ["PruneStrategy"],
            "attnviz.captures.query_rows": ["QueryRows"],
            "attnviz.render.inline": ["HtmlView"],
            "attnviz.toy": ["build_toy_model", "train_toy_model", "load_toy_model"],
        }.items()
        for name in names
    },
}

__all__ = [
    "AttentionCapture",
    "AttnvizError",
    "Generation",
    "PruneConfig",
    "__version__",
    "capture",
    "compare_inputs",
    "compare_models",
    "compute_statistics",
    "detect_heads",
    "explain_logit",
    "find_circuit",
    "generate",
    "head_atlas",
    "head_functions",
    "head_similarity",
    "head_view",
    "heatmap",
    "load_model",
    "model_view",
    "patch_heads",
    "prune_model",
    "query_key_map",
    "query_rows",
    "rollout",
    "save_figure",
    "save_outcome",
    "show",
    "wrap",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from attnviz.atlas.inline import head_atlas
    from attnviz.captures.attention_capture import capture
    from attnviz.captures.generation import Generation
    from attnviz.captures.query_rows import query_rows
    from attnviz.captures.result import AttentionCapture
    from attnviz.captures.writing import generate
    from attnviz.circuit import find_circuit
    from attnviz.common.errors import AttnvizError
    from attnviz.compare import compare_inputs, compare_models
    from attnviz.heads import head_functions, head_similarity, rollout
    from attnviz.heads.query_key import explain_logit, query_key_map
    from attnviz.models.specs import load_model
    from attnviz.models.wrapped import wrap
    from attnviz.patching import patch_heads
    from attnviz.prune import PruneConfig, prune_model, save_outcome
    from attnviz.render.capture_view import heatmap
    from attnviz.render.heatmap import save_figure
    from attnviz.render.inline import head_view, model_view, show
    from attnviz.stats import compute_statistics, detect_heads


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _DEPRECATED)
