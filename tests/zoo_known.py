"""What the zoo (``tests/integration/test_zoo.py``) expects to fail today, each entry with its reason.

``UNBUILDABLE``: families whose tiny model the generic factory (``tests/zoo.py``) cannot build, and why.
``KNOWN``: family -> {check: reason}; a reason names the issue item and the lane that owns it. The matrix passes with
these failing and fails on any other; when a fix lands, the test warns that an entry now passes: remove it.
"""

from __future__ import annotations

SINKS = (
    "a different convention, not a different number: Granite's eager code reports each row renormalised over the keys "
    "and scales the output by 1 − sink share; attnviz reports the weight each key really gets (the row sums to "
    "1 − sink share), as gpt-oss's eager code does; the outputs are equal (docs/models.md)"
)
LOOPED_REFUSED = "patching refused by name: one module applied at several layers (shared or looped, item 4)"
REFUSED = "patching / norm weighting refused on this layout: item 7 (headout)"
TEXT_STOPS = "refused in one line: the family's own code stops on a text alone (it needs audio, or a language id)"
VLM = "vision-language model: item 8 (vlm)"
SAME_DIFF = "one-line refusal for this input: the tiny model's answer logits do not change between the prompts"
GATED_REFUSED = "refused by name: a gate or sub-norm sits between head output and output projection: item 5 (headout)"
TWO_PER_LAYER = "two attention modules per layer, a layer each as eager numbers them: patching refused by name (item 4)"
TOKEN_SINKS = "load refused by name: per-token attention sinks ('sinks'), which the core does not apply (item 1)"
NAMED_REFUSAL = "load refused by name with the reason (block-local / merged attention): item 6 (layers)"
EXTRA_KEYS = "refused in one line: its compressed attention reads summaries of blocks of keys beside the tokens"
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
    "whisper": "audio model: the text factory saves a tokenizer alone, and Whisper loads with its processor; "
    "tests/integration/test_audio.py checks it against eager on a wav file, every stack",
    "nemo_speechlm": "speech LM: its head config's audio width must equal the audio encoder's, which the shrink sets apart",
    "qwen4_exp": "the default config leaves the indexed-attention sizes (indexer heads, budget, ratio) None",
    "qwen4_exp_text": "the default config leaves the indexed-attention sizes (indexer heads, budget, ratio) None",
    "zamba": "its shared transformer block is tied across hybrid layers; two layers hold only one, and the tie fails",
    "zamba2": "its shared blocks are numbered for more hybrid layers than two layers hold (KeyError in the model)",
}

#: family -> {check: reason}: checks that fail today (remove an entry once its check passes)
KNOWN: dict[str, dict[str, str]] = {
    "afmoe": {"norm": GATED_REFUSED},
    "albert": {"patching": LOOPED_REFUSED},
    "axk2": {"norm": GATED_REFUSED},
    "beam": {"norm": GATED_REFUSED},
    "bigbird_pegasus": {"patching": SPARSE_REFERENCE, "norm": GATED_REFUSED},
    "bitnet": {"norm": GATED_REFUSED},
    "deepseek_v4": {"load": EXTRA_KEYS},
    "diffllama": {"norm": GATED_REFUSED},
    "dory": {"patching": LOOPED_REFUSED, "norm": GATED_REFUSED},
    "git": {"load": VLM},
    "granite_swa": dict.fromkeys(("patterns", "statistics", "norm"), SINKS),
    "granitemoe_swa": dict.fromkeys(("patterns", "statistics", "norm"), SINKS),
    "granitemoehybrid": {"load": NO_ATTENTION},
    "hrm_text": {"patching": LOOPED_REFUSED, "norm": GATED_REFUSED},
    "hy_v4": {"norm": GATED_REFUSED},
    "inkling2_loop_text": {"load": TOKEN_SINKS},
    "inkling2_text": {"load": TOKEN_SINKS},
    "jetmoe": dict.fromkeys(("patching", "norm"), REFUSED),
    "laguna": {"norm": GATED_REFUSED},
    "lfm3": {"norm": GATED_REFUSED},
    "longcat_flash": {"patching": TWO_PER_LAYER},
    "longt5": {"patching": SAME_DIFF, "norm": REFUSED},
    "mt5": {"patching": SAME_DIFF},
    "musicgen": {"load": TEXT_STOPS},
    "musicgen_melody": {"load": TEXT_STOPS},
    "neomme": {"patching": SAME_DIFF, "norm": GATED_REFUSED},
    "pegasus_x": {"load": NAMED_REFUSAL},
    "qwen3_5": {"norm": GATED_REFUSED},
    "qwen3_5_moe": {"norm": GATED_REFUSED},
    "qwen3_5_moe_text": {"norm": GATED_REFUSED},
    "qwen3_5_text": {"norm": GATED_REFUSED},
    "qwen3_next": {"norm": GATED_REFUSED},
    "switch_transformers": {"patching": SAME_DIFF},
    "t5": {"patching": SAME_DIFF},
    "t5gemma2": {"load": NAMED_REFUSAL},
    "umt5": {"patching": SAME_DIFF},
    "voxtral_realtime": {"load": TEXT_STOPS},
    "xmod": {"load": TEXT_STOPS},
}

# -- vision families (``image:…`` an image classifier, ``image-text:…`` a vision-language model) --------------------

