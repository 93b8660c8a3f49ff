"""Physical head pruning of Hugging Face models: slicing removed heads out of the weights.

A head ``h`` owns rows ``h·d … h·d+d−1`` of the query, key and value projections
(``d`` the head dimension) and the same *columns* of the output projection.
Removing the head deletes those rows and columns; the model then computes
exactly what the masked model computed (a masked head contributes zero to the
output projection), with fewer weights and less work.

Three weight layouts are handled (``family``):

* ``bert`` — ``query``/``key``/``value`` ``nn.Linear`` in ``…attention.self``,
  output projection ``…attention.output.dense`` (BERT, RoBERTa, MiniLM, ELECTRA, …).
* ``gpt2`` — one fused ``Conv1D`` ``c_attn`` whose output columns are
  ``[query | key | value]`` (each head-major), and ``c_proj``; ``Conv1D``
  stores weights as ``[in, out]``, so the output projection loses *rows*.
* ``llama`` — ``q_proj``/``k_proj``/``v_proj``/``o_proj`` ``nn.Linear``
  (LLaMA, Mistral, Qwen2, SmolLM2, …), with grouped-query attention.

Grouped-query attention (GQA): ``kvh`` key/value heads are each shared by a
*group* of ``n = h / kvh`` consecutive query heads, and the layer computes
``repeat_kv`` with one ``n`` for every group. So:

* a key/value head can be removed only when *every* query head of its group is
  removed — then the whole group goes;
* among the surviving groups, if each has at least ``m`` removed heads, ``m``
  of them are sliced out of every group (the group size becomes ``n − m``, the
  same for all groups);
* removed heads beyond that cannot be sliced out without making groups unequal:
  they stay in the weights, *masked* by zeroing their output-projection columns,
  which gives the same outputs as the head mask (their patterns still appear
  in heatmaps, but contribute nothing).

Plain multi-head attention is the case ``n = 1``: every removed head is sliced out.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnviz.common.errors import UnsupportedModelError
from attnviz.core import AttentionContext, AttentionSite
from attnviz.models.base import LoadedModel
from attnviz.models.head_sets import normalize_removed
from attnviz.models.slicing import slice_conv1d, slice_linear

FAMILIES = ("bert", "gpt2", "llama")


@dataclass
class AttentionBlock:
    """Where one attention site's weights live, and how they are laid out."""

    site: AttentionSite
    family: str  # "bert", "gpt2" or "llama" (see the module docstring)
    # Hugging Face modules of different families: their attributes (q_proj, query, c_attn, …) are
    # read by family, so they are typed Any rather than nn.Module
    module: Any  # the module that calls the attention function
    parent: Any  # module holding the output projection attribute
    output_name: str  # attribute of ``parent`` that is the output projection
    num_heads: int  # query heads now
    num_kv_heads: int  # key/value heads now (= num_heads without grouped-query attention)
    head_dim: int  # features per head (of queries and keys)
    #: features per head of values and of the output projection's input, where they differ from ``head_dim``
    #: (multi-head latent attention, MiMo-V2); None: the same
    value_dim: int | None = None

    @property
    def output_dim(self) -> int:
        """Features per head of the values, the attention output and the output projection's input."""
        return self.head_dim if self.value_dim is None else self.value_dim

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.num_heads // self.num_kv_heads

    @property
    def output(self) -> Any:
        return getattr(self.parent, self.output_name)


@dataclass
class SitePlan:
    """What happens to one site's heads (indices are the site's current head indices)."""

    removed: list[int]  # every removed head
    keep_heads: list[int]  # query heads kept in the weights, in order (group-major)
    keep_kv_heads: list[int]  # key/value heads kept, in order
    masked: list[int] = field(default_factory=list)  # removed heads kept in the weights, output zeroed (GQA)

    @property
    def sliced(self) -> list[int]:
        """Removed heads that are physically sliced out."""
        kept = set(self.keep_heads)
        return [head for head in self.removed if head not in kept]

    def masked_positions(self) -> list[int]:
        """Indices of the masked heads *after* slicing."""
        return [self.keep_heads.index(head) for head in self.masked]


