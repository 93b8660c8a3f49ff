"""Attention modules that run more than once per forward pass: ALBERT's one shared layer, looped blocks.

Each application is a layer of its own, numbered by its place in the pass as transformers' eager
``output_attentions`` numbers them. Which stacks repeat is found by one probe pass that counts each attention
module's own forward calls (not its calls of the core: DiffLlama's attention calls the core twice in one layer, for
its two softmaxes, and is one layer).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnviz.core import AttentionContext, AttentionSite


def find_repeated_stacks(loaded: Any) -> frozenset[str]:
    """The stacks of ``loaded`` (a Hugging Face model on the core) whose attention modules run more than once in
    one forward pass of its probe input. ``loaded.site_of`` must name sites from module names during the pass."""
    attending: set[nn.Module] = set()
    runs: dict[nn.Module, int] = {}

    def noting(module: nn.Module) -> AttentionSite | None:
        attending.add(module)
        return loaded.site_of(module)

    def counting(module: nn.Module, args: Any) -> None:
        runs[module] = runs.get(module, 0) + 1

    hooks = [module.register_forward_pre_hook(counting) for module in loaded.model.modules()]
    try:
        with torch.no_grad():
            loaded.forward(loaded.probe_batch(), AttentionContext(site_of=noting))
    finally:
        for hook in hooks:
            hook.remove()
    sites = [loaded.site_of(module) for module in attending if runs.get(module, 0) > 1]
    return frozenset(site.stack for site in sites if site is not None)
