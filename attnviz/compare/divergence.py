"""How far apart two attention distributions over the same keys are: per query, in a numerically careful form.

For one query, ``p`` (model A's row) and ``q`` (model B's row) are distributions over the same keys.

* Jensen–Shannon divergence, natural log, in ``[0, ln 2]``:
  ``JS(p, q) = ½ KL(p ‖ m) + ½ KL(q ‖ m)``, ``m = ½ (p + q)``.
* Total variation, in ``[0, 1]``: ``TV(p, q) = ½ Σⱼ |pⱼ − qⱼ|``.

The JS is not computed as ``H(m) − ½ H(p) − ½ H(q)``: that difference of three entropies of
a few nats each cancels catastrophically in float32 when ``p ≈ q`` (a pruned model's unchanged
layers, float32 against bfloat16), leaving rounding noise of ~1e-7 per query. Written per key with
``s = p + q`` and ``d = (p − q) / s``, each term is
``¼ s [(1 + d) ln(1 + d) + (1 − d) ln(1 − d)]`` (``p/m = 1 + d``, ``q/m = 1 − d``): ``log1p`` keeps it
accurate to float32 rounding *of the term itself*, which is second order in ``d``; identical rows
give exactly 0. :func:`torch.special.xlog1py` makes ``0 · ln 0 = 0`` where one weight is 0.
(:mod:`attnviz.heads.similarity` compares every pair of heads of one model, where the
divergences are large and one pass per pair matters more.)
"""

from __future__ import annotations

import torch
from torch import Tensor


def query_divergences(p: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
    """Per-query JS divergence (nats) and total variation between two patterns of the same shape.

    Args:
        p, q: float32 ``[..., k]``, each row a distribution over the same ``k`` keys (weight 0 where
            a key is hidden).

    Returns:
        ``(js, tv)``, each ``[...]`` float32: one value per row.
    """
    total = p + q  # [..., k] s
    difference = p - q  # [..., k]
    tiny = torch.finfo(total.dtype).tiny
    tv = difference.abs().sum(-1).mul_(0.5)  # [...]
    ratio = difference.div_(total.clamp_min(tiny))  # [..., k] d in [−1, 1]; 0 where s = 0
    terms = torch.special.xlog1py(1.0 + ratio, ratio)  # (1 + d) ln(1 + d)
    terms += torch.special.xlog1py(1.0 - ratio, -ratio)  # (1 − d) ln(1 − d)
    js = terms.mul_(total).sum(-1).mul_(0.25).clamp_(min=0.0)  # [...]
    return js, tv
