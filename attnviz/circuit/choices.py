"""The closed sets of ``attnviz circuit``'s options (no torch: the command line reads them at start-up)."""

from __future__ import annotations

from typing import Literal

#: atp: attribution patching of nodes; eap: of edges; eap-ig: of edges with integrated gradients
Method = Literal["atp", "eap", "eap-ig"]
METHODS: tuple[Method, ...] = ("atp", "eap", "eap-ig")

#: logit-diff: logit(answer) − logit(wrong) at the answer position; kl: KL divergence from the clean run's distribution
Metric = Literal["logit-diff", "kl"]
METRICS: tuple[Metric, ...] = ("logit-diff", "kl")
