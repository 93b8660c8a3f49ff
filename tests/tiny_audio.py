"""A tiny random Whisper saved as a Hugging Face directory (config, weights, feature extractor, tokenizer), and a
planted wav file: what a user downloads and records, built here offline in a moment."""

from __future__ import annotations

import json
import math
import wave
from pathlib import Path

import torch
from tiny_vision import _CAPTION_TEXT

#: Whisper's special tokens the tiny tokenizer adds after its byte-level BPE vocabulary
SPECIALS = ("<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")


def tiny_whisper_tokenizer():
    """A ``WhisperTokenizer`` over a byte-level BPE vocabulary of a few hundred tokens trained here, offline."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator([_CAPTION_TEXT] * 4, vocab_size=300, special_tokens=[SPECIALS[0]])
    model = json.loads(trainer._tokenizer.to_str())["model"]
    tokenizer = transformers.WhisperTokenizer(
        vocab=model["vocab"],
        merges=[tuple(pair) if isinstance(pair, list) else tuple(pair.split(" ")) for pair in model["merges"]],
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIALS[1:])})
    return tokenizer


def build_tiny_whisper(path: Path, *, seed: int = 0) -> Path:
    """Save a seeded random tiny ``WhisperForConditionalGeneration`` (2 + 2 layers of 4 heads, width 32, peaked
    weights) with the default ``WhisperFeatureExtractor`` (80 mel bins, 30 s at 16 kHz: 1500 encoder frames)."""
    import transformers

    tokenizer = tiny_whisper_tokenizer()
    start, end = (tokenizer.convert_tokens_to_ids(token) for token in ("<|startoftranscript|>", "<|endoftext|>"))
    config = transformers.WhisperConfig(
        vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=80,
        max_source_positions=1500, max_target_positions=32, pad_token_id=end, bos_token_id=end, eos_token_id=end,
        decoder_start_token_id=start, init_std=0.2,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    model.generation_config.decoder_start_token_id = start
    model.generation_config.eos_token_id = end
    processor = transformers.WhisperProcessor(transformers.WhisperFeatureExtractor(), tokenizer)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def write_wav(path: Path, *, seconds: float = 1.0, rate: int = 8000, channels: int = 1, burst=(0.3, 0.6)) -> Path:
    """A 16-bit PCM wav file: silence with a 440 Hz sine burst from ``burst[0]`` to ``burst[1]`` seconds."""
    frames = bytearray()
    for index in range(int(seconds * rate)):
        time = index / rate
        value = int(20000 * math.sin(2 * math.pi * 440 * time)) if burst[0] <= time < burst[1] else 0
        frames += value.to_bytes(2, "little", signed=True) * channels
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(channels)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes(bytes(frames))
    return path
