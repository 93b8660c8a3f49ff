"""Capturing Whisper's attention on audio: on a given transcript (teacher forcing) or while it writes one.

The capture's source side is time: ``tokens`` are the encoder's time frames labelled by their start (``0.42s``,
20 ms apart), the frames covering the audio only unless ``all_frames`` (:mod:`attnviz.models.audio`); its target
side is the decoder prefix then the transcript. Stacks: ``encoder`` ``[head, frame, frame]``, ``decoder``
``[head, token, token]``, ``cross`` ``[head, token, frame]``: the captioning view, with time instead of patches.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnviz.captures.captioning import keep_recorded, write_target
from attnviz.captures.generation import Decoding, Generation
from attnviz.captures.recording import capture_encoded
from attnviz.captures.result import AttentionCapture
from attnviz.common.audio import AudioSource, as_waveform
from attnviz.common.errors import InputError
from attnviz.common.lazy import lazy_exports
from attnviz.models.audio import AudioModel
from attnviz.models.base import LoadedModel

#: tokens Whisper writes at most when no transcript is given (its decoder's positions may stop it sooner)
DEFAULT_WRITTEN_TOKENS = 48


def audio_model_of(loaded: LoadedModel) -> AudioModel:
    """``loaded`` itself when it reads audio; a one-line error otherwise."""
    if isinstance(loaded, AudioModel):
        return loaded
    kind = "a vision model" if loaded.modality == "image" else "a text model"
    raise InputError(f"{loaded.name} is {kind}: audio needs an audio model (Whisper)")


def capture_audio(
    loaded: LoadedModel,
    sources: Sequence[AudioSource],
    *,
    targets: Sequence[str] | None = None,
    all_frames: bool = False,
    truncate: bool = True,
    **recording: Any,
) -> list[AttentionCapture]:
    """One capture per audio source (a ``.wav`` path or a waveform at the model's rate): on each transcript of
    ``targets`` (teacher-forced), else on what the model writes (greedy, at most :data:`DEFAULT_WRITTEN_TOKENS`
    tokens; ``generated_from`` says where its writing starts). ``recording``: ``layers``, ``heads``, ``stacks``,
    ``max_bytes``, ``weighting``, as :func:`~attnviz.captures.recording.capture_encoded` takes them (a written
    transcript records every layer and head, then keeps the chosen ones)."""
    audio = audio_model_of(loaded)
    for source in sources:
        if isinstance(source, str) and not Path(source).suffix and not Path(source).exists():
            audio.encode([source])  # a text, not a file name: refused saying what the model reads
    waveforms = [as_waveform(source, audio.sampling_rate) for source in sources]  # all read before the model runs
    if targets is not None:
        batch = audio.encode_audio(waveforms, targets=targets, all_frames=all_frames, truncate=truncate)
        return capture_encoded(audio, batch, **recording)
    if recording.get("weighting", "weights") != "weights":
        raise InputError("norm weighting applies to a given transcript: give it as the target")
    chosen: dict[str, Any] = {key: recording.get(key) for key in ("layers", "heads", "stacks")}
    chosen |= {"all_frames": all_frames, "truncate": truncate}
    return [
        write_transcript(audio, waveform, Decoding(DEFAULT_WRITTEN_TOKENS), **chosen).capture for waveform in waveforms
    ]


def write_transcript(
    loaded: LoadedModel,
    audio: AudioSource,
    decoding: Decoding,
    *,
    all_frames: bool = False,
    truncate: bool = True,
    **chosen: Any,
) -> Generation:
    """Let Whisper write about ``audio`` as ``decoding`` says, capturing every step: a
    :class:`~attnviz.captures.generation.Generation` with the text it wrote (:func:`attnviz.generate` is the public
    call). ``chosen``: ``layers``/``heads``/``stacks``, kept afterwards; ``all_frames``/``truncate``: as
    :meth:`~attnviz.models.audio.AudioModel.encode_audio` takes them."""
    model = audio_model_of(loaded)
    waveform = as_waveform(audio, model.sampling_rate)
    batch = model.encode_audio([waveform], all_frames=all_frames, truncate=truncate)
    generation = write_target(model, batch, decoding)
    if any(value is not None for value in chosen.values()):
        generation.capture = keep_recorded(generation.capture, model, **chosen)
    return generation


#: the old name of :func:`attnviz.generate` on audio: it still works for one release, warning at each use
__getattr__ = lazy_exports(
    __name__,
    {},
    {
        "transcribe_capture": (
            "attnviz.captures.writing",
            "generate",
            "attnviz.generate(model, audio, max_new_tokens=N)",
        )
    },
)[0]