TORCHVISION = "its image processor needs torchvision (no Pillow version), which is not installed"
VIDEO = "its processor reads its video processor's settings, and video processors need torchvision (not installed)"
NO_IMAGE_PROCESSOR = "transformers' auto mapping names no image processor for it (its checkpoints name another's)"
NO_PROCESSOR = "transformers' auto mapping names no processor class for it"
VALIDATION = "the shrunk config fails its own architecture validation (sizes of parts the generic shrink sets apart)"
PYRAMID = "per-stage lists of sizes (a pyramid of stages or windows): the generic shrink sets them to one number"
IMPORTS = "building it imports a package that is not installed (timm, or torchvision for its image processor)"
EMPTY_DEFAULT = "the default config leaves a part the model reads empty (None)"
MORE_PROCESSORS = "its processor needs more than an image processor and a tokenizer"
VLM_UNMAPPED = (
    "refused by name: attnviz does not map this family's image tokens onto the picture (it names those it reads)"
)
CAPTIONER_REFUSED = "refused by name: a captioner whose attention attnviz cannot show (the reason in the line)"
STOPS = "refused in one line: loaded as a language model, the family's own code stops on the probe text"
IMAGE_UNREAD = "refused by name: an image model of an architecture attnviz does not read (it names those it reads)"

#: vision family -> why no tiny model is built generically
VISION_UNBUILDABLE: dict[str, str] = {
    **dict.fromkeys(
        (
            "image-text:" + f
            for f in (
                "cohere2_vision",
                "gemma4_unified",
                "inkling_mm_model",
                "kimi_k25",
                "lfm2_vl",
                "llama4",
                "minicpm_ocr",
                "minimax_m3_vl",
                "muse_glimmer",
                "nemotron_h_omni",
                "perception_lm",
                "pi0",
                "pp_formulanet",
                "step3p7",
                "unlimited_ocr",
            )
        ),
        TORCHVISION,
    ),
    **dict.fromkeys(
        (
            "image-text:" + f
            for f in (
                "minicpmv4_6",
                "minicpmv4_7",
            )
        ),
        VIDEO,
    ),
    **dict.fromkeys(
        (
            "image-text:" + f
            for f in (
                "diffusion_gemma",
                "evolla",
                "fast_vlm",
                "glm4v_moe",
                "glm_ocr",
                "instructblipvideo",
                "mistral4",
                "qwen2_5_omni_thinker",
                "qwen3_omni_moe_thinker",
                "qwen3_vl_moe",
            )
        ),
        NO_IMAGE_PROCESSOR,
    ),
    **dict.fromkeys(("image-text:" + f for f in ("cosmos3_omni", "glmga", "kosmos-2", "kosmos-2.5")), NO_PROCESSOR),
    **dict.fromkeys(
        (
            "image-text:" + f
            for f in (
                "apertus1p5",
                "cosmos3_edge",
                "dots3_note",
                "glm5_next",
                "granite_docling",
                "hy_v4_vl",
                "inkling2",
                "inkling2_loop",
                "muse_spark",
                "ernie4_5_vl_moe",
                "florence2",
                "molmo2",
            )
        ),
        VALIDATION,
    ),
    **dict.fromkeys(
        ("image:" + f for f in ("cvt", "dinat", "hiera", "levit", "pvt", "pvt_v2", "segformer", "swin", "swinv2")),
        PYRAMID,
    ),
    **dict.fromkeys(("image-text:mistral3", "image-text:mistral_large4", "image:timm_wrapper"), IMPORTS),
    **dict.fromkeys(
        ("image-text:chameleon", "image-text:emu3", "image-text:deepseek_ocr2", "image-text:granite4_vision"),
        EMPTY_DEFAULT,
    ),
    "image-text:gemma3n": MORE_PROCESSORS + " (an audio feature extractor)",
    "image-text:gemma4": MORE_PROCESSORS + " (an audio feature extractor)",
    "image-text:qwen4_exp": EMPTY_DEFAULT + " (its indexer's token budget)",
    "image-text:cohere_compass": "the default config's rotary settings name none of its own layer types",
    "image-text:instructblip": MORE_PROCESSORS + " (a second tokenizer, its Q-Former's)",
    "image-text:fuyu": "its processor needs tokens of the family's own vocabulary (|SPEAKER|, |NEWLINE|)",
    "image-text:vision-encoder-decoder": "any encoder with any decoder, no default config: tests/tiny_vision.py builds "
    "captioners of it (test_caption.py)",
}

#: vision family -> {check: reason}: checks that fail today
VISION_KNOWN: dict[str, dict[str, str]] = {
    **{
        "image-text:" + f: {"load": VLM_UNMAPPED}
        for f in (
            "aria",
            "aya_vision",
            "deepseek_vl_hybrid",
            "got_ocr2",
            "idefics2",
            "lighton_ocr",
            "exaone4_5",
            "hyperclovax_vision_v2",
            "internvl",
            "lfm3_vl",
            "llava_next",
            "llava_next_video",
            "llava_onevision",
            "ovis2",
            "pp_chart2table",
            "qianfan_ocr",
            "video_llama_3",
        )
    },
    **{"image-text:" + f: {"load": CAPTIONER_REFUSED} for f in ("blip", "blip-2", "git", "idefics", "pix2struct")},
    **{"image-text:" + f: {"load": STOPS} for f in ("hunyuan_vl", "paddleocr_vl", "udop")},
    **{
        "image:" + f: {"load": IMAGE_UNREAD}
        for f in ("metaclip_2", "mobilevit", "mobilevitv2", "siglip2", "swiftformer")
    },
    "image-text:shieldgemma2": {"load": "refused in one line: its processor needs ShieldGemma 2's chat template"},
    "image-text:qwen3_5": {"norm": GATED_REFUSED},
    "image-text:qwen3_5_moe": {"norm": GATED_REFUSED},
    "image-text:t5gemma2": {"load": NAMED_REFUSAL},
    "image:beit": {"load": "refused by name: BEiT adds a relative position bias that the core does not receive"},
    "image:shieldgemma2": {"load": "refused in one line: its classifier reads a prompt with the image (a VLM inside)"},
}
