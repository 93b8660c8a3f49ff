"""Capturing an image captioner's attention: on a given caption (teacher forcing) or while it writes one.

A capture of a captioner (:class:`~attnviz.models.caption.CaptionModel`) has the image on the source
side (``tokens``: the extra tokens and the patches ``r{row}c{col}``, with ``image_grid`` and the
picture in ``extras["image"]``) and the caption on the target side (``target_tokens``: the decoder
start token, then the caption's tokens); its stacks are ``encoder`` (the image's self-attention),
``decoder`` (the caption's causal self-attention) and ``cross`` (caption tokens × image tokens).

Row ``t`` of ``decoder``/``cross`` is the query of target token ``t``, whose output predicts token
``t + 1``: the word at target position ``t`` was *written* at row ``t - 1`` (see :func:`written_rows`).

While writing (:func:`attnviz.generate` on a captioner's image: :func:`write_caption`), the image is encoded once and the
decoder runs one token per step with its key/value cache, as for text
(:mod:`attnviz.captures.generation`); one extra step feeds the last token so that its row exists too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from attnviz.captures.generation import (
    Decoding,
    Generation,
    _eos_ids,
    _StepRecorder,
    cache_argument,
    check_room,
    write_tokens,
    written_target_capture,
)
from attnviz.captures.images import ImageSource, as_pil_image
from attnviz.captures.result import AttentionCapture
from attnviz.common.lazy import lazy_exports
from attnviz.common.selection import HeadSelection, LayerSelection
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.caption import CaptionModel
from attnviz.models.decoder_side import WritesText


def write_caption(captioner: CaptionModel, picture, decoding: Decoding) -> Generation:
    """Let the captioner write about ``picture`` as ``decoding`` says, capturing every step; it stops at its end
    token or where its decoder's positions end."""
    batch = captioner.encode_images([picture])  # the decoder side: the start token alone
    return write_target(captioner, batch, decoding)


def write_target(
    writer: WritesText,
    batch: EncodedBatch,
    decoding: Decoding,
) -> Generation:
    """Let a model that writes about its source (a captioner, Whisper) write as ``decoding`` says after
    the decoder prefix of ``batch`` (one example, its source encoded once), capturing every step; it stops at its end
    token or where its decoder's positions end. The capture's source side is the batch's (its tokens, image grid and
    picture); ``generated_from`` is the first written token's position."""
    sequence = batch.inputs["decoder_input_ids"][0].tolist()  # the prefix, then each new token
    prefix = len(sequence)
    if writer.max_length is not None:  # the decoder's positions bound what it can write (prefix included)
        limit = min(decoding.max_new_tokens, writer.max_length - prefix)
        decoding = dataclasses.replace(decoding, max_new_tokens=limit)
    model = writer.model
    source_len = len(batch.tokens[0])
    recorder = _StepRecorder(source_len)  # the source's positions past its tokens (padding frames) are left out
    context = writer.context([recorder])  # type: ignore[attr-defined]  # a LoadedModel
    cache = cache_argument(model)
    with torch.no_grad(), writer.running(), writer.cross_context(context):  # type: ignore[attr-defined]
        encoded = writer.encode_source(batch, context)
        generated = write_tokens(
            lambda step_input, past: model(
                encoder_outputs=encoded,
                decoder_input_ids=step_input,
                use_cache=True,
                **{cache: past, **writer.decoder_arguments(context)},
            ),
            recorder,
            sequence,
            cache=cache,
            eos_ids=_eos_ids(model) | _eos_ids(getattr(model, "decoder", model)),
            decoding=decoding,
            device=batch.inputs["decoder_input_ids"].device,
        )
    capture = written_target_capture(
        writer.name,
        batch,
        recorder,
        source_len,
        writer.caption_tokens(sequence),
        image_grid=batch.image_grid,
        extras={} if batch.images is None else {"image": batch.images[0].detach().to("cpu", torch.float32)},
        generated_from=prefix,
    )
    text = writer.tokenizer.decode(generated, skip_special_tokens=True)
    return Generation(capture=capture, text=text, token_ids=generated)


