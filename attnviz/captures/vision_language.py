"""A vision-language model's attention on a text with a picture in it, and its captioning view.

A capture of a vision-language model (:mod:`attnviz.models.vlm`) is one ``self`` stack over the whole sequence:
the text's tokens, with the picture's tokens named ``r{row}c{col}`` at positions ``image_grid.positions``, and the
picture as the model saw it in ``extras["image"]``.

The *captioning view* (:func:`caption_view`) is the same numbers seen as a captioner's: each **written** token's
attention over the image tokens. Token ``t`` is written by the query at ``t - 1`` (whose output predicted it), so
the view's ``cross`` stack holds rows ``first - 1 … end - 2`` of the self-attention, restricted to the image's key
columns, and its ``target_tokens`` the tokens ``first - 1 … end - 1``. The written tokens are the generated ones
(a capture made while the model wrote, ``generated_from``), else the text after the picture. The rows are
the language model's own weights: they do not sum to 1 over the image, the rest goes to the text.
"""

from __future__ import annotations

import dataclasses

from attnviz.captures.result import AttentionCapture
from attnviz.common.errors import InputError
from attnviz.common.images import ImageSource, as_pil_image
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.vlm import vision_language_model_of


def vision_language_batch(loaded: LoadedModel, texts: list[str], images: list[ImageSource]) -> EncodedBatch:
    """``texts``, each with its picture, encoded by a vision-language model (a clear error for any other model)."""
    model = vision_language_model_of(loaded)
    return model.encode_images([as_pil_image(image) for image in images], texts=texts)


def is_vision_language_capture(capture: AttentionCapture) -> bool:
    """Whether ``capture`` is of a text with a picture in it (a vision-language model's)."""
    grid = capture.image_grid
    return grid is not None and capture.target_tokens is None and len(capture.tokens) > grid.num_tokens


def written_span(capture: AttentionCapture) -> range:
    """The positions of the written tokens: the generated ones, else those after the picture."""
    grid = capture.image_grid
    assert grid is not None
    first = capture.generated_from if capture.generated_from is not None else grid.start + grid.num_tokens
    if first >= len(capture.tokens):
        raise InputError(
            "no token comes after the picture: write the text after the image (or let the model write, --generate)"
        )
    return range(max(first, 1), len(capture.tokens))


def caption_view(capture: AttentionCapture) -> AttentionCapture:
    """The captioning view of a vision-language capture (see the module docstring): the picture's tokens on the
    source side, the written tokens (after the one before them) on the target side, and each layer's ``cross``
    pattern ``[head, written token, image token]``. Any other capture is returned as it is."""
    if not is_vision_language_capture(capture):
        return capture
    grid = capture.image_grid
    assert grid is not None
    written = written_span(capture)
    rows = slice(written.start - 1, written.stop - 1)  # the queries that wrote them
    keys = slice(grid.start, grid.start + grid.num_tokens)
    target = slice(written.start - 1, written.stop)
    cross = [pattern[:, rows, keys] for pattern in capture.patterns["self"]]  # each [head, written, image token]
    return dataclasses.replace(
        capture,
        tokens=capture.tokens[keys],
        special=capture.special[keys] if capture.special else [],
        word_ids=capture.word_ids[keys] if capture.word_ids else [],
        patterns={"cross": cross},
        target_tokens=capture.tokens[target],
        target_special=capture.special[target] if capture.special else None,
        target_word_ids=capture.word_ids[target] if capture.word_ids else None,
        image_grid=dataclasses.replace(grid, start=0),
        generated_from=None,
        causal=False,
        identity=_cross_identity(capture),
    )


def _cross_identity(capture: AttentionCapture):
    """The capture's head identity with its ``self`` stack renamed ``cross`` (a capture of some layers or heads)."""
    identity = capture.identity
    if identity is None:
        return None
    tables = {
        field.name: {
            ("cross" if stack == "self" else stack): value for stack, value in getattr(identity, field.name).items()
        }
        for field in dataclasses.fields(identity)
    }
    return type(identity)(**tables)