# -- finding the attention weights -------------------------------------------------------------------


def _family(module: nn.Module, parent: nn.Module | None) -> tuple[str, nn.Module, str] | None:
    """(family, parent of the output projection, its attribute name), or None when unknown."""
    if all(isinstance(getattr(module, name, None), nn.Linear) for name in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return "llama", module, "o_proj"
    if hasattr(module, "c_attn") and hasattr(module, "c_proj") and not hasattr(module, "q_attn"):
        return "gpt2", module, "c_proj"
    if all(isinstance(getattr(module, name, None), nn.Linear) for name in ("query", "key", "value")):
        output = getattr(parent, "output", None)
        if output is not None and isinstance(getattr(output, "dense", None), nn.Linear):
            return "bert", output, "dense"
    return None


def _head_counts(family: str, module: Any, parent: Any, output_name: str) -> tuple[int, int, int, int | None]:
    """(query heads, key/value heads, head dim, value head dim or None where the same) read from the weight shapes."""
    if family == "bert":
        head_dim = int(module.attention_head_size)
        heads = module.query.out_features // head_dim
        return heads, module.key.out_features // head_dim, head_dim, None
    if family == "gpt2":
        head_dim = int(module.head_dim)
        heads = module.split_size // head_dim
        return heads, heads, head_dim, None
    head_dim = int(module.head_dim)
    heads = module.q_proj.out_features // head_dim
    value_dim = module.o_proj.in_features // heads  # its own size where values differ (MiMo-V2's v_head_dim)
    return heads, module.k_proj.out_features // head_dim, head_dim, None if value_dim == head_dim else value_dim


def find_attention_blocks(loaded: LoadedModel) -> dict[AttentionSite, AttentionBlock]:
    """Every attention site's weights, found by a probe forward pass through the core.

    Raises :class:`UnsupportedModelError` when a site's weights are laid out in
    a way this module does not know (see :data:`FAMILIES`).
    """
    model = loaded.model
    found: dict[AttentionSite, nn.Module] = {}

    def site_of(module: nn.Module) -> AttentionSite | None:
        site = loaded.site_of(module)
        if site is not None:
            if site in found and found[site] is not module:
                raise UnsupportedModelError(
                    f"{loaded.name} has two attention modules at {site.name} (cross-attention?): "
                    "attnviz prune supports one self-attention per layer"
                )
            found[site] = module
        return site

    batch = loaded.probe_batch()  # a short text, or a grey image for a vision model
    with torch.no_grad():
        loaded.forward(batch, AttentionContext(site_of=site_of))
    names = {module: name for name, module in model.named_modules()}
    blocks = {}
    for site, module in sorted(found.items()):
        name = names.get(module, "")
        parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        family = _family(module, parent)
        if family is None:
            raise UnsupportedModelError(
                f"attnviz cannot physically prune {type(module).__name__} ({name}): supported attention layouts "
                "are BERT-style (query/key/value + output.dense), GPT-2-style (c_attn/c_proj) and "
                "LLaMA-style (q_proj/k_proj/v_proj/o_proj)"
            )
        kind, holder, output_name = family
        heads, kv_heads, head_dim, value_dim = _head_counts(kind, module, holder, output_name)
        seen = loaded.layout().get(site)
        if seen is not None and seen != heads:  # Qwen3-Next's q_proj also holds a gate per head
            raise UnsupportedModelError(
                f"attnviz cannot physically prune {type(module).__name__} ({name}): its projections hold rows for "
                f"{heads} heads where its attention runs {seen} (other rows, such as a gate per head, share them)"
            )
        blocks[site] = AttentionBlock(site, kind, module, holder, output_name, heads, kv_heads, head_dim, value_dim)
    if not blocks:
        raise UnsupportedModelError(f"no attention calls of {loaded.name} reached attnviz's core: cannot prune it")
    return blocks


# -- planning ----------------------------------------------------------------------------------------


def plan_site(block: AttentionBlock, removed: list[int]) -> SitePlan:
    """Which heads of ``block`` are sliced out and which are masked (see the module docstring)."""
    removed = sorted(set(removed))
    size = block.group_size
    groups = [list(range(g * size, (g + 1) * size)) for g in range(block.num_kv_heads)]
    gone = set(removed)
    surviving = [g for g, heads in enumerate(groups) if not all(head in gone for head in heads)]
    if not surviving:
        raise UnsupportedModelError(f"cannot remove every head of {block.site.name}: a layer keeps at least one head")
    # Every surviving group can lose the same number m of its removed heads.
    slice_each = min(sum(head in gone for head in groups[g]) for g in surviving)
    keep_heads: list[int] = []
    masked: list[int] = []
    for g in surviving:
        removed_here = [head for head in groups[g] if head in gone]
        sliced = set(removed_here[:slice_each])
        keep_heads.extend(head for head in groups[g] if head not in sliced)
        masked.extend(removed_here[slice_each:])
    return SitePlan(removed=removed, keep_heads=keep_heads, keep_kv_heads=surviving, masked=sorted(masked))


def plan_pruning(
    blocks: Mapping[AttentionSite, AttentionBlock], removed: Mapping[AttentionSite, Sequence[int]]
) -> dict[AttentionSite, SitePlan]:
    """A :class:`SitePlan` for every site (sites without removed heads keep everything)."""
    removed = normalize_removed(removed)
    unknown = set(removed) - set(blocks)
    if unknown:
        raise UnsupportedModelError(f"no attention weights found for {', '.join(s.name for s in sorted(unknown))}")
    return {site: plan_site(block, removed.get(site, [])) for site, block in blocks.items()}


# -- slicing -----------------------------------------------------------------------------------------


def _head_rows(heads: list[int], head_dim: int, offset: int = 0) -> list[int]:
    """Feature indices of ``heads`` in a head-major projection (each head ``head_dim`` wide)."""
    return [offset + head * head_dim + i for head in heads for i in range(head_dim)]


def slice_block(block: AttentionBlock, plan: SitePlan) -> AttentionBlock:
    """Slice ``block``'s weights in place down to ``plan.keep_heads`` / ``plan.keep_kv_heads``.

    Masked heads are then zeroed in the output projection. Returns the updated block.
    """
    module, d = block.module, block.head_dim
    rows = _head_rows(plan.keep_heads, d)
    heads = len(plan.keep_heads)
    if len(plan.keep_heads) != block.num_heads:
        if block.family == "bert":
            module.query = slice_linear(module.query, rows, 0)
            module.key = slice_linear(module.key, rows, 0)
            module.value = slice_linear(module.value, rows, 0)
            setattr(block.parent, block.output_name, slice_linear(block.output, rows, 1))
            module.num_attention_heads = heads
            module.all_head_size = heads * d
        elif block.family == "gpt2":
            width = block.num_heads * d  # the fused projection is [query | key | value], each `width` wide
            columns = _head_rows(plan.keep_heads, d) + _head_rows(plan.keep_heads, d, width)
            columns += _head_rows(plan.keep_heads, d, 2 * width)
            module.c_attn = slice_conv1d(module.c_attn, columns, 1)
            module.c_proj = slice_conv1d(module.c_proj, rows, 0)
            module.num_heads = heads
            module.split_size = heads * d
        else:
            kv_rows = _head_rows(plan.keep_kv_heads, d)
            value_dim = block.output_dim
            module.q_proj = slice_linear(module.q_proj, rows, 0)
            module.k_proj = slice_linear(module.k_proj, kv_rows, 0)
            module.v_proj = slice_linear(module.v_proj, _head_rows(plan.keep_kv_heads, value_dim), 0)
            module.o_proj = slice_linear(module.o_proj, _head_rows(plan.keep_heads, value_dim), 1)
            module.num_key_value_groups = heads // len(plan.keep_kv_heads)
            for attribute in ("num_heads", "num_attention_heads"):
                if isinstance(getattr(module, attribute, None), int):
                    setattr(module, attribute, heads)
            if isinstance(getattr(module, "num_key_value_heads", None), int):
                module.num_key_value_heads = len(plan.keep_kv_heads)
    updated = AttentionBlock(
        block.site,
        block.family,
        module,
        block.parent,
        block.output_name,
        heads,
        len(plan.keep_kv_heads),
        d,
        block.value_dim,
    )
    zero_head_outputs(updated, plan.masked_positions())
    return updated


def zero_head_outputs(block: AttentionBlock, heads: list[int]) -> None:
    """Zero the output-projection weights that read ``heads``: the masked-weights form of removal.

    A head whose output columns are zero contributes exactly nothing, as when
    its pattern is multiplied by 0 in the core.
    """
    if not heads:
        return
    if block.output.weight.device.type == "meta":  # offloaded by accelerate: zero a loaded copy, kept in place
        whole = list(range(block.output.weight.shape[0 if block.family == "gpt2" else 1]))
        copy_of = slice_conv1d if block.family == "gpt2" else slice_linear
        setattr(block.parent, block.output_name, copy_of(block.output, whole, 0 if block.family == "gpt2" else 1))
    index = torch.tensor(_head_rows(heads, block.output_dim), dtype=torch.long)
    weight = block.output.weight
    with torch.no_grad():
        if block.family == "gpt2":
            weight[index.to(weight.device), :] = 0  # Conv1D weight is [in, out]
        else:
            weight[:, index.to(weight.device)] = 0  # nn.Linear weight is [out, in]


# -- whole models --------------------------------------------------------------------------------------


def _wrap(loaded: LoadedModel, model: nn.Module) -> LoadedModel:
    """A loaded model of the same kind around another torch module (same tokenizer)."""
    return loaded.with_model(model)


def prune_heads_physically(
    loaded: LoadedModel, removed: Mapping[AttentionSite, Sequence[int]]
) -> tuple[LoadedModel, dict[AttentionSite, SitePlan]]:
    """A physically pruned copy of ``loaded`` (the original is left untouched) and the per-site plan."""
    copy_model = copy.deepcopy(loaded.model)
    pruned = _wrap(loaded, copy_model)
    blocks = find_attention_blocks(pruned)
    plans = plan_pruning(blocks, removed)
    for site, plan in plans.items():
        slice_block(blocks[site], plan)
    return _wrap(loaded, copy_model), plans


def masked_weights_model(loaded: LoadedModel, removed: Mapping[AttentionSite, Sequence[int]]) -> nn.Module:
    """A full-size copy of ``loaded.model`` whose removed heads have zeroed output-projection weights.

    Plain ``transformers`` loads it (same config, same shapes) and it computes
    what the masked model computes.
    """
    copy_model = copy.deepcopy(loaded.model)
    blocks = find_attention_blocks(_wrap(loaded, copy_model))
    for site, heads in normalize_removed(removed).items():
        zero_head_outputs(blocks[site], heads)
    return copy_model


def shrink_to_counts(
    loaded: LoadedModel,
    counts: Mapping[AttentionSite, tuple[int, int]],
    blocks: Mapping[AttentionSite, AttentionBlock] | None = None,
) -> None:
    """Resize a freshly built model in place to ``counts[site] = (query heads, key/value heads)``.

    Used when loading a pruned checkpoint: the weights are read afterwards, so
    which heads are kept here does not matter, only how many. ``blocks``: the model's
    :func:`find_attention_blocks`, when the caller has them.
    """
    blocks = find_attention_blocks(loaded) if blocks is None else blocks
    for site, (heads, kv_heads) in counts.items():
        block = blocks.get(site)
        if block is None:
            raise UnsupportedModelError(
                f"the pruned checkpoint names attention site {site.name}, which the model lacks"
            )
        if heads == block.num_heads and kv_heads == block.num_kv_heads:
            continue
        if kv_heads < 1 or heads % kv_heads or heads > block.num_heads or kv_heads > block.num_kv_heads:
            raise UnsupportedModelError(
                f"the pruned checkpoint gives {site.name} {heads} heads and {kv_heads} key/value heads, "
                f"which cannot come from {block.num_heads} and {block.num_kv_heads}"
            )
        per_group = heads // kv_heads
        keep = [g * block.group_size + j for g in range(kv_heads) for j in range(per_group)]
        slice_block(block, SitePlan(removed=[], keep_heads=keep, keep_kv_heads=list(range(kv_heads))))
