"""Tiny random vision transformers saved as Hugging Face directories (config, image processor, weights).

Next to :mod:`tiny_models` (the text families): one configuration per vision family, every
model 2 layers × 4 heads on 32×32 images cut into 8×8 patches (a 4×4 grid), its image
processor saved with ``save_pretrained`` too, so the directory is what a user downloads.
``sharp`` weights (initializer range ×10) make heads focus, so overlays have a clear peak.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VISION_FAMILIES = ("vit", "deit", "dinov2", "dinov2_registers", "clip", "siglip")
IMAGE_SIZE = 32
PATCH = 8
GRID = IMAGE_SIZE // PATCH
#: extra tokens each family puts before the patches
EXTRA_KINDS = {
    "vit": ["cls"],
    "deit": ["cls", "distillation"],
    "dinov2": ["cls"],
    "dinov2_registers": ["cls", "register", "register"],
    "clip": ["cls"],
    "siglip": [],
}


def tiny_vision_config(family: str):
    """``(model class, config, image processor)`` of a tiny ``family`` vision model."""
    import transformers

    common = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
        "num_channels": 3,
        "initializer_range": 0.2,
    }
    size = {"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    if family == "vit":
        config = transformers.ViTConfig(**common, num_labels=3)
        return transformers.ViTForImageClassification, config, transformers.ViTImageProcessor(size=size)
    if family == "deit":
        config = transformers.DeiTConfig(**common, num_labels=3)
        processor = transformers.DeiTImageProcessor(size=size, crop_size=size)
        return transformers.DeiTForImageClassificationWithTeacher, config, processor
    if family in ("dinov2", "dinov2_registers"):
        common = {**common, "mlp_ratio": 2}
        common.pop("intermediate_size")
        if family == "dinov2":
            config = transformers.Dinov2Config(**common)
            model_class = transformers.Dinov2Model
        else:
            config = transformers.Dinov2WithRegistersConfig(**common, num_register_tokens=2)
            model_class = transformers.Dinov2WithRegistersModel
        processor = transformers.BitImageProcessor(
            size={"shortest_edge": IMAGE_SIZE},
            crop_size=size,
            image_mean=[0.485, 0.456, 0.406],
            image_std=[0.229, 0.224, 0.225],
        )
        return model_class, config, processor
    if family == "clip":
        common.pop("initializer_range")
        config = transformers.CLIPVisionConfig(**common, initializer_factor=10.0)
        processor = transformers.CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE}, crop_size=size)
        return transformers.CLIPVisionModel, config, processor
    if family == "siglip":
        common.pop("initializer_range")
        config = transformers.SiglipVisionConfig(**common)
        return transformers.SiglipVisionModel, config, transformers.SiglipImageProcessor(size=size)
    raise ValueError(f"unknown vision family {family!r}")


def build_tiny_vision_model(family: str, path: Path, *, seed: int = 0) -> Path:
    """Save a seeded random tiny ``family`` model and its image processor into ``path``."""
    model_class, config, processor = tiny_vision_config(family)
    torch.manual_seed(seed)
    model = model_class(config)
    if family == "siglip":  # SigLIP initialises its attention from a fixed small spread: sharpen it by hand
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name.endswith(("q_proj.weight", "k_proj.weight")):
                    parameter.mul_(6.0)
    model.eval()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def sample_images(count: int, *, seed: int = 0, size: int = IMAGE_SIZE * 2):
    """``count`` seeded random RGB PIL images of ``size``×``size`` pixels (blocks of colour, not noise)."""
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    images = []
    for _ in range(count):
        blocks = torch.randint(0, 256, (4, 4, 3), generator=generator, dtype=torch.uint8)  # [4, 4, rgb]
        pixels = blocks.repeat_interleave(size // 4, 0).repeat_interleave(size // 4, 1)  # [size, size, rgb]
        images.append(Image.fromarray(pixels.numpy(), "RGB"))
    return images


#: the image classifier of each family that has one (the towers of CLIP and SigLIP are left out)
CLASSIFIERS = {
    "vit": "ViTForImageClassification",
    "deit": "DeiTForImageClassificationWithTeacher",
    "dinov2": "Dinov2ForImageClassification",
    "dinov2_registers": "Dinov2WithRegistersForImageClassification",
}


def build_tiny_classifier(family: str, path: Path, *, seed: int = 0, num_labels: int = 5) -> Path:
    """Save a seeded random tiny image classifier of ``family`` (``num_labels`` classes) and its image processor."""
    import transformers

    _, config, processor = tiny_vision_config(family)
    config.num_labels = num_labels
    torch.manual_seed(seed)
    model = getattr(transformers, CLASSIFIERS[family])(config)
    model.eval()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


#: the text the tiny captioners' byte-level BPE tokenizer is trained on
_CAPTION_TEXT = (
    "a cat sits on a red mat. two dogs run in the green park. a blue car by the yellow house. "
    "the bird flies over the sea. une tête à Zürich. 猫が座る。"
)


def tiny_caption_tokenizer():
    """A GPT-2-style byte-level BPE tokenizer (a few hundred tokens) trained here, offline, in a moment."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator([_CAPTION_TEXT] * 4, vocab_size=300, special_tokens=["<|endoftext|>"])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=trainer._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )


def build_tiny_captioner(
    path: Path, *, encoder: str = "vit", decoder: str = "gpt2", pooler: bool = False, positions: int = 24, seed: int = 0
) -> Path:
    """Save a seeded random tiny ``VisionEncoderDecoderModel`` (``encoder`` vit/deit, ``decoder`` gpt2/bert, with
    cross-attention; decoder width 48 so a projection joins it to the 32-wide encoder), its image processor and a
    byte-level BPE tokenizer. ``pooler``: whether the encoder has (and saves) a pooler."""
    import transformers

    _, encoder_config, processor = tiny_vision_config(encoder)
    tokenizer = tiny_caption_tokenizer()
    torch.manual_seed(seed)
    encoder_class = {"vit": transformers.ViTModel, "deit": transformers.DeiTModel}[encoder]
    image_encoder = encoder_class(encoder_config, add_pooling_layer=pooler)
    ends = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    common = {"initializer_range": 0.2, "vocab_size": len(tokenizer), "is_decoder": True, "add_cross_attention": True}
    common |= ends
    if decoder == "gpt2":
        config = transformers.GPT2Config(n_embd=48, n_layer=2, n_head=4, n_positions=positions, **common)
        text_decoder = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.BertConfig(
            hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=positions, **common,
        )  # fmt: skip
        text_decoder = transformers.BertLMHeadModel(config)
    model = transformers.VisionEncoderDecoderModel(encoder=image_encoder, decoder=text_decoder)
    model.config.decoder_start_token_id = tokenizer.bos_token_id
    model.config.pad_token_id = tokenizer.eos_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    model.eval()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
