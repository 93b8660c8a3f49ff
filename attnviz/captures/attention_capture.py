"""Capturing attention patterns: :func:`capture` runs a model on a text, texts, an image or images (a captioner's
with its caption) and returns one :class:`~attnviz.captures.result.AttentionCapture` per input, padding trimmed.

``capture`` decides by the model and the input: a text model reads texts (:func:`capture_batch`), a vision model
or captioner reads images (:func:`attnviz.captures.images.capture_images`). Each records only the layers, heads
and stacks asked for, refuses a capture over ``max_bytes`` before the model runs, and records the softmax weights
or norm-based attention (:func:`~attnviz.captures.recording.capture_encoded`, which runs a batch already encoded).
:class:`AttentionCapture` and its file format live in :mod:`attnviz.captures.result` (importable from here too).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

from attnviz.captures.recording import capture_encoded, captures_from_patterns
from attnviz.captures.result import AttentionCapture
from attnviz.common.errors import ParameterError
from attnviz.common.selection import HeadSelection, LayerSelection
from attnviz.common.wording import plural
from attnviz.core.choices import Weighting
from attnviz.core.recorder import PatternRecorder
from attnviz.models.base import LoadedModel
from attnviz.models.vision import vision_model_of

__all__ = [
    "AttentionCapture",
    "PatternRecorder",
    "capture",
    "capture_batch",
    "capture_encoded",
    "captures_from_patterns",
]


@overload
def capture(loaded: LoadedModel, x: list[Any] | tuple[Any, ...], **options: Any) -> list[AttentionCapture]: ...
@overload
def capture(loaded: LoadedModel, x: Any, **options: Any) -> AttentionCapture: ...
def capture(  # type: ignore[misc]  # the overloads take the options below as **options
    loaded: LoadedModel,
    x: Any,
    *,
    target: str | Sequence[str] | None = None,
    max_length: int | None = None,
    truncate: bool = True,
    layers: LayerSelection = None,
    heads: HeadSelection = None,
    stacks: Sequence[str] | None = None,
    max_bytes: int | None = None,
    weighting: Weighting = "weights",
    image: Any = None,
    all_frames: bool = False,
) -> AttentionCapture | list[AttentionCapture]:
    """Capture the attention patterns of ``loaded`` on ``x``: every one by default.

    ``x``: for a text model, a text (one :class:`AttentionCapture`) or a list of texts (a list of them); for a
    vision model or an image captioner, an image (a file path, the file's bytes, a PIL image or an ``[H, W, 3]``
    array) or a list of images. ``target``: the decoder text of an encoder-decoder model, or the caption of a
    captioner's image (teacher-forced), one per input for a list. An image's capture holds the extra tokens and the
    patches ``r{row}c{col}`` (``capture.image_grid``) and the resized picture (``capture.extras["image"]``); a
    captioned image's holds the caption on the target side.

    ``layers`` (indices, negative from the end), ``heads`` (the model's head numbers) and, for encoder-decoder
    models, ``stacks``: record only those (None: all); ``max_bytes``: refuse, before the model runs, a capture
    larger than that; ``weighting="norm"``: norm-based attention ``α_ij·‖f_h(x_j)‖`` instead of the weights
    (:func:`~attnviz.captures.recording.capture_encoded`). ``max_length``/``truncate``: how texts are cut.

    Audio (Whisper, :mod:`attnviz.captures.audio`): ``x`` is a ``.wav`` path or a 1-D float waveform at the model's
    sampling rate (or a list of them), ``target`` its transcript (teacher-forced); without one, the model writes it
    (greedy). The source side is the encoder's time frames (``0.42s``), those covering the audio only unless
    ``all_frames`` (Whisper pads every input to 30 s; the weights are the model's own either way).

    ``image``: for a vision-language model, the picture inside the text ``x`` (one per text for a list of texts): the
    text names it with the processor's image token, or it goes before the text
    (:mod:`attnviz.captures.vision_language`); the capture's ``image_grid.start`` says where its tokens sit.
    """
    several = isinstance(x, (list, tuple))
    inputs = list(x) if several else [x]
    targets = _targets(target, len(inputs), several)
    recording: dict[str, Any] = {
        "layers": layers, "heads": heads, "stacks": stacks, "max_bytes": max_bytes, "weighting": weighting
    }  # fmt: skip
    if image is not None:  # a text with a picture in it: a vision-language model
        from attnviz.captures.vision_language import vision_language_batch

        pictures = list(image) if several else [image]
        if target is not None:
            raise ParameterError("target", "{target} is a decoder text: a vision-language model takes one text")
        if len(pictures) != len(inputs):
            raise ParameterError(
                "image", f"a list of {plural(len(inputs), 'text')} takes a list of {len(inputs)} {{image}}s"
            )
        captures = [
            capture_encoded(loaded, vision_language_batch(loaded, [text], [picture]), **recording)[0]
            for text, picture in zip(inputs, pictures)
        ]  # one batch per text: the pictures may sit at different places in their texts
    elif loaded.modality == "audio":  # Whisper: wav files or waveforms, with their transcripts or writing them
        from attnviz.captures.audio import capture_audio

        if max_length is not None:
            raise ParameterError("max_length", f"{loaded.name} reads audio: {{max_length}} applies to texts")
        captures = capture_audio(loaded, inputs, targets=targets, all_frames=all_frames, truncate=truncate, **recording)
    elif loaded.modality == "image" or (
        loaded.reads_pictures_in_text and not any(isinstance(item, str) for item in inputs)
    ):  # a vision model's images, or pictures alone for a vision-language model: its vision tower's attention
        from attnviz.captures.images import capture_images

        words = [item for item in inputs if isinstance(item, str) and not Path(item).suffix and not Path(item).exists()]
        if words:  # text, not a file name: refused with the vision model's own message
            loaded.encode(words)
        if max_length is not None:
            raise ParameterError("max_length", f"{loaded.name} reads images: {{max_length}} applies to texts")
        captures = capture_images(loaded, inputs, targets=targets, **recording)
    else:
        for text in inputs:
            if not isinstance(text, str):
                if not isinstance(text, (int, float)):  # an image, say: refused naming the models that read them
                    _refuse_for_text_model(loaded, text)
                raise TypeError(
                    f"{loaded.name} reads text: give a text or a list of texts, not a {type(text).__name__}"
                )
        captures = capture_batch(loaded, inputs, targets=targets, max_length=max_length, truncate=truncate, **recording)
    return captures if several else captures[0]


def _refuse_for_text_model(loaded: LoadedModel, value: Any) -> None:
    """Refuse audio or an image given to a text model, naming the models that read it."""
    from attnviz.common.audio import is_audio_source

    if is_audio_source(value):
        from attnviz.captures.audio import audio_model_of

        audio_model_of(loaded)
    vision_model_of(loaded)


def _targets(target: str | Sequence[str] | None, count: int, several: bool) -> list[str] | None:
    """One target per input (None: no target): ``target`` itself for one input, its items for a list of them."""
    if target is None:
        return None
    if not several:
        if not isinstance(target, str):
            raise TypeError(f"one input takes one target text, not a {type(target).__name__}")
        return [target]
    if isinstance(target, str) or len(target) != count:
        raise ParameterError("target", f"a list of {count} inputs takes a list of {count} target texts as {{target}}")
    return list(target)


def capture_batch(
    loaded: LoadedModel,
    texts: Sequence[str],
    *,
    targets: Sequence[str] | None = None,
    max_length: int | None = None,
    truncate: bool = True,
    **recording: Any,
) -> list[AttentionCapture]:
    """Run ``texts`` through ``loaded`` and return one capture per text (padding trimmed); ``recording``:
    ``layers``, ``heads``, ``stacks``, ``max_bytes``, ``weighting``, as :func:`capture` takes them."""
    batch = loaded.encode(texts, targets=targets, max_length=max_length, truncate=truncate)
    return capture_encoded(loaded, batch, **recording)
