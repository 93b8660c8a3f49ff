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

A model that reads the picture through cross-attention layers (Mllama, :mod:`attnviz.models.vlm_cross`) has the
picture's keys on the source side already: its view keeps the ``cross`` stack's rows of the written tokens (those
after the placeholder), with the keys put in the picture's order, every tile's class token, then the patches
row-major over the whole canvas (the empty tiles' keys, which the rows give no weight, left out).
"""

from __future__ import annotations

import dataclasses

from attnviz.captures.result import AttentionCapture
from attnviz.common.errors import InputError
from attnviz.common.images import ImageGrid, ImageSource, as_pil_image
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.vlm import vision_language_model_of


def vision_language_batch(loaded: LoadedModel, texts: list[str], images: list[ImageSource]) -> EncodedBatch:
    """``texts``, each with its picture, encoded by a vision-language model (a clear error for any other model)."""
    model = vision_language_model_of(loaded)
    return model.encode_images([as_pil_image(image) for image in images], texts=texts)


def is_vision_language_capture(capture: AttentionCapture) -> bool:
    """Whether ``capture`` is of a text with a picture in it (a vision-language model's)."""
    grid = capture.image_grid
    if grid is None:
        return False
    in_text = capture.target_tokens is None and len(capture.tokens) > grid.num_tokens
    return in_text or (grid.placeholder is not None and capture.target_tokens is not None)


def written_span(capture: AttentionCapture) -> range:
    """The positions of the written tokens: the generated ones, else those after the picture (after its
    placeholder, and the special tokens right after it, where the text reads it through cross-attention)."""
    grid = capture.image_grid
    assert grid is not None
    text = capture.tokens if grid.placeholder is None else capture.target_tokens or []
    after = grid.start + grid.num_tokens
    if grid.placeholder is not None:  # after the placeholder and the special tokens right after it (Mllama's BOS)
        after, special = grid.placeholder + 1, capture.target_special or []
        while after < len(special) and special[after]:
            after += 1
    first = capture.generated_from if capture.generated_from is not None else after
    if first >= len(text):
        raise InputError(
            "no token comes after the picture: write the text after the image (or let the model write, --generate)"
        )
    return range(max(first, 1), len(text))


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
    target = slice(written.start - 1, written.stop)
    if grid.placeholder is not None:  # the picture's keys already on the source side
        order = grid.extra_indices() + grid.patch_indices()  # [CLS] of every tile, then the canvas row-major
        text, text_special, text_words = capture.target_tokens or [], capture.target_special, capture.target_word_ids
        stack, view_grid = "cross", ImageGrid(grid.rows, grid.cols, grid.extra_kinds * grid.num_tiles, grid.patch_size)
    else:
        order = list(grid.positions)
        text, text_special, text_words = capture.tokens, capture.special, capture.word_ids
        stack, view_grid = "self", dataclasses.replace(grid, start=0)
    cross = [pattern[:, rows][:, :, order] for pattern in capture.patterns[stack]]  # each [head, written, image key]
    return dataclasses.replace(
        capture,
        tokens=[capture.tokens[key] for key in order],
        special=[capture.special[key] for key in order] if capture.special else [],
        word_ids=[capture.word_ids[key] for key in order] if capture.word_ids else [],
        patterns={"cross": cross},
        target_tokens=text[target],
        target_special=text_special[target] if text_special else None,
        target_word_ids=text_words[target] if text_words else None,
        image_grid=view_grid,
        generated_from=None,
        causal=False,
        identity=_cross_identity(capture, stack),
    )


def _cross_identity(capture: AttentionCapture, stack: str):
    """The capture's head identity of ``stack`` alone, named ``cross`` (a capture of some layers or heads)."""
    identity = capture.identity
    if identity is None:
        return None
    tables = {
        field.name: ({"cross": getattr(identity, field.name)[stack]} if stack in getattr(identity, field.name) else {})
        for field in dataclasses.fields(identity)
    }
    return type(identity)(**tables)
