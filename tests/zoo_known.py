"""What the zoo (``tests/integration/test_zoo.py``) expects to fail today, each entry with its reason.

``UNBUILDABLE``: families whose tiny model the generic factory (``tests/zoo.py``) cannot build, and why.
``KNOWN``: family -> {check: reason}; a reason names the issue item and the lane that owns it. The matrix passes with
these failing and fails on any other; when a fix lands, the test warns that an entry now passes: remove it.
"""

from __future__ import annotations

SINKS = "attention sinks (s_aux): issue 38 item 1 (sinks)"
LOOPED = "shared or looped layers, one site per application: item 4 (layers)"
GATED = "a gate or sub-norm between head output and output projection: item 5 (headout)"
REFUSED = "patching / norm weighting refused on this layout: item 7 (headout)"
CRASH = "a crash that must become support or a clear refusal: item 6 (layers)"
VLM = "vision-language model: item 8 (vlm)"
SAME_DIFF = "one-line refusal for this input: the tiny model's answer logits do not change between the prompts"
NO_VALUES = "zoo reference: an eager-only family has no eager_attention_forward to read value vectors from"
BLOCKED = "zoo reference: eager returns LongT5's local attention as [b, blocks, h, block, 3·block], not unfolded"
GATED_REFUSED = "refused by name: a gate or sub-norm sits between head output and output projection: item 5 (headout)"
TWO_PER_LAYER = "two attention modules per layer: eager returns 4 layers where attnviz records 2 (like item 4, layers)"
REGRESSED = (
    "exact at main 6730e03, off since d8f53bd (patterns ~0.93-1.0, logits 3-5): a regression, see zoo-failures.md"
)
NAMED_REFUSAL = "load refused by name with the reason (block-local / merged attention): item 6 (layers)"
NO_ATTENTION = (
    "zoo factory: the default layer types are all linear attention, so the tiny model has none (clear refusal)"
)
SPARSE_REFERENCE = (
    "zoo reference: the block-sparse encoder does not call eager_attention_forward, so its blocks are missing"
)

#: family -> why a tiny model cannot be built generically from its config's defaults
UNBUILDABLE: dict[str, str] = {
    "bailing_hybrid": "the shrunk config gives its linear attention a head size of 0 (a size field the shrink misses)",
    "blt": "byte-latent model: patcher, local encoder and global transformer sizes must agree (shrunk apart)",
    "cohere_compass_text": "the default config has empty rope_parameters, which the modeling code reads by layer type",
    "dbrx": "the default DbrxAttentionConfig lacks the rope_theta that DbrxAttention reads",
    "dots3_note": "per-layer settings fail the config's own head-count validation after shrinking",
    "dots3_note_text": "per-layer settings fail the config's own head-count validation after shrinking",
    "gemma3n": "building it imports timm (its vision tower), which is not installed",
    "kimi_linear": "the router's top-k exceeds the shrunk expert count (a field the shrink misses)",
    "nemo_speechlm": "speech LM: its head config's audio width must equal the audio encoder's, which the shrink sets apart",
    "qwen4_exp": "the default config leaves the indexed-attention sizes (indexer heads, budget, ratio) None",
    "qwen4_exp_text": "the default config leaves the indexed-attention sizes (indexer heads, budget, ratio) None",
    "zamba": "its shared transformer block is tied across hybrid layers; two layers hold only one, and the tie fails",
    "zamba2": "its shared blocks are numbered for more hybrid layers than two layers hold (KeyError in the model)",
}

#: family -> {check: reason}: checks that fail today (remove an entry once its check passes)
KNOWN: dict[str, dict[str, str]] = {
    "afmoe": {"norm": GATED_REFUSED},
    "albert": {"patching": LOOPED},
    "axk2": {"norm": GATED_REFUSED},
    "beam": {"norm": GATED_REFUSED},
    "bigbird_pegasus": {"patching": SPARSE_REFERENCE, "norm": GATED_REFUSED},
    "bitnet": {"norm": GATED_REFUSED},
    "bloom": {**dict.fromkeys(("patterns", "outputs", "statistics"), REGRESSED), "patching": GATED, "norm": NO_VALUES},
    "deberta-v2": {"norm": NO_VALUES},
    "deepseek_v4": {"load": SINKS},
    "diffllama": {**dict.fromkeys(("patterns", "statistics", "patching"), LOOPED), "norm": GATED_REFUSED},
    "dory": {"patching": LOOPED, "norm": GATED_REFUSED},
    "falcon": {"norm": NO_VALUES},
    "git": {"load": VLM},
    "gpt_neo": {"norm": NO_VALUES},
    "granite_swa": dict.fromkeys(("patterns", "statistics", "norm"), SINKS),
    "granitemoe_swa": dict.fromkeys(("patterns", "statistics", "norm"), SINKS),
    "granitemoehybrid": {"load": NO_ATTENTION},
    "hrm_text": {"patching": LOOPED, "norm": GATED_REFUSED},
    "hy_v4": {"norm": GATED_REFUSED},
    "inkling2_loop_text": {
        **dict.fromkeys(("patterns", "outputs", "statistics", "patching"), SINKS),
        "norm": GATED_REFUSED,
    },
    "inkling2_text": {**dict.fromkeys(("patterns", "outputs", "statistics", "patching"), SINKS), "norm": GATED_REFUSED},
    "jetmoe": dict.fromkeys(("patching", "norm"), REFUSED),
    "laguna": {"norm": GATED_REFUSED},
    "lfm3": {"norm": GATED_REFUSED},
    "longcat_flash": {**dict.fromkeys(("patterns", "statistics", "patching"), TWO_PER_LAYER), "norm": NO_VALUES},
    "longt5": {**dict.fromkeys(("patterns", "statistics"), BLOCKED), **dict.fromkeys(("patching", "norm"), REFUSED)},
    "minimax": dict.fromkeys(("patterns", "statistics"), LOOPED),
    "mpnet": {"norm": NO_VALUES},
    "mt5": {"patching": SAME_DIFF},
    "musicgen": {"load": CRASH},
    "musicgen_melody": {"load": CRASH},
    "neomme": {"patching": SAME_DIFF, "norm": GATED_REFUSED},
    "nllb-moe": {**dict.fromkeys(("patterns", "outputs"), REGRESSED), **dict.fromkeys(("patching", "norm"), CRASH)},
    "pegasus_x": {"load": NAMED_REFUSAL},
    "qwen3_5": {"norm": GATED_REFUSED},
    "qwen3_5_moe": {"norm": GATED_REFUSED},
    "qwen3_5_moe_text": {"norm": GATED_REFUSED},
    "qwen3_5_text": {"norm": GATED_REFUSED},
    "qwen3_next": {"norm": GATED_REFUSED},
    "seamless_m4t": dict.fromkeys(("patching", "norm"), CRASH),
    "seamless_m4t_v2": dict.fromkeys(("patching", "norm"), CRASH),
    "switch_transformers": {"patching": SAME_DIFF},
    "t5": {"patching": SAME_DIFF},
    "t5gemma2": {"load": NAMED_REFUSAL},
    "umt5": {"patching": SAME_DIFF},
    "voxtral_realtime": {"load": CRASH},
    "xmod": {"load": CRASH},
}