def write_reading_picture(loaded: LoadedModel, prompt: str, picture, decoding: Decoding) -> Generation:
    """Let a vision-language model that reads its picture through cross-attention layers (Mllama) continue
    ``prompt`` as ``decoding`` says, capturing every step: the picture's keys on the source side, the prompt and the
    written tokens on the target side (stacks ``decoder`` and ``cross``); ``generated_from`` is the first written
    token's position on the target side."""
    from attnviz.captures.vision_language import vision_language_batch
    from attnviz.core import CONTEXT_KWARG

    batch = vision_language_batch(loaded, [prompt], [picture])
    inputs = batch.inputs
    sequence = inputs["input_ids"][0].tolist()  # the prompt, then each new token
    prompt_len = len(sequence)
    check_room(loaded, (prompt_len, "prompt"), prompt_len, decoding, source_len=len(batch.tokens[0]))  # + cross rows
    # the first step reads the picture (pixels, tiles, the text × tile mask); later steps read the cache
    first = {key: value for key, value in inputs.items() if key not in ("input_ids", "attention_mask")}
    # a written token reads the picture as the prompt's last token does: transformers' generate repeats that row
    # of the text × tile mask for each new token
    later = {"cross_attention_mask": inputs["cross_attention_mask"][:, -1:]}  # [1, 1, pictures, tiles]
    model = loaded.model
    recorder = _StepRecorder()
    context = loaded.context([recorder])
    cache = cache_argument(model)

    def forward(step_input: torch.Tensor, past):
        mask = torch.ones(1, len(sequence), dtype=torch.long, device=loaded.device)  # [1, keys so far]
        extra = first if past is None else later
        return model(input_ids=step_input, attention_mask=mask, use_cache=True, **{cache: past, CONTEXT_KWARG: context},
                     **extra)  # fmt: skip

    with torch.no_grad(), loaded.running():
        generated = write_tokens(forward, recorder, sequence, cache=cache, eos_ids=_eos_ids(model), decoding=decoding,
                                 device=loaded.device)  # fmt: skip
    capture = written_target_capture(
        loaded.name,
        batch,
        recorder,
        len(batch.tokens[0]),
        loaded.text_tokens(sequence),  # type: ignore[attr-defined]  # a VisionLanguageModel
        image_grid=batch.image_grid,
        extras={"image": batch.images[0].detach().to("cpu", torch.float32)} if batch.images is not None else {},
        generated_from=prompt_len,
    )
    text = loaded.tokenizer.decode(generated, skip_special_tokens=True)
    return Generation(capture=capture, text=text, token_ids=generated)


def keep_recorded(
    capture: AttentionCapture,
    loaded: LoadedModel,
    *,
    layers: LayerSelection = None,
    heads: HeadSelection = None,
    stacks: Sequence[str] | None = None,
) -> AttentionCapture:
    """``capture`` (every layer and head) cut down to the chosen ones, with the identity a capture of them has."""
    from attnviz.captures.recording import plan_recording

    recording = plan_recording(loaded, layers=layers, heads=heads, stacks=stacks)
    patterns: dict[str, list[torch.Tensor]] = {}
    for stack, layer_patterns in capture.patterns.items():
        if stacks is not None and stack not in stacks:
            continue  # as a capture of the chosen stacks holds only those
        patterns[stack] = []
        for layer, pattern in enumerate(layer_patterns):  # [head, query, key]
            site = next((s for s in recording.sites if s.stack == stack and s.layer == layer), None)
            if site is None:
                patterns[stack].append(pattern[:0])
                continue
            kept = recording.sites[site]
            patterns[stack].append(pattern if kept is None else pattern[list(kept)])
    capture.patterns = patterns
    capture.identity = recording.identity
    return capture


def caption_batches(
    captioner: CaptionModel, images: Sequence[ImageSource], batch_size: int, *, max_new_tokens: int
) -> list[EncodedBatch]:
    """The captioner's own captions of ``images`` (greedy, at most ``max_new_tokens`` tokens each) as batches of
    at most ``batch_size`` images with those captions on the decoder side, for statistics over what it writes."""
    batches = []
    for start in range(0, len(images), batch_size):
        pictures = [as_pil_image(source) for source in images[start : start + batch_size]]
        captions = [greedy_caption_ids(captioner, picture, max_new_tokens) for picture in pictures]
        batches.append(captioner.encode_images(pictures, token_ids=captions))
    return batches


def greedy_caption_ids(captioner: CaptionModel, picture, max_new_tokens: int) -> list[int]:
    """The token ids the captioner writes about ``picture`` (greedy; the end token kept when it comes)."""
    return write_caption(captioner, picture, Decoding(max_new_tokens)).token_ids


#: the old name of :func:`attnviz.generate` on a captioner (and of :func:`attnviz.capture` with its caption)
OLD_CAPTION = (
    "attnviz.generate(model, image, max_new_tokens=N) (a given caption: attnviz.capture(model, image, target=caption))"
)
__getattr__ = lazy_exports(
    __name__, {}, {"caption_capture": ("attnviz.captures.writing", "_caption_capture", OLD_CAPTION)}
)[0]
