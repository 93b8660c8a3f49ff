"""The closed sets of the attention core; imports nothing heavy (the command line lists them)."""

from __future__ import annotations

from typing import Literal, get_args

#: what an attention map holds: the softmax weights ``α_ij``, or ``α_ij · ‖f_h(x_j)‖``, each weight times the
#: norm of the transformed value vector it moves (Kobayashi et al. 2020; see :mod:`attnviz.core.weighting`)
Weighting = Literal["weights", "norm"]
WEIGHTINGS: tuple[str, ...] = get_args(Weighting)
