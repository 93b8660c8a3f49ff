"""Audio as attnviz input: reading a wav file, bringing it to a model's sampling rate, naming its time frames.

An audio source is a path to a ``.wav`` file or a waveform already at the model's sampling rate (a 1-D float numpy
array or tensor, values in -1…1). A wav file is read with Python's own ``wave`` module: PCM samples of 8, 16, 24 or
32 bits, mono or several channels (averaged into one). A file recorded at another rate is resampled by **linear
interpolation** between neighbouring samples (``torch.nn.functional.interpolate``, ``mode="linear"``): simple and
dependency-free, with no low-pass filter, so a recording with energy above the target's Nyquist frequency (8 kHz for
16 kHz) keeps a little aliasing; resample with a dedicated tool beforehand where that matters.
"""

from __future__ import annotations

import os
import wave
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnviz.common.errors import InputError, reason

#: what attnviz reads as audio: a ``.wav`` path, or a waveform ``[samples]`` at the model's sampling rate
AudioSource = str | os.PathLike | np.ndarray | Tensor
#: file suffixes read as audio
AUDIO_SUFFIXES = (".wav", ".wave")


def is_audio_source(value: Any) -> bool:
    """Whether ``value`` looks like audio: a path ending in ``.wav``, or a one-dimensional array or tensor."""
    if isinstance(value, (np.ndarray, Tensor)):
        return value.ndim == 1
    return isinstance(value, (str, os.PathLike)) and Path(value).suffix.lower() in AUDIO_SUFFIXES


def read_wav(path: str | os.PathLike) -> tuple[Tensor, int]:
    """``(samples [n] float32 in -1…1, sampling rate)`` of a PCM wav file, its channels averaged."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise InputError(f"audio file {str(path)!r} does not exist" if not file.exists() else f"{path} is not a file")
    try:
        with wave.open(str(file), "rb") as handle:
            channels, width, rate = handle.getnchannels(), handle.getsampwidth(), handle.getframerate()
            data = handle.readframes(handle.getnframes())
    except (wave.Error, EOFError) as exc:
        why = "it ends before its header does" if isinstance(exc, EOFError) else reason(exc)
        raise InputError(
            f"{path} is not a PCM wav file attnviz can read ({why}): give a .wav file of 8-, 16-, 24- or 32-bit PCM samples"
        ) from exc
    except OSError as exc:
        raise InputError(f"cannot read audio file {path}: {reason(exc)}") from exc
    if width not in (1, 2, 3, 4) or channels < 1 or rate < 1:
        raise InputError(f"{path}: {8 * width}-bit samples are not PCM audio attnviz reads (8, 16, 24 or 32 bits)")
    raw = np.frombuffer(data, dtype=np.uint8)
    usable = len(raw) - len(raw) % (width * channels)
    raw = raw[:usable].reshape(-1, width)  # [n·channels, bytes], little-endian
    if width == 1:  # 8-bit wav is unsigned
        values = raw[:, 0].astype(np.float32) - 128.0
    else:
        padded = np.zeros((len(raw), 4), dtype=np.uint8)
        padded[:, 4 - width :] = raw  # the sample in the high bytes of an int32
        values = padded.view("<i4")[:, 0].astype(np.float32) / float(1 << (8 * (4 - width)))
    scale = float(1 << (8 * width - 1))
    samples = values.reshape(-1, channels).mean(axis=1) / scale  # [n]
    if not len(samples):
        raise InputError(f"{path} holds no audio samples")
    return torch.from_numpy(np.ascontiguousarray(samples)), rate


def resample(samples: Tensor, rate: int, target: int) -> Tensor:
    """``samples`` ``[n]`` at ``rate`` brought to ``target`` Hz by linear interpolation (see the module docstring)."""
    if rate == target:
        return samples
    length = max(1, round(len(samples) * target / rate))
    return torch.nn.functional.interpolate(samples[None, None], size=length, mode="linear", align_corners=False)[0, 0]


def as_waveform(source: AudioSource, rate: int) -> Tensor:
    """``[samples]`` float32 at ``rate`` Hz: a wav file read and resampled, or a waveform given at that rate."""
    if isinstance(source, (np.ndarray, Tensor)):
        samples = torch.as_tensor(np.asarray(source) if isinstance(source, np.ndarray) else source.detach().cpu())
        if samples.ndim != 1 or not len(samples) or not samples.is_floating_point():
            raise InputError(
                f"a waveform is a non-empty one-dimensional float array of samples at {rate} Hz, got shape "
                f"{tuple(samples.shape)} ({samples.dtype})"
            )
        if not bool(torch.isfinite(samples).all()):
            raise InputError("the waveform holds NaN or infinite samples")
        return samples.to(torch.float32)
    if not isinstance(source, (str, os.PathLike)):
        raise InputError(f"audio is a .wav file path or a waveform array, not a {type(source).__name__}")
    samples, file_rate = read_wav(source)
    return resample(samples, file_rate, rate)


def time_label(seconds: float) -> str:
    """``0.42s``: the start of a time frame, to the hundredth of a second."""
    return f"{seconds:.2f}s"


def is_time_label(label: str) -> bool:
    """Whether ``label`` is a :func:`time_label` (a key that is a time frame, not a token)."""
    return label.endswith("s") and label[:-1].replace(".", "", 1).isdigit() and "." in label
