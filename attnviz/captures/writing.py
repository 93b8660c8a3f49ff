"""Letting a model write while capturing: :func:`generate`, one call whatever the model reads.

The input and the model decide the path, as for :func:`~attnviz.captures.attention_capture.capture`:

* a text prompt for a causal LM or an encoder-decoder model (:func:`~attnviz.captures.generation.continue_text`);
* a text with its picture (``image=``) for a vision-language model (the same path, the picture read once);
* an image for an image captioner (:func:`~attnviz.captures.captioning.write_caption`);
* a ``.wav`` file or a waveform for Whisper (:func:`~attnviz.captures.audio.write_transcript`).

Each returns a :class:`~attnviz.captures.generation.Generation`: the capture over the input and the written tokens,
the written text and its token ids. Decoding is greedy, or sampled from ``softmax(logits / temperature)`` with a
seeded generator; it stops after ``max_new_tokens`` tokens or at the model's end token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnviz.captures.generation import Decoding, Generation
from attnviz.captures.result import AttentionCapture
from attnviz.common.errors import InputError, ParameterError
from attnviz.common.selection import HeadSelection, LayerSelection
from attnviz.models.base import LoadedModel

__all__ = ["Generation", "generate"]


def generate(
    loaded: LoadedModel,
    x: Any,
    *,
    max_new_tokens: int,
    sample: bool = False,
    temperature: float = 1.0,
    seed: int | None = None,
    image: Any = None,
    layers: LayerSelection = None,
    heads: HeadSelection = None,
    stacks: Sequence[str] | None = None,
    max_length: int | None = None,
    truncate: bool = True,
    all_frames: bool = False,
) -> Generation:
    """Let ``loaded`` write up to ``max_new_tokens`` tokens after ``x`` and capture every step's attention.

    ``x``: a text prompt (a causal LM continues it; an encoder-decoder model writes its target from it); for a
    vision-language model, the text with its picture as ``image`` (a path, bytes, a PIL image or an array); for an
    image captioner, the image; for Whisper, a ``.wav`` path or a 1-D float waveform at the model's sampling rate.

    ``sample``: draw each token from ``softmax(logits / temperature)`` (seeded by ``seed``) instead of the most
    likely one. ``layers``/``heads``/``stacks``: keep only those (every layer and head is recorded while writing).
    ``max_length``/``truncate``: how a text prompt is cut; ``all_frames``: Whisper's whole 30 s window of frames.

    Returns a :class:`~attnviz.captures.generation.Generation`: ``capture`` (``capture.generated_from`` is the first
    written token's position: on ``tokens`` for a causal LM, on ``target_tokens`` otherwise), ``text`` and
    ``token_ids``. Settings that do not fit the model (``image`` for a text model, ``max_new_tokens`` below 1) raise
    one :class:`~attnviz.common.errors.InputError` before the model runs.
    """
    decoding = Decoding(max_new_tokens, sample, temperature, seed)  # refuses what generation cannot run with
    if isinstance(x, (list, tuple)):
        raise InputError(f"{loaded.name} writes after one input at a time: give one, not a {type(x).__name__}")
    chosen: dict[str, Any] = {"layers": layers, "heads": heads, "stacks": stacks}
    reads = {"audio": "audio", "image": "images"}.get(loaded.modality)
    if image is not None and not loaded.reads_pictures_in_text:
        where = "give the image as x" if loaded.modality == "image" else f"{loaded.name} reads {reads or 'text'} only"
        raise ParameterError("image", f"{{image}} is the picture inside a vision-language model's text: {where}")
    for name, given, applies in (("max_length", max_length is not None, "text"), ("all_frames", all_frames, "audio")):
        if given and (reads or "text") != applies:
            raise ParameterError(name, f"{loaded.name} reads {reads or 'text'}: {{{name}}} applies to {applies}")
    if loaded.modality == "audio":
        from attnviz.captures.audio import write_transcript

        return write_transcript(loaded, x, decoding, all_frames=all_frames, truncate=truncate, **chosen)
    if loaded.modality == "image":
        from attnviz.captures.captioning import write_caption
        from attnviz.common.images import as_pil_image
        from attnviz.models.caption import captioner_of

        captioner = captioner_of(loaded)  # a vision encoder writes nothing: refused naming the captioners
        generation = write_caption(captioner, as_pil_image(x), decoding)
    else:
        from attnviz.captures.generation import continue_text

        if not isinstance(x, str):
            _refuse_for_text_model(loaded, x)
        if loaded.reads_pictures_in_text and loaded.encoder_decoder and image is not None:  # Mllama
            from attnviz.captures.captioning import write_reading_picture

            loaded.check_generation()
            generation = write_reading_picture(loaded, x, image, decoding)
        else:
            generation = continue_text(loaded, x, decoding, image=image, max_length=max_length, truncate=truncate)
    if layers is not None or heads is not None or stacks is not None:
        from attnviz.captures.captioning import keep_recorded

        generation.capture = keep_recorded(generation.capture, loaded, **chosen)
    return generation


def _refuse_for_text_model(loaded: LoadedModel, value: Any) -> None:
    """Refuse audio, an image or anything else that is not a text prompt given to a text model."""
    from attnviz.captures.audio import audio_model_of
    from attnviz.common.audio import is_audio_source

    if is_audio_source(value):
        audio_model_of(loaded)  # names the audio models
    if loaded.reads_pictures_in_text:
        raise InputError(f"{loaded.name} writes after a text: give the prompt as x and its picture as image")
    raise InputError(
        f"{loaded.name} is a text model: it writes after a text prompt, not a {type(value).__name__} (an image to "
        "caption needs an image captioner: a VisionEncoderDecoderModel, or toy-caption)"
    )


def _caption_capture(
    loaded: LoadedModel,
    image: Any,
    *,
    target: str | None = None,
    max_new_tokens: int | None = None,
    **options: Any,
) -> Generation | AttentionCapture:
    """The former ``attnviz.captures.captioning.caption_capture`` (deprecated there): with ``target``,
    ``attnviz.capture(model, image, target=caption)``; with ``max_new_tokens``, :func:`generate`."""
    from attnviz.captures.attention_capture import capture
    from attnviz.models.caption import captioner_of

    captioner_of(loaded)
    if (target is None) == (max_new_tokens is None):
        raise InputError("give a captioner either a caption (target) or a number of tokens to write (max_new_tokens)")
    if target is not None:
        return capture(loaded, image, target=target, **options)
    assert max_new_tokens is not None
    return generate(loaded, image, max_new_tokens=max_new_tokens, **options)
