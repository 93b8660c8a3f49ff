"""The zoo: a tiny seeded model of every transformers family that has softmax attention, found by transformers itself.

Families come from transformers' own auto-model mappings (causal LM, masked LM, sequence-to-sequence), never from a
hand list, so the next transformers release brings its new families into ``tests/integration/test_zoo.py`` without
anyone adding them. A family is in the zoo when its modeling module calls transformers' attention interface
(``ALL_ATTENTION_FUNCTIONS`` / ``eager_attention_forward``); the eager-only families attnviz falls back on
(``EAGER_ONLY``) are added to those.

A config is shrunk generically: the config class's defaults, then every size field it has set to a tiny value
(``SIZES``: 2 layers, width 32, 4 heads of 8 dimensions, 2 key/value heads where the config has grouped-query
attention, MiniLM's vocabulary of 30522 so its WordPiece tokenizer serves every model), in sub-configs too; per-layer
lists keep one layer of each kind. Weights are drawn with a tenfold initializer range, so attention is peaked and a
missing bias, soft-cap, sink or scale shows in the numbers. ``FAMILY_OVERRIDES`` holds the few fields a family needs
besides, each with the reason.

Vision families come from the image-classification and image-text-to-text mappings (``discover_vision``, named
``image:vit``, ``image-text:llava``): every family with softmax attention in its own code or its sub-models'. They
are shrunk the same way, with 32×32 pictures in 8×8 patches (``VISION_SIZES``); the family's Pillow image processor
is built from its defaults with its picture sizes shrunk, and a vision-language model's processor joins it to a tiny
byte-level tokenizer that gets each special token the processor asks for (``PROCESSOR_OVERRIDES``: the few
arguments a processor needs besides those it shares with its config).
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

import torch

from attnviz.models.vlm_processor import pictures_only

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: the auto-model mappings families are read from, in the order of preference of the class built for a family
MAPPINGS = (
    # before causal LM: BERT-style encoders and BART-style encoder-decoders also have a decoder-only class there
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
)
#: families that do not call the attention interface but return eager attention weights, which attnviz replays
EAGER_ONLY = ("gpt_neo", "bloom", "falcon", "deberta-v2", "mpnet")
VOCAB = 30522  # MiniLM's WordPiece vocabulary
WIDTH, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 32, 2, 4, 2, 8, 64
SHARPENING = 10.0  # initializer range ×10: peaked attention
#: size field -> tiny value; a field is set only where the family's config has it
SIZES: dict[str, Any] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "word_embed_proj_dim"), WIDTH),
    **dict.fromkeys(("embedding_size", "projection_dim"), WIDTH),
    **dict.fromkeys(
        ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers"), LAYERS
    ),
    **dict.fromkeys(("num_decoder_layers",), LAYERS),
    **dict.fromkeys(
        ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads", "decoder_attention_heads"),
        HEADS,
    ),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"), KV_HEADS),
    **dict.fromkeys(("head_dim", "d_kv", "kv_channels", "attention_head_dim"), HEAD_DIM),
    "rotary_dim": HEAD_DIM // 2,  # GPT-J-style partial rotary embedding (the real GPT-J: 64 of 256 dimensions)
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "hidden_dim"), FFN),
    **dict.fromkeys(("n_inner",), FFN),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size"), FFN // 2),
    **dict.fromkeys(("moe_shared_expert_intermediate_size", "expert_intermediate_size"), FFN // 2),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k", "moe_k"), 2),
    **dict.fromkeys(("n_group", "topk_group", "first_k_dense_replace"), 1),
    # multi-head latent attention: a value head size that differs from the query/key one, as in the real models
    "q_lora_rank": 16,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 16,
    "qk_head_dim": 12,  # qk_nope_head_dim + qk_rope_head_dim
    # the recurrent half of hybrid stacks (linear attention, Mamba): small but consistent with width 32
    **dict.fromkeys(("linear_key_head_dim", "linear_value_head_dim", "mamba_head_dim", "ssm_state_size"), 8),
    **dict.fromkeys(("linear_num_key_heads", "n_groups", "mamba_n_groups"), 2),
    **dict.fromkeys(("mamba_d_head", "mamba_d_state", "mamba_headdim"), 8),
    "n_mamba_heads": 8,
    "mamba_d_ssm": 2 * WIDTH,  # the Mamba mixer's width: heads × head size
    "attention_hidden_size": 2 * WIDTH,  # Zamba's shared block reads the hidden state and the embeddings side by side
    "n_shared_experts": 1,
    **dict.fromkeys(("kv_n_heads",), KV_HEADS),
    **dict.fromkeys(("ffn_hidden_size",), FFN),
    **dict.fromkeys(("attention_heads",), HEADS),  # Mllama's vision tower
    "max_seq_len": 128,
    # the key selector of DeepSeek-style sparse attention
    "index_head_dim": HEAD_DIM,
    "index_n_heads": 2,
    # Gemma-3n-style per-layer inputs
    "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 8,
    # separate sizes of sliding-window layers (Inkling-style)
    **dict.fromkeys(("swa_num_attention_heads",), HEADS),
    **dict.fromkeys(("swa_num_key_value_heads",), KV_HEADS),
    **dict.fromkeys(("swa_head_dim",), HEAD_DIM),
    "sliding_window_size": 4,
    "unpadded_vocab_size": VOCAB,
    **dict.fromkeys(("linear_num_value_heads", "mamba_num_heads", "mamba_n_heads"), 8),
    "vocab_size": VOCAB,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_target_positions"), 128),
    "sliding_window": 4,  # shorter than the test input, so a window that is not applied shows
    "attention_chunk_size": 4,
    "pad_token_id": 0,
    "bos_token_id": 101,  # MiniLM's [CLS] and [SEP] stand in for begin and end of sequence
    "eos_token_id": 102,
    "decoder_start_token_id": 101,
    "sep_token_id": 102,
    "cls_token_id": 101,
}
#: size fields that per-layer lists repeat
REPEATED_SIZES = ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")
#: size fields whose None means "none of it" (no window, no low-rank query): left None
OPTIONAL_SIZES = ("sliding_window", "attention_chunk_size", "q_lora_rank")
#: fields a config derives from its layer count (a backbone's stage names and outputs): left for it to derive again
DERIVED = ("stage_names", "out_features", "out_indices")
#: fields of the initial weights' spread, multiplied by SHARPENING
SPREAD_FIELDS = ("initializer_range", "init_std", "initializer_factor")
#: the fields that count a stack's layers: per-layer lists of that length are cut to the layers kept
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers")
#: fields a family needs besides the generic sizes, each with the reason
FAMILY_OVERRIDES: dict[str, dict[str, Any]] = {
    # GPT-Neo's attention_types must describe exactly num_layers layers: one global and one local
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "window_size": 4},
    # the default config lists no layer types (real checkpoints do) and two dense layers: a convolution layer
    # first, then softmax attention, as in the real stack
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    # M-RoPE rotates a multiple of 4 dimensions: with head size 8, a quarter is too few
    "neomme": {"head_dim": 2 * HEAD_DIM},
    # its last layers reuse the keys and values of earlier layers of their kind: two layers have no earlier one
    "gemma3n_text": {"num_kv_shared_layers": 0},
    # it reads five layers of its tower (-2, -5, -8, -11 and 6 of 24); the tiny tower has two: both of them
    "vipllava": {"vision_feature_layers": [0, -1]},
    # its rotary part is a fraction of the head (partial_rotary_factor 1/8 of 512): with the MLA rule's 4-wide heads
    # that is no dimension at all; heads of 16 with a quarter rotated, output groups that divide the heads
    "deepseek_v4": {"head_dim": 16, "partial_rotary_factor": 0.25, "o_groups": 2, "o_lora_rank": 16},
    # M-RoPE splits half the head size into time, height and width sections; the model's default fits 128-wide heads
    **{
        text_type: {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}}
        for text_type in ("qwen2_vl_text", "qwen2_5_vl_text", "glm4v_text")
    },
    # its layers are input, looped and output layers that must add up to the layer count: one of each, looped twice
    # (its layer_types list attention and MLP sub-layers, two per layer: derived from the counts instead)
    "dory": {
        "num_hidden_layers": 3,
        "n_input_layers": 1,
        "n_recurrent_layers": 1,
        "n_output_layers": 1,
        "layer_types": None,
    },
    # two stacks of layers applied in cycles: one layer per stack keeps every kind of application, in few runs
    "hrm_text": {"num_layers_per_stack": 1, "H_cycles": 1, "L_cycles": 2, "L_bp_cycles": [1]},
    # hybrids whose attention layers are placed by number: two layers would hold none, so layer 1 attends
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    "bamba": {"attn_layer_indices": [1]},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    # Mllama's vision tower: one global layer, and an output as wide as its last layer and the one intermediate
    # layer kept, side by side
    "mllama_vision_model": {"num_global_layers": 1, "vision_output_dim": 2 * WIDTH},
    # the family allows one expert per token only
    "zaya": {"num_experts_per_tok": 1},
}


def _modeling_source(model_type: str) -> str:
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    module = model_type_to_module_name(model_type)
    try:
        return inspect.getsource(importlib.import_module(f"transformers.models.{module}.modeling_{module}"))
    except (ImportError, OSError, TypeError):
        return ""


def is_masked_lm(model_type: str) -> bool:
    """Whether the class built for ``model_type`` reads its answer at a mask token (a masked-LM head)."""
    from transformers.models.auto import modeling_auto

    return model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES


def _causal_classes() -> set[str]:
    from transformers.models.auto import modeling_auto

    return set(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def uses_attention_interface(model_type: str) -> bool:
    """Whether the family's modeling code dispatches attention through transformers' interface."""
    source = _modeling_source(model_type)
    return "ALL_ATTENTION_FUNCTIONS" in source or "eager_attention_forward" in source


@cache
def discover() -> dict[str, str]:
    """``{model_type: class name}`` of every family in :data:`MAPPINGS` with softmax attention (see module doc)."""
    from transformers.models.auto import modeling_auto

    found: dict[str, str] = {}
    for mapping in MAPPINGS:
        for model_type, class_name in getattr(modeling_auto, mapping).items():
            if model_type not in found and (model_type in EAGER_ONLY or uses_attention_interface(model_type)):
                found[model_type] = class_name
    return dict(sorted(found.items()))


def _kept_layers(kinds: list[Any]) -> list[int]:
    """Indices of the per-layer entries to keep: the first layer and the first of another kind (else the second)."""
    other = next((i for i, kind in enumerate(kinds) if kind != kinds[0]), 1)
    return [0, other] if len(kinds) > 1 else [0]


def _per_layer(key: str, value: Any) -> bool:
    """Whether ``value`` may list one entry per layer: a list, or a pattern string (Nemotron-H's ``M-M*``)."""
    return isinstance(value, list) or (isinstance(value, str) and "pattern" in key)


def shrink(values: dict[str, Any], model_type: str, sizes: dict[str, Any] = SIZES) -> dict[str, Any]:
    """A tiny version of one config's ``to_dict()`` (sub-configs shrunk the same way), size fields from ``sizes``."""
    counts = {values[name] for name in LAYER_COUNTS if isinstance(values.get(name), int)}
    # per-layer lists repeat size fields (Laguna's heads per layer): their values shrink with the field
    resized = {values[key]: SIZES[key] for key in REPEATED_SIZES if type(values.get(key)) is int}
    tiny: dict[str, Any] = {}
    for key, value in values.items():
        if key in DERIVED:
            continue
        if isinstance(value, dict) and "model_type" in value:  # a sub-config: text_config, vision_config, …
            tiny[key] = shrink(value, value.get("model_type", model_type), sizes)
        elif key in sizes and (value is not None or key not in OPTIONAL_SIZES):
            tiny[key] = sizes[key]
        elif key in SPREAD_FIELDS and isinstance(value, (int, float)):
            tiny[key] = value * SHARPENING
        elif _per_layer(key, value) and len(value) in counts and len(value) > LAYERS:
            kept = [value[i] for i in _kept_layers(list(value))]
            tiny[key] = (
                "".join(kept) if isinstance(value, str) else [resized.get(v, v) if type(v) is int else v for v in kept]
            )
        elif key == "per_layer_config" and value:
            # {layer number: settings}: the first special layer's settings go to layer 1, sizes shrunk (a larger
            # head size stays larger, as in Gemma 4's global layers)
            first = next(iter(value.values()))
            tiny[key] = {"01": {k: (2 if k == "head_dim" else 1) * SIZES.get(k, v) for k, v in first.items()}}
            _keep_full_heads(first, tiny[key]["01"])
        elif key.endswith(("_layers", "_layers_indices")) and _layer_numbers(value, counts):
            tiny[key] = [LAYERS - 1]  # layer numbers of a special kind (Mllama's cross-attention layers): the last
        else:
            tiny[key] = value
    _keep_full_heads(values, tiny)
    if "qk_rope_head_dim" in values and "head_dim" in values:
        tiny["head_dim"] = SIZES["qk_rope_head_dim"]  # multi-head latent attention: the rotary part's size
    if values.get("is_encoder_decoder") and "decoder_start_token_id" not in values:
        tiny["decoder_start_token_id"] = SIZES["pad_token_id"]  # as in real T5 checkpoints, which all set it
    tiny.update(FAMILY_OVERRIDES.get(model_type, {}))
    return tiny


def _keep_full_heads(values: dict[str, Any], tiny: dict[str, Any]) -> None:
    """Grouped-query attention only where the family has it: as many key/value heads as query heads otherwise."""
    kv = next((k for k in ("num_key_value_heads", "n_kv_heads", "num_kv_heads") if k in values), None)
    heads = next((k for k in ("num_attention_heads", "n_head", "n_heads", "num_heads") if k in values), None)
    if kv and heads and values[kv] is not None and values[kv] == values[heads]:
        tiny[kv] = tiny[heads]


def _layer_numbers(value: Any, counts: set[int]) -> bool:
    """Whether ``value`` is a non-empty list of layer numbers of a stack with more layers than the zoo keeps."""
    if not isinstance(value, list) or not value or not all(isinstance(v, int) for v in value):
        return False
    return any(max(value) < count for count in counts) and max(value) >= LAYERS


def tiny_config(model_type: str, class_name: str | None = None, sizes: dict[str, Any] = SIZES):
    """``(model class, config)`` of a tiny seeded ``model_type`` model (``class_name``: the text zoo's class)."""
    import transformers
    from transformers import AutoConfig

    class_name = class_name or discover().get(model_type) or model_type
    model_class = getattr(transformers, class_name)
    # a causal-LM mapping may name a text class whose config is the text sub-config (Llama4ForCausalLM)
    config_class = getattr(model_class, "config_class", None)
    defaults = config_class() if config_class is not None else AutoConfig.for_model(model_type)
    values = shrink(defaults.to_dict(), model_type, sizes)
    if "is_decoder" in values and class_name in _causal_classes():
        values["is_decoder"] = True  # a BERT-style family's causal-LM class, as its real checkpoints set it
    for key in ("transformers_version", "architectures", "_name_or_path", "model_type"):
        values.pop(key, None)
    config = type(defaults)(**values)
    return model_class, config


def build(model_type: str, path: Path) -> Path:
    """Save a seeded tiny ``model_type`` model with MiniLM's tokenizer into ``path`` and return ``path``."""
    import transformers

    from attnviz.models.specs import minilm_path

    model_class, config = tiny_config(model_type)
    config.save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(path)
    # read back next to the config, as the family reads it: some add a token of their own (Qwen2's end of text)
    tokens = len(transformers.AutoTokenizer.from_pretrained(str(path)))
    text_config = config.get_text_config()
    if getattr(text_config, "vocab_size", tokens) < tokens:
        text_config.vocab_size = tokens
    torch.manual_seed(0)
    model = model_class._from_config(config, attn_implementation="eager")
    model.save_pretrained(path)
    return path


# -- vision: image classifiers and vision-language models ------------------------------------------------------------

#: the auto-model mappings vision families are read from -> the kind of input a family's test gives it
VISION_MAPPINGS = {
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES": "image",  # a picture -> class logits
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES": "image-text",  # a prompt with a picture -> next-token logits
}
IMAGE_SIZE, PATCH = 32, 8  # a 4×4 grid of patches
#: the text sizes, and the picture's: 32×32 pixels in 8×8 patches, one token per patch where a config counts them
VISION_SIZES: dict[str, Any] = {
    **SIZES,
    **dict.fromkeys(("image_size", "vision_image_size"), IMAGE_SIZE),
    **dict.fromkeys(("patch_size", "vision_patch_size"), PATCH),
    **dict.fromkeys(("num_image_tokens", "image_seq_length", "mm_tokens_per_image"), (IMAGE_SIZE // PATCH) ** 2),
    "depth": LAYERS,  # a vision tower's layers (Qwen2-VL)
    "out_hidden_size": WIDTH,  # a patch merger's output: the language model's width (Qwen2.5-VL)
}
#: image-processor arguments a family needs besides its shrunk picture sizes, each with the reason
IMAGE_PROCESSOR_OVERRIDES: dict[str, dict[str, Any]] = {
    # their size bounds count pixels, not edges: one 32×32 picture (4×4 patches, 2×2 merged tokens)
    **{
        model_type: {"size": {"shortest_edge": IMAGE_SIZE**2, "longest_edge": IMAGE_SIZE**2}}
        for model_type in (
            "qwen2_vl",
            "qwen2_5_vl",
            "qwen3_vl",
            "qwen3_vl_moe",
            "qwen3_5",
            "qwen3_5_moe",
            "glm4v",
            "glm46v",
        )
    },
}
#: processor arguments a family needs besides those it shares with its config, each with the reason
PROCESSOR_OVERRIDES: dict[str, dict[str, Any]] = {
    # its CLIP tower keeps a class token before the patches, which the default strategy drops again
    "llava": {"num_additional_image_tokens": 1},
    # the tower's 4×4 patches pooled onto mm_tokens_per_image tokens (the config's name for the processor's count)
    "gemma3": {"image_seq_length": VISION_SIZES["mm_tokens_per_image"]},
    # pixel shuffle merges 2×2 of the 4×4 patches (scale_factor 2): 4 tokens (the processor's default is 169)
    "idefics3": {"image_seq_len": 4},
    "smolvlm": {"image_seq_len": 4},
    # one token per patch of the tower's 4×4 grid (the processor's default is 576, a 384-pixel picture's)
    "deepseek_vl": {"num_image_tokens": 16},
}
#: the image processor a classifier family's checkpoints ship when transformers' auto mapping names none for it
IMAGE_PROCESSOR_OF = {"dinov2_with_registers": "dinov2"}
#: image-processor fields that give a picture's size, and the size keys shrunk in them
PICTURE_FIELDS = ("size", "crop_size", "max_image_size")
PICTURE_KEYS = ("height", "width", "shortest_edge", "longest_edge")


def _sub_types(model_type: str) -> list[str]:
    """The model types of the default config's sub-configs (a VLM's vision tower and language model)."""
    from transformers import AutoConfig

    try:
        values = AutoConfig.for_model(model_type).to_dict()
    except Exception:  # noqa: BLE001 - a config that cannot be built from its defaults has no sub-configs to read
        return []
    return [v["model_type"] for v in values.values() if isinstance(v, dict) and v.get("model_type")]


def has_attention(model_type: str) -> bool:
    """Whether the family computes softmax attention: its modeling code calls the attention interface or a
    softmax of its own (attention that bypasses the interface, for attnviz to read or refuse), or a sub-model does
    (a vision-language model built from a vision tower and a language model of other families)."""
    source = _modeling_source(model_type)
    if model_type in EAGER_ONLY or uses_attention_interface(model_type) or "softmax(" in source:
        return True
    return any(sub != model_type and has_attention(sub) for sub in _sub_types(model_type))


@cache
def discover_vision() -> dict[str, tuple[str, str]]:
    """``{"kind:model_type": (model_type, class name)}`` of every family with attention in :data:`VISION_MAPPINGS`."""
    from transformers.models.auto import modeling_auto

    found: dict[str, tuple[str, str]] = {}
    for mapping, kind in VISION_MAPPINGS.items():
        for model_type, names in getattr(modeling_auto, mapping).items():
            if has_attention(model_type):
                found[f"{kind}:{model_type}"] = (model_type, names if isinstance(names, str) else names[0])
    return dict(sorted(found.items()))


def tiny_image_processor(model_type: str):
    """The family's Pillow image processor from its defaults, its picture sizes shrunk to 32 pixels."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(IMAGE_PROCESSOR_OF.get(model_type, model_type))
    if not names:
        raise LookupError(f"transformers names no image processor for {model_type}")
    if "pil" not in names:
        raise LookupError(f"{model_type}'s image processor needs torchvision (it has no Pillow version)")
    processor_class = getattr(transformers, names["pil"])
    defaults = processor_class()
    shrunk: dict[str, Any] = {}
    for field in PICTURE_FIELDS:
        size = getattr(defaults, field, None)
        values = dict(size) if isinstance(size, dict) else dict(getattr(size, "__dict__", {}))
        if values:
            shrunk[field] = {k: IMAGE_SIZE if k in PICTURE_KEYS else v for k, v in values.items() if v is not None}
    # the processor's own counts of patches and image tokens (PaliGemma's image_seq_length), where it has them
    shrunk |= {k: VISION_SIZES[k] for k in ("patch_size", "image_seq_length") if hasattr(defaults, k)}
    shrunk |= IMAGE_PROCESSOR_OVERRIDES.get(model_type, {})
    processor = processor_class(**shrunk)
    return processor


def tiny_processor(model_type: str, config, image_processor):
    """The family's processor: its image processor, a tiny byte-level tokenizer with the processor's own special
    tokens added, and the arguments its constructor shares with the config (patch size, feature strategy, …).
    The config's token ids are set to the tokenizer's ids of those tokens."""
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    processor_class = getattr(transformers, PROCESSOR_MAPPING_NAMES[model_type])
    shared: dict[str, Any] = {}
    if "video_processor" in processor_class.get_attributes():  # pictures only: its video part needs torchvision
        processor_class, shared = pictures_only(processor_class), {"video_processor": None}
    for name in inspect.signature(processor_class.__init__).parameters:
        for where in (config, getattr(config, "vision_config", None)):
            if name not in shared and name not in ("image_processor", "tokenizer") and hasattr(where, name):
                shared[name] = getattr(where, name)
    shared |= PROCESSOR_OVERRIDES.get(model_type, {})
    # the tokens the processor reads from its tokenizer (``tokenizer.image_token``): added one by one, as it asks
    extra: dict[str, str] = {}
    for _ in range(8):
        tokenizer = _tiny_tokenizer(extra)
        try:
            processor = processor_class(image_processor=image_processor, tokenizer=tokenizer, **shared)
            break
        except (AttributeError, ValueError) as exc:
            asked = re.search(r"attribute '?(\w+_token)(?:_id)?\b", str(exc))
            if asked is None or asked.group(1) in extra:
                raise
            extra[asked.group(1)] = f"<{asked.group(1)}>"
    tokens = {k: v for k, v in vars(processor).items() if k.endswith("_token") and isinstance(v, str)}
    tokenizer.add_special_tokens({"additional_special_tokens": sorted(set(tokens.values()) - set(extra.values()))})
    processor = processor_class(image_processor=image_processor, tokenizer=tokenizer, **shared)
    # the tokenizer's named tokens are the model's (Gemma 3's processor calls its begin-of-image token image_token)
    for name, token in {**tokens, **extra}.items():
        for field in (f"{name}_id", f"{name}_index"):
            if hasattr(config, field):
                setattr(config, field, tokenizer.convert_tokens_to_ids(token))
    return processor


def _tiny_tokenizer(extra: dict[str, str]):
    """The tiny byte-level tokenizer (:func:`tiny_vision.tiny_caption_tokenizer`) with a pad token and the named
    special tokens ``extra`` (``{"image_token": "<image_token>"}``)."""
    import transformers
    from tiny_vision import tiny_caption_tokenizer

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tiny_caption_tokenizer()._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
        pad_token="<pad>", extra_special_tokens=extra,
    )  # fmt: skip


def build_vision(name: str, path: Path) -> Path:
    """Save a seeded tiny model of the vision family ``name`` (``kind:model_type``) with its image processor (a
    vision-language model: with its processor) into ``path`` and return ``path``."""
    model_type, class_name = discover_vision()[name]
    model_class, config = tiny_config(model_type, class_name, VISION_SIZES)
    image_processor = tiny_image_processor(model_type)
    if name.startswith("image-text:"):
        processor = tiny_processor(model_type, config, image_processor)
        processor.save_pretrained(path)
    else:
        image_processor.save_pretrained(path)
    torch.manual_seed(0)
    model = model_class._from_config(config, attn_implementation="eager")
    model.save_pretrained(path)
    return path
