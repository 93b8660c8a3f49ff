"""What the zoo (``tests/integration/test_zoo.py``) expects to fail today, each entry with its reason.

``UNBUILDABLE``: families whose tiny model the generic factory (``tests/zoo.py``) cannot build, and why.
``KNOWN``: family -> {check: reason}; a reason names the issue item and the lane that owns it. The matrix passes with
these failing and fails on any other; when a fix lands, the test warns that an entry now passes: remove it.
"""

from __future__ import annotations

SINKS = "attention sinks (s_aux): issue 38 item 1 (sinks)"
HYBRID = "hybrid stack, layers without softmax attention: item 3 (layers)"
LOOPED = "shared or looped layers, one site per application: item 4 (layers)"
GATED = "a gate or sub-norm between head output and output projection: item 5 (headout)"
REFUSED = "patching / norm weighting refused on this layout: item 7 (headout)"
CRASH = "a crash that must become support or a clear refusal: item 6 (layers)"
VLM = "vision-language model: item 8 (vlm)"
SAME_DIFF = "one-line refusal for this input: the tiny model's answer logits do not change between the prompts"
NO_VALUES = "zoo reference: an eager-only family has no eager_attention_forward to read value vectors from"
BLOCKED = "zoo reference: eager returns LongT5's local attention as [b, blocks, h, block, 3·block], not unfolded"
TWO_PER_LAYER = "two attention modules per layer: eager returns 4 layers where attnviz records 2 (like item 4, layers)"

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
    "afmoe": {"norm": REFUSED},
    "albert": {"patching": LOOPED},
    "axk2": {"norm": REFUSED},
    "bamba": {"patterns": HYBRID, **dict.fromkeys(("patching", "norm"), REFUSED)},
    "beam": {"patching": GATED, "norm": REFUSED},
    "bigbird_pegasus": dict.fromkeys(("patterns", "statistics"), CRASH),
    "bitnet": {"norm": REFUSED},
    "bloom": {"norm": NO_VALUES},
    "deberta-v2": {"norm": NO_VALUES},
    "deepseek_v4": {"load": SINKS},
    "diffllama": {**dict.fromkeys(("patterns", "statistics", "patching"), LOOPED), "norm": REFUSED},
    "dory": {"patching": LOOPED, "norm": REFUSED},
    "falcon": {"norm": NO_VALUES},
    "gemma3": {"load": VLM},
    "git": {"load": VLM},
    "gpt_neo": {"norm": NO_VALUES},
    "granite_swa": dict.fromkeys(("patterns", "statistics", "norm"), SINKS),
    "granitemoe_swa": dict.fromkeys(("patterns", "statistics", "norm"), SINKS),
    "granitemoehybrid": {
        **dict.fromkeys(("patterns", "outputs"), HYBRID),
        **dict.fromkeys(("patching", "norm"), REFUSED),
    },
    "hrm_text": {"patching": LOOPED, "norm": REFUSED},
    "hy_v4": {"norm": REFUSED},
    "inkling2_loop_text": {**dict.fromkeys(("patterns", "outputs", "statistics", "patching"), SINKS), "norm": REFUSED},
    "inkling2_text": {**dict.fromkeys(("patterns", "outputs", "statistics", "patching"), SINKS), "norm": REFUSED},
    "jamba": {"patterns": HYBRID, **dict.fromkeys(("patching", "norm"), REFUSED)},
    "jetmoe": {"patching": GATED, "norm": REFUSED},
    "laguna": {"patching": GATED, "norm": REFUSED},
    "lfm3": {"patching": GATED, "norm": REFUSED},
    "longcat_flash": {**dict.fromkeys(("patterns", "statistics", "patching"), TWO_PER_LAYER), "norm": NO_VALUES},
    "longt5": {**dict.fromkeys(("patterns", "statistics"), BLOCKED), **dict.fromkeys(("patching", "norm"), REFUSED)},
    "minimax": dict.fromkeys(("patterns", "statistics"), LOOPED),
    "mpnet": {"norm": NO_VALUES},
    "mt5": {"patching": SAME_DIFF},
    "musicgen": {"load": CRASH},
    "musicgen_melody": {"load": CRASH},
    "neomme": dict.fromkeys(("patching", "norm"), REFUSED),
    "nllb-moe": dict.fromkeys(("patching", "norm"), CRASH),
    "pegasus_x": {"load": CRASH},
    "qwen3_5": {"norm": REFUSED},
    "qwen3_5_moe": {"norm": REFUSED},
    "qwen3_5_moe_text": {"norm": REFUSED},
    "qwen3_5_text": {"norm": REFUSED},
    "qwen3_next": {"norm": REFUSED},
    "recurrent_gemma": {"patterns": HYBRID, **dict.fromkeys(("patching", "norm"), REFUSED)},
    "seamless_m4t": dict.fromkeys(("patterns", "statistics", "patching", "norm"), CRASH),
    "seamless_m4t_v2": dict.fromkeys(("patterns", "statistics", "patching", "norm"), CRASH),
    "switch_transformers": {"patching": SAME_DIFF},
    "t5": {"patching": SAME_DIFF},
    "t5gemma2": dict.fromkeys(("patterns", "statistics", "norm"), CRASH),
    "umt5": {"patching": SAME_DIFF},
    "voxtral_realtime": {"load": CRASH},
    "xmod": {"load": CRASH},
}
