"""Tiny random vision-language models saved as Hugging Face directories (config, weights, processor).

Each family is built from a tiny seeded config with peaked weights (so a wrong mask, scale or token order shows),
a byte-level BPE tokenizer trained here offline (:func:`tiny_vision.tiny_caption_tokenizer`) with the family's
image tokens added, the family's image processor from its defaults (32×32 or 56×56 pictures), and the family's
``Processor`` joining them; ``save_pretrained`` writes all of it, so the directory is what a user downloads.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_vision import tiny_caption_tokenizer

from attnviz.models.vlm_processor import pictures_only

VLM_FAMILIES = ("llava", "paligemma", "gemma3", "idefics3", "mllama", "qwen2_vl")
IMAGE_SIZE = 32
PATCH = 8


def _tokenizer(*extra: str):
    tokenizer = tiny_caption_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(extra)})
    return tokenizer


def _llama_text(vocab: int, **extra):
    import transformers

    return transformers.LlamaConfig(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
        vocab_size=vocab, initializer_range=0.2, max_position_embeddings=128, **extra,
    )  # fmt: skip


def _vision(kind: str):
    import transformers

    common = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
    common |= {"image_size": IMAGE_SIZE, "patch_size": PATCH}
    if kind == "clip":
        return transformers.CLIPVisionConfig(**common, initializer_factor=10.0)
    return transformers.SiglipVisionConfig(**common)


def tiny_vlm(family: str, *, strategy: str = "default"):
    """``(model, processor)`` of a tiny seeded ``family`` vision-language model (random, peaked weights)."""
    import transformers

    size = {"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    if family == "llava":
        tokenizer = _tokenizer("<image>")
        image_id = tokenizer.convert_tokens_to_ids("<image>")
        config = transformers.LlavaConfig(
            vision_config=_vision("clip"), text_config=_llama_text(len(tokenizer)), image_token_id=image_id,
            vision_feature_select_strategy=strategy, vision_feature_layer=-1,
        )  # fmt: skip
        image_processor = transformers.CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE}, crop_size=size)
        processor = transformers.LlavaProcessor(
            image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH,
            vision_feature_select_strategy=strategy, num_additional_image_tokens=1,
        )  # fmt: skip
        model_class = transformers.LlavaForConditionalGeneration
    elif family == "paligemma":
        tokenizer = _tokenizer("<image>")
        tokenizer.add_special_tokens({"pad_token": "<pad>"})
        image_id = tokenizer.convert_tokens_to_ids("<image>")
        image_processor = transformers.SiglipImageProcessor(size=size)
        image_processor.image_seq_length = (IMAGE_SIZE // PATCH) ** 2
        # the processor adds PaliGemma's location and segmentation tokens to the tokenizer: size the table after it
        processor = transformers.PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)
        text = transformers.GemmaConfig(
            hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
            intermediate_size=64, vocab_size=len(tokenizer), initializer_range=0.2, max_position_embeddings=128,
        )  # fmt: skip
        vision = _vision("siglip")
        config = transformers.PaliGemmaConfig(
            vision_config=vision, text_config=text, image_token_id=image_id, projection_dim=48
        )
        config.vision_config.num_image_tokens = (IMAGE_SIZE // PATCH) ** 2
        model_class = transformers.PaliGemmaForConditionalGeneration
    elif family == "qwen2_vl":
        tokens = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
        tokenizer = _tokenizer(*tokens)
        ids = {token: tokenizer.convert_tokens_to_ids(token) for token in tokens}
        text = transformers.Qwen2VLTextConfig(
            hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
            vocab_size=len(tokenizer), initializer_range=0.2, max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 2, 2], "rope_theta": 10000.0},
        )  # fmt: skip
        vision = transformers.models.qwen2_vl.configuration_qwen2_vl.Qwen2VLVisionConfig(
            depth=2, embed_dim=32, hidden_size=48, num_heads=4, mlp_ratio=2, patch_size=PATCH, spatial_merge_size=2,
            temporal_patch_size=2, initializer_range=0.2,
        )  # fmt: skip
        config = transformers.Qwen2VLConfig(
            text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
        )  # fmt: skip
        # pictures of 16×16 to 48×48 pixels keep their size, rounded to whole 16-pixel tokens (2×2 merged patches)
        image_processor = transformers.Qwen2VLImageProcessorPil(
            patch_size=PATCH, merge_size=2, temporal_patch_size=2,
            size={"shortest_edge": 16 * 16, "longest_edge": 48 * 48},
        )  # fmt: skip
        # without torchvision transformers cannot build its video processor: the processor for pictures only
        processor = pictures_only(transformers.Qwen2VLProcessor)(
            image_processor=image_processor, tokenizer=tokenizer, video_processor=None
        )
        model_class = transformers.Qwen2VLForConditionalGeneration
    elif family == "gemma3":
        base = tiny_caption_tokenizer()
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_object=base._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<pad>",
            extra_special_tokens={
                "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"
            },
        )  # fmt: skip
        image_processor = transformers.Gemma3ImageProcessor(size=size)
        # the tower's 4×4 patches are pooled onto 2×2 image tokens
        processor = transformers.Gemma3Processor(
            image_processor=image_processor, tokenizer=tokenizer, image_seq_length=4
        )
        text = transformers.Gemma3TextConfig(
            hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
            intermediate_size=64, vocab_size=len(tokenizer), initializer_range=0.2, max_position_embeddings=128,
            sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        )  # fmt: skip
        config = transformers.Gemma3Config(
            text_config=text, vision_config=_vision("siglip"), mm_tokens_per_image=4,
            image_token_id=tokenizer.image_token_id, boi_token_id=tokenizer.boi_token_id,
            eoi_token_id=tokenizer.convert_tokens_to_ids("<end_of_image>"),
        )  # fmt: skip
        model_class = transformers.Gemma3ForConditionalGeneration
    elif family == "idefics3":
        base = tiny_caption_tokenizer()
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_object=base._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<pad>",
            extra_special_tokens={
                "image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                "global_image_token": "<global-img>",
            },
        )  # fmt: skip
        # pictures up to 32 pixels stay whole (one tile); pixel shuffle merges 2×2 of the 4×4 patches: 2×2 tokens
        image_processor = transformers.Idefics3ImageProcessor(
            size={"longest_edge": IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE}
        )
        processor = transformers.Idefics3Processor(
            image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4
        )
        vision = transformers.Idefics3VisionConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=IMAGE_SIZE,
            patch_size=PATCH, initializer_range=0.2,
        )  # fmt: skip
        config = transformers.Idefics3Config(
            text_config=_llama_text(len(tokenizer)), vision_config=vision, scale_factor=2,
            image_token_id=tokenizer.image_token_id,
        )  # fmt: skip
        model_class = transformers.Idefics3ForConditionalGeneration
    elif family == "mllama":
        tokenizer = _tokenizer("<|image|>", "<|python_tag|>")
        # pictures are cut into up to 4 tiles of 16 pixels (the aspect ratio closest to the picture's), each tile
        # a 2×2 grid of 8-pixel patches after its class token; cross-attention layer 1 between self-attention 0 and 2
        image_processor = transformers.MllamaImageProcessorPil(size={"height": 16, "width": 16}, max_image_tiles=4)
        processor = transformers.MllamaProcessor(image_processor=image_processor, tokenizer=tokenizer)
        vision = transformers.MllamaVisionConfig(
            hidden_size=32, num_hidden_layers=2, num_global_layers=1, attention_heads=4, intermediate_size=64,
            image_size=16, patch_size=PATCH, max_num_tiles=4, intermediate_layers_indices=[0], vision_output_dim=64,
            initializer_range=0.2,
        )  # fmt: skip
        text = transformers.MllamaTextConfig(
            hidden_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
            vocab_size=len(tokenizer), initializer_range=0.2, max_position_embeddings=128, cross_attention_layers=[1],
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=None,
        )  # fmt: skip
        config = transformers.MllamaConfig(
            vision_config=vision, text_config=text, image_token_id=tokenizer.convert_tokens_to_ids("<|image|>")
        )
        model_class = transformers.MllamaForConditionalGeneration
    else:
        raise ValueError(f"unknown vision-language family {family!r}")
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():  # Mllama's gates start closed (tanh 0): open them, so the picture reaches the text
        for name, parameter in model.named_parameters():
            if name.endswith(("_gate", ".gate", "gate_attn", "gate_ffn")):
                parameter.fill_(0.8)
    return model, processor


def build_tiny_vlm(family: str, path: Path, **options) -> Path:
    """Save a tiny seeded ``family`` vision-language model and its processor into ``path``."""
    model, processor = tiny_vlm(family, **options)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def picture_shares(captures, layer: int) -> torch.Tensor:
    """``[head, every text query after a picture]``: each such query's weight on its picture's tokens, in ``layer``
    of each capture (a text with a picture), the captures side by side: the image share's hand computation."""
    shares = []
    for result in captures:
        grid = result.image_grid
        after = grid.start + grid.num_tokens
        shares.append(result.layer(layer)[:, after:, grid.start : after].sum(dim=-1))  # [head, text query]
    return torch.cat(shares, dim=1).double()
