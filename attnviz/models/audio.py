"""Whisper on attnviz's attention core: audio in, text out.

A Whisper directory holds the model and its processor (``preprocessor_config.json``: the feature extractor that turns
a waveform into log-mel frames; and the tokenizer). attnviz sees Whisper as an encoder-decoder model whose source
side is time: stack ``encoder`` is the self-attention over the encoder's time frames, ``decoder`` the transcript's
causal self-attention, ``cross`` each transcript token's attention over the time frames. Whisper's encoder always
reads a 30 s window (the feature extractor pads the audio with silence): 3000 log-mel frames, halved by its
strided convolution into 1500 encoder frames of 20 ms, labelled by their start time (``0.42s``).

**Frames kept.** The model runs on the whole padded window, so every weight is the model's own; by default a capture
keeps only the frames that cover the audio (a 2 s clip: 100 frames), so its rows over the time frames sum to the
weight they give the audio, less than 1: the rest went to the padding after it. ``all_frames=True`` keeps all 1500
(rows sum to 1; 1500² weights per encoder head).

**The decoder side** starts with the tokenizer's prefix tokens (``<|startoftranscript|>``, the language and task
where the tokenizer was given them with ``tokenizer.set_prefix_tokens(language=..., task=...)``, and
``<|notimestamps|>``), then the transcript's tokens (teacher forcing), or what the model writes.

Other audio families (Speech2Text, wav2vec 2.0, HuBERT, …) are refused with their reason when they load.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnviz.common.audio import time_label
from attnviz.common.errors import InputError, ModelSpecError, UnsupportedModelError
from attnviz.common.progress import warn
from attnviz.core import CONTEXT_KWARG, AttentionContext
from attnviz.models.audio_families import AUDIO_FAMILIES, reads_audio  # noqa: F401  # re-exported
from attnviz.models.base import EncodedBatch
from attnviz.models.decoder_side import WritesText, decoder_positions
from attnviz.models.hf import HFModel, load_hf_model


def load_audio_model(source: str | os.PathLike, **options: Any) -> AudioModel:
    """Load an audio model directory (Whisper) and its processor onto the attention core: the
    :mod:`attnviz.models.specs` loader of its format (``options``: as :func:`~attnviz.models.hf.load_hf_model`)."""
    return load_hf_model(source, kind=AudioModel, load_tokenizer=load_audio_processor, **options)  # type: ignore[return-value]


def load_audio_processor(source: str) -> Any:
    """The processor saved with an audio model: its feature extractor and tokenizer (one clear line when missing)."""
    from transformers import AutoProcessor

    from attnviz.models.hf_checks import first_line

    try:
        processor = AutoProcessor.from_pretrained(source, trust_remote_code=False, local_files_only=True)
    except Exception as exc:  # any failure means the same thing to the user
        raise ModelSpecError(
            f"cannot load the processor of audio model {source!r}: {first_line(exc)} (save it into the model "
            "directory with WhisperProcessor.save_pretrained(directory))"
        ) from exc
    check_audio_processor(processor, source)
    return processor


def check_audio_processor(processor: Any, name: str) -> None:
    """Refuse anything but a processor with a feature extractor and a tokenizer (a WhisperProcessor)."""
    if getattr(processor, "feature_extractor", None) is None or getattr(processor, "tokenizer", None) is None:
        given = "none was given or saved with it" if processor is None else f"not a {type(processor).__name__}"
        raise InputError(
            f"{name} reads audio: it needs its processor (a WhisperProcessor: feature extractor and tokenizer), "
            f"{given}; call attnviz.wrap(model, processor)"
        )


class AudioModel(HFModel, WritesText):
    """Whisper: reads audio (a waveform's log-mel frames), writes (or is given) a transcript; see the module
    docstring. Stacks encoder (time frames), decoder (transcript), cross (transcript tokens × time frames)."""

    modality: Literal["text", "image", "audio"] = "audio"
    text_name = "transcript"
    source_name = "audio"

    def __init__(self, model: nn.Module, processor: Any, *, name: str, fallback: bool = False):
        check_audio_processor(processor, name)
        super().__init__(model, processor.tokenizer, name=name, fallback=fallback)
        self.processor = processor
        self.feature_extractor = processor.feature_extractor
        #: decoder positions (prefix + transcript)
        self.max_length = decoder_positions(model.config)

    def with_model(self, model: nn.Module) -> AudioModel:
        return AudioModel(model, self.processor, name=self.name, fallback=self.fallback)

    # -- time ---------------------------------------------------------------------------------------

    @property
    def sampling_rate(self) -> int:
        """Samples per second the feature extractor reads (16 kHz for Whisper)."""
        return int(self.feature_extractor.sampling_rate)

    @property
    def frame_seconds(self) -> float:
        """Seconds per encoder frame: the feature extractor's hop, times the encoder convolution's stride."""
        encoder = self.model.get_encoder()
        stride = int(getattr(getattr(encoder, "conv2", None), "stride", (2,))[0])
        return self.feature_extractor.hop_length * stride / self.sampling_rate

    def audio_frames(self, samples: int) -> int:
        """Encoder frames that cover ``samples`` samples of audio (at least one)."""
        return max(1, math.ceil(samples / (self.frame_seconds * self.sampling_rate)))

    # -- encoding -------------------------------------------------------------------------------------

    def decoder_prefix(self) -> list[int]:
        """The tokenizer's prefix tokens (``<|startoftranscript|>``, language, task, ``<|notimestamps|>``)."""
        prefix = list(getattr(self.tokenizer, "prefix_tokens", None) or [])
        return prefix or [self.start_id]

    def encode(self, texts: Sequence[str], **options: Any) -> EncodedBatch:
        raise InputError(
            f"{self.name} reads audio: give it a .wav file (--audio FILE.wav) or a waveform, not text "
            "(its transcript goes in --target)"
        )

    def token_counts(self, texts: Sequence[str], *, max_length: int | None = None) -> list[int]:
        self.encode(texts)  # refuses text
        return []

    def encode_audio(
        self,
        waveforms: Sequence[Tensor],
        *,
        targets: Sequence[str] | None = None,
        token_ids: Sequence[Sequence[int]] | None = None,
        all_frames: bool = False,
        truncate: bool = True,
    ) -> EncodedBatch:
        """``waveforms`` (each ``[samples]`` float32 at :attr:`sampling_rate`) as log-mel features, one time frame
        per encoder position (the frames covering the audio, or ``all_frames``), with the decoder side (the prefix,
        then each transcript's tokens from ``targets`` or ``token_ids``). Audio longer than the window is cut to it
        with a warning (``truncate``) or refused."""
        waveforms = list(waveforms)
        if not waveforms:
            raise InputError("no audio given")
        window = int(self.feature_extractor.n_samples)  # samples of one window (30 s)
        longest = max(len(samples) for samples in waveforms)
        if longest > window:
            message = (
                f"the audio is {longest / self.sampling_rate:.1f} s long, but {self.name} reads "
                f"{window / self.sampling_rate:.0f} s at a time"
            )
            if not truncate:
                raise InputError(f"{message}: cut it into pieces of at most that length")
            warn(f"{message}: only the first {window / self.sampling_rate:.0f} s are read")
        features = self.feature_extractor(
            [samples.numpy() for samples in waveforms], sampling_rate=self.sampling_rate, return_tensors="pt"
        )["input_features"]  # [b, mel, frames]: the window's log-mel frames
        positions = int(getattr(self.model.config, "max_source_positions", features.shape[-1] // 2))
        kept = [positions if all_frames else min(positions, self.audio_frames(len(s))) for s in waveforms]
        labels = [time_label(index * self.frame_seconds) for index in range(max(kept))]
        dtype = next(self.model.parameters()).dtype
        batch = EncodedBatch(
            inputs={"input_features": features.to(self.device, dtype)},
            tokens=[labels[:count] for count in kept],
            special=[[False] * count for count in kept],
            word_ids=[list(range(count)) for count in kept],
            truncated=[len(samples) > window for samples in waveforms],
        )
        return self.add_decoder_side(batch, targets, token_ids)

    def probe_batch(self) -> EncodedBatch:
        """A tenth of a second of silence, with the decoder prefix."""
        return self.encode_audio([torch.zeros(self.sampling_rate // 10)])

    # -- running --------------------------------------------------------------------------------------

    def forward(self, batch: EncodedBatch, context: AttentionContext | None = None, *, logits: bool = False):
        if "input_features" not in batch.inputs:
            self.encode([])  # a text batch: refused
        return super().forward(batch, context, logits=logits)

    def encode_source(self, batch: EncodedBatch, context: AttentionContext) -> Any:
        """The encoder's output on ``batch``'s log-mel features."""
        return self.model.get_encoder()(input_features=batch.inputs["input_features"], **{CONTEXT_KWARG: context})

    def check_patching(self) -> None:
        raise UnsupportedModelError(
            f"{self.name} reads audio: patching runs two text prompts through the model (its heads' outputs can "
            "still be weighed by norm)"
        )
