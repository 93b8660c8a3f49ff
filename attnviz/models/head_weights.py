"""What the weights say about each head beyond its pattern: output-projection slices and rotary frequencies.

Norm-based weighting (:mod:`attnviz.core.weighting`) multiplies each head's value vectors by that head's
slice of the output projection; the query–key view splits a rotary model's logits by frequency band.
The output projection of every family is found by :mod:`attnviz.models.head_outputs`; the rotary frequencies
are read from the model's buffers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from attnviz.common.errors import UnsupportedModelError
from attnviz.core import AttentionSite

if TYPE_CHECKING:
    from attnviz.models.hf import HFModel
    from attnviz.models.vision import VisionModel


def hf_head_output_projections(loaded: HFModel | VisionModel) -> dict[AttentionSite, Tensor]:
    """``[h, dv, hidden]`` per site: each head's slice ``W_O^h`` of its output projection
    (:mod:`attnviz.models.head_outputs`; grouped-query heads each get their own slice: they share values, not
    output columns).

    Raises :class:`UnsupportedModelError` where something between the attention and the projection changes the
    heads' outputs (a gate or a norm that depends on the query): a key's share of a head's output is then not
    ``α_ij ‖v_j W_O^h‖``, and norm-based weighting is not defined.
    """
    projections = loaded.output_projections()
    for site, found in projections.items():
        if not found.direct:
            raise UnsupportedModelError(
                f"{loaded.name}: between the attention of {site.name} and its output projection ({found.name}) sits "
                f"{found.between}, so a key's share of a head's output is not its weight times the norm of its "
                "transformed value vector; norm-based weighting is not defined on this model (use the weights)"
            )
    return {site: found.slices() for site, found in projections.items()}


def hf_rotary_frequencies(model: Any) -> Tensor | None:
    """Angular frequency of each rotary pair, ``[d_rot / 2]`` float32 (radians per position), or None without RoPE.

    transformers' rotary modules keep them as the buffer ``inv_freq``; dimension ``i`` of a head turns with
    dimension ``i + d_rot/2`` at frequency ``inv_freq[i]`` (the ``rotate_half`` convention).
    """
    for name, buffer in model.named_buffers():
        if name.endswith("inv_freq"):
            return buffer.detach().float().cpu()
    return None
