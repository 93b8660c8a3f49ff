"""What the weights say about each head beyond its pattern: output-projection slices and rotary frequencies.

Norm-based weighting (:mod:`attnviz.core.weighting`) multiplies each head's value vectors by that head's
slice of the output projection; the query–key view splits a rotary model's logits by frequency band.
Both read family-specific module attributes, so they live here, next to the other readers of weights
(:mod:`attnviz.models.physical`, :mod:`attnviz.models.slicing`).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from attnviz.core import AttentionSite
from attnviz.models.base import LoadedModel
from attnviz.models.physical import find_attention_blocks
from attnviz.models.placement import weights_loaded
from attnviz.models.slicing import head_output_slices


def hf_head_output_projections(loaded: LoadedModel) -> dict[AttentionSite, Tensor]:
    """``[h, d, hidden]`` per site of a BERT-, GPT-2- or LLaMA-style model (``UnsupportedModelError`` otherwise).

    BERT: ``attention.output.dense``; GPT-2: ``c_proj`` (a ``Conv1D``, weight ``[h·d, hidden]``); LLaMA family:
    ``o_proj``. Grouped-query heads each get their own slice (they share values, not output columns).
    """
    slices = {}
    for site, block in find_attention_blocks(loaded).items():
        with weights_loaded(block.output):  # an offloaded projection's weights are on the meta device until read
            slices[site] = head_output_slices(block.output, block.head_dim)
    return slices


def hf_rotary_frequencies(model: Any) -> Tensor | None:
    """Angular frequency of each rotary pair, ``[d_rot / 2]`` float32 (radians per position), or None without RoPE.

    transformers' rotary modules keep them as the buffer ``inv_freq``; dimension ``i`` of a head turns with
    dimension ``i + d_rot/2`` at frequency ``inv_freq[i]`` (the ``rotate_half`` convention).
    """
    for name, buffer in model.named_buffers():
        if name.endswith("inv_freq"):
            return buffer.detach().float().cpu()
    return None
