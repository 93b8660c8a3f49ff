"""The attention core: the one implementation of the attention math in attnviz.

Hugging Face models reach it through :mod:`attnviz.core.hf`; attnviz's toy
models call :func:`attend` directly. Because every pattern is computed here,
capture, streaming statistics and head masks work the same for every model.

Vocabulary (TransformerLens'): ``scores`` are pre-softmax logits, ``pattern``
is the softmaxed weights. Shapes use

    b  batch           h  query heads        kvh key/value heads (≤ h, GQA)
    q  query positions k  key positions      d  query/key head size   dv value head size

The computation per (batch, head)::

    scores  = Q Kᵀ · scale (+ bias) (+ additive mask)       [b, h, q, k]
    pattern = softmax(scores) in float32                     [b, h, q, k]
    pattern = dropout(pattern) · head_mask[h]
    output  = pattern V                                      [b, h, q, dv] -> [b, q, h, dv]

With attention sinks (gpt-oss's learned ``sinks``, passed by transformers as ``s_aux``) each row's softmax
also takes the head's sink logit, a column with no value: ``softmax([scores, sink])`` with the sink column
dropped, so the pattern's rows sum to ``1 − sink share``. The value head size ``dv`` is the value tensor's own
(it differs from ``d`` in multi-head latent attention, DeepSeek-V2/V3).

Long inputs are processed in blocks of queries so that the full ``[b, h, q, k]``
tensor never has to exist; without gradients the blocks are computed in reused
buffers and skip keys the mask hides from the whole block (the causal future).
Whether to block depends only on the shapes, and how to compute only on the
inputs, never on who observes the pattern, so a model's outputs are bit-for-bit
the same with and without capture.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn

from attnviz.core.blocks import _workspace, attend_in_buffers  # noqa: F401 (re-exported)
from attnviz.core.key_range import KeyLayout, causal_mask, key_stops  # noqa: F401 (re-exported)
from attnviz.core.patching import HeadEditor
from attnviz.core.sdpa_rows import attend_observing_rows
from attnviz.core.softmax import SoftmaxPattern, softmax_pattern, softmax_with_sinks  # noqa: F401 (re-exported)

#: Above this many elements in one ``[b, h, q, k]`` score tensor, queries are processed in blocks.
#: 2**21 float32 values are 8 MiB: a block stays in the last-level cache through the several
#: passes made over it (scale, mask, softmax, observers, pattern·V), and the buffers stay
#: small next to a layer's full pattern at long lengths (SmolLM2 at 2048 tokens: 151 MB).
BLOCK_ELEMENTS = 2**21
#: The same bound on an accelerator, where there is no cache to stay in and each block costs a score of
#: kernel launches and observer calls: 2**26 values (256 MiB) make a few blocks a layer at 8,192 tokens, not hundreds.
ACCELERATOR_BLOCK_ELEMENTS = 2**26


@dataclass(frozen=True, order=True)
class AttentionSite:
    """Where an attention call happens.

    ``stack`` is ``"self"`` for encoder-only and decoder-only models, and
    ``"encoder"``, ``"decoder"`` (decoder self-attention) or ``"cross"``
    (decoder queries over encoder keys) for encoder-decoder models.
    """

    stack: str
    layer: int

    @property
    def name(self) -> str:
        """``"{stack}.{layer}"``: the tensor name used in capture files."""
        return f"{self.stack}.{self.layer}"

    @classmethod
    def parse(cls, name: str) -> AttentionSite:
        stack, _, layer = name.rpartition(".")
        return cls(stack, int(layer))


class AttentionObserver(Protocol):
    """Receives every pattern the core computes, block by block, as the model runs.

    An observer may set the class attribute ``accepts_key_prefix = True`` to say that it
    reads the pattern only during :meth:`observe` and copes with fewer key columns: it then
    receives ``[b, h, block, c]`` with ``c ≤ k``, the leading keys (every later key has
    weight exactly 0), in a buffer the core reuses as soon as ``observe`` returns. Other
    observers receive a full-width ``[b, h, block, k]`` tensor of their own, which they may keep.

    An observer with ``accepts_key_prefix`` may also set ``accepts_scores = True``: it is then
    called as ``observe(site, pattern, query_start, scores=scores)``, where ``scores`` is the
    float32 ``[b, h, block, c]`` input of the softmax (scaled, biased, masked) when the core
    has it, else None. ``ln pattern = scores − logsumexp(scores)`` saves a log pass.

    It may also set ``accepts_inputs = True``: before the first block of each attention call it is
    then called as ``observe_inputs(site, query, key, value, scaling)`` with the call's query
    ``[b, h, q, d]`` and key and value ``[b, kvh, k, d]`` (after position encoding, before repeating
    grouped key/value heads) and the score scale (None for a custom pattern function). It must not
    modify them (norm-based weighting, :mod:`attnviz.core.weighting`, reads the values there).

    It may also set ``accepts_summary = True``: when the fused kernel computed the block
    (:mod:`attnviz.core.kernel`) it then also receives ``summary=``, a
    :class:`~attnviz.core.kernel_calls.RowSummary` of each row (max weight, entropy, mean distance,
    the weights on the keys ``i − r … i + r`` for ``r`` = its ``summary_band_reach``, 1 if unset)
    that it must not keep past ``observe`` either.

    It may also set ``accepts_weighted_sum = True`` and define ``key_weights(site)``, returning float32
    ``[b, h, k]`` per-key quantities for the call in progress (or None): where the kernel computes a whole block
    (:func:`attnviz.core.kernel_calls.attend_block_`) it then also receives ``weighted=``, ``Σ_j pattern_ij ·
    key_weights_j`` ``[b, h, block]``, summed while each row is in the cache (one such observer per call).

    It may also set ``accepts_sink_share = True``: where the call has attention sinks it then also receives
    ``sink_share=``, float32 ``[b, h, block]`` (``[b, h, q]`` with ``pattern=None``): the weight each row gives its
    head's sink, which the pattern's rows lack (they sum to ``1 − sink_share``). Without sinks it is not passed.

    It may also set ``accepts_summary_only = True`` (with ``accepts_summary``) and define
    ``summary_columns(site)``, the key positions whose weights it reads: when every observer of a call
    says so, the kernel computes the call tile by tile of keys without ever writing a pattern
    (:func:`attnviz.core.kernel_calls.attend_rows_`) and calls ``observe(site, None, 0, summary=…)`` once,
    the summary covering every query and holding the weights on the union of those columns
    (:meth:`~attnviz.core.kernel_calls.RowSummary.column`).

    Such an observer may also define ``keeps_summary(device)``: when it returns True for the call's device, the
    summary, ``weighted`` and ``sink_share`` of that call are fresh tensors, never reused, and observers that define
    it receive ``owned=True`` and may keep them (to reduce many layers at once: on a GPU each operation costs a
    launch from the host).
    """

    def observe(self, site: AttentionSite, pattern: Tensor, query_start: int) -> None:
        """``pattern``: float32 ``[b, h, block, k]``, rows ``query_start … query_start+block-1``.

        It is the softmax output, before dropout and head masking. Observers
        must not modify it.
        """


class HeadMask:
    """Per-site multipliers on each head's pattern (1 keeps a head, 0 removes it).

    Values between 0 and 1, or tensors that require grad, are allowed: that is
    how gradient importance (Michel et al., 2019) differentiates the loss with
    respect to a head-mask variable ξ at 1.
    """

    def __init__(self, masks: Mapping[AttentionSite, Tensor] | None = None):
        self.masks: dict[AttentionSite, Tensor] = dict(masks or {})

    @classmethod
    def from_matrix(cls, matrix: Tensor, stack: str = "self") -> HeadMask:
        """``matrix``: ``[layer, head]``; row ``l`` masks ``AttentionSite(stack, l)``."""
        return cls({AttentionSite(stack, layer): matrix[layer] for layer in range(matrix.shape[0])})

    def for_site(self, site: AttentionSite | None) -> Tensor | None:
        """``[h]`` multipliers for ``site``, or ``None`` when the site is not masked."""
        if site is None:
            return None
        return self.masks.get(site)


@dataclass
class AttentionContext:
    """What travels with one forward pass: observers, a head mask, and how to name sites.

    It is handed to the model as a forward keyword argument (``attnviz_context``),
    so no global state is involved and two models can be captured at once.
    """

    observers: Sequence[AttentionObserver] = ()
    head_mask: HeadMask | None = None
    #: maps an attention module to its site; set by the loaded model (see ``attnviz.loading``).
    site_of: Callable[[nn.Module], AttentionSite | None] = field(default=lambda module: None)
    #: compute scale, mask and softmax with the fused kernel (:mod:`attnviz.core.kernel`) when it is
    #: loaded: the corpus passes (statistics, probes) ask for it; captures keep torch's softmax, whose
    #: patterns equal transformers' eager attention to float32 rounding of the matrix products alone.
    fused_softmax: bool = False
    #: reads or replaces each head's output (and pattern) at every site: activation patching and ablation
    #: (:mod:`attnviz.core.patching`); None leaves them as computed
    head_editor: HeadEditor | None = None
    #: the query positions whose pattern the observers need (one query's strips need one row), or None for
    #: every row. When set, layers on the standard softmax without gradients take the model's fast path,
    #: torch's ``scaled_dot_product_attention``, for their output, and compute only these rows' pattern
    #: (:mod:`attnviz.core.sdpa_rows`); observers then receive one block of these rows per site. Elsewhere
    #: (a custom pattern, a bias, soft-capping, gradients, dropout) they may still receive every row.
    observed_queries: range | None = None


#: ``(query_block [b,h,blk,d], key [b,h,k,d], mask_block [b,1|h,blk,k] or None, query_start) -> pattern [b,h,blk,k]``
#: (float32, rows summing to 1 over visible keys). Toy attention variants supply their own.
PatternFunction = Callable[[Tensor, Tensor, "Tensor | None", int], Tensor]


def repeat_kv(states: Tensor, n_rep: int) -> Tensor:
    """Repeat key/value heads for grouped-query attention: ``[b, kvh, k, d] -> [b, kvh·n_rep, k, d]``.

    Query head ``i`` reads key/value head ``i // n_rep`` (same as ``repeat_interleave``).
    """
    if n_rep == 1:
        return states
    batch, kv_heads, length, head_dim = states.shape
    states = states[:, :, None, :, :].expand(batch, kv_heads, n_rep, length, head_dim)  # [b, kvh, n_rep, k, d]
    return states.reshape(batch, kv_heads * n_rep, length, head_dim)  # [b, h, k, d]


def query_block_size(batch: int, heads: int, query_len: int, key_len: int, device: torch.device | None = None) -> int:
    """How many queries to process at once: all of them unless that exceeds :data:`BLOCK_ELEMENTS` (on the CPU)
    or :data:`ACCELERATOR_BLOCK_ELEMENTS` (elsewhere)."""
    per_query = max(1, batch * heads * key_len)
    elements = BLOCK_ELEMENTS if device is None or device.type == "cpu" else ACCELERATOR_BLOCK_ELEMENTS
    return max(1, min(query_len, elements // per_query))


def attend(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    mask: Tensor | KeyLayout | None = None,
    causal: bool = False,
    scaling: float | None = None,
    pattern_fn: PatternFunction | None = None,
    dropout: float = 0.0,
    training: bool = False,
    site: AttentionSite | None = None,
    context: AttentionContext | None = None,
) -> Tensor:
    """Multi-head attention.

    Args:
        query: ``[b, h, q, d]``.
        key, value: ``[b, kvh, k, d]`` and ``[b, kvh, k, dv]``, ``h`` a multiple of ``kvh`` (grouped-query
            attention); ``dv`` may differ from ``d`` (multi-head latent attention).
        mask: additive ``[b|1, 1|h, q, k]`` mask, 0 where a query may look and a large
            negative number where it may not (causal future, padding keys); or a :class:`KeyLayout`, a causal mask
            (with a sliding window, with padding) or padding alone, said without a ``[q, k]`` tensor: the tile
            kernels apply it by position, the other paths build one block of its rows at a time.
        causal: without ``mask``, query ``i`` sees keys ``j ≤ i`` only (``q == k``): ``mask=KeyLayout()``.
        scaling: score scale, ``d ** -0.5`` by default. Ignored when ``pattern_fn`` is given.
        pattern_fn: computes the pattern from a block of queries; default scaled dot-product.
        dropout, training: attention dropout probability, applied only when training.
        site, context: where this call is, and the observers / head mask of this pass.

    Returns:
        ``[b, q, h, dv]`` (contiguous): each head's output, ready to be merged into ``[b, q, h·dv]``.

    Two paths compute the same numbers. The standard softmax pattern, when no gradient is
    needed, runs in reused buffers, shares key/value heads without repeating them, and skips
    keys the mask hides from a whole block (:func:`key_stops`). Anything else (a custom
    ``pattern_fn``, or tensors that need gradients) runs on fresh tensors. The choice depends
    on the inputs only, never on the observers.
    """
    batch, heads, query_len, head_dim = query.shape
    key_len = key.shape[2]
    if pattern_fn is None:
        pattern_fn = softmax_pattern(head_dim**-0.5 if scaling is None else scaling)
    if causal and mask is None:
        mask = KeyLayout()
    if isinstance(mask, KeyLayout) and mask.masks_nothing:
        mask = None
    if isinstance(mask, KeyLayout) and mask.causal and query_len != key_len:
        raise ValueError(f"a causal key layout needs as many queries as keys, not {query_len} and {key_len}")

    # observers file what they see by site: a module the hook could not place has none to see
    observers = context.observers if context is not None and site is not None else ()
    head_mask = context.head_mask.for_site(site) if context is not None and context.head_mask is not None else None
    if head_mask is not None:
        head_mask = head_mask.to(dtype=value.dtype, device=value.device).view(1, heads, 1, 1)  # [1, h, 1, 1]

    scale = pattern_fn.scaling if isinstance(pattern_fn, SoftmaxPattern) else None
    for observer in observers:
        if getattr(observer, "accepts_inputs", False):
            getattr(observer, "observe_inputs")(site, query, key, value, scale)  # noqa: B009 (an optional method)

    block = query_block_size(batch, heads, query_len, key_len, query.device)
    bias = pattern_fn.bias if isinstance(pattern_fn, SoftmaxPattern) else None
    sinks = pattern_fn.sinks if isinstance(pattern_fn, SoftmaxPattern) else None
    editor = context.head_editor if context is not None and site is not None else None
    edits_patterns = editor is not None and site is not None and editor.edits_patterns(site)
    if (
        isinstance(pattern_fn, SoftmaxPattern)
        and not edits_patterns
        and not _needs_grad(query, key, value, mask, bias, head_mask, sinks)
    ):
        rows = context.observed_queries if context is not None else None
        # sdpa has no sinks: a call with them takes the block path below
        plain = bias is None and pattern_fn.softcap is None and sinks is None
        if rows is not None and plain and not (dropout and training):
            output = attend_observing_rows(query, key, value, mask, pattern_fn, rows, observers, site, head_mask)
            return output if editor is None or site is None else editor.edit_output(site, output)
        fused = context is not None and context.fused_softmax
        output = attend_in_buffers(
            query, key, value, mask, pattern_fn, block, observers, site, head_mask, dropout, training, fused
        )
        return output if editor is None or site is None else editor.edit_output(site, output)

    layout = mask if isinstance(mask, KeyLayout) else None  # the paths below read the mask block by block
    n_rep = heads // key.shape[1]
    key = repeat_kv(key, n_rep)  # [b, h, k, d]
    value = repeat_kv(value, n_rep)  # [b, h, k, d]
    outputs = []
    for start in range(0, query_len, block):
        stop = min(start + block, query_len)
        if layout is not None:
            mask_block = layout.additive_rows(start, stop - start, key_len, query.dtype, query.device)
        elif isinstance(mask, Tensor):
            mask_block = mask[:, :, start:stop] if mask.shape[2] > 1 else mask
        else:
            mask_block = None
        sink_share = None  # [b, h, blk]: each row's weight on its head's sink, where there are sinks
        if isinstance(pattern_fn, SoftmaxPattern):
            pattern, sink_share = pattern_fn.pattern_and_sink_share(query[:, :, start:stop], key, mask_block, start)
        else:
            pattern = pattern_fn(query[:, :, start:stop], key, mask_block, start)  # [b, h, blk, k] float32
        for observer in observers:
            assert site is not None  # observers are kept only for a known site (above)
            if sink_share is not None and getattr(observer, "accepts_sink_share", False):
                observer.observe(site, pattern, start, sink_share=sink_share)  # type: ignore[call-arg]
            else:
                observer.observe(site, pattern, start)
        if edits_patterns and editor is not None and site is not None:
            pattern = editor.edit_pattern(site, pattern, start)
        weights = pattern.to(value.dtype)
        if dropout and training:
            weights = nn.functional.dropout(weights, p=dropout, training=True)
        if head_mask is not None:
            weights = weights * head_mask
        outputs.append(torch.matmul(weights, value))  # [b, h, blk, dv]
    output = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)  # [b, h, q, dv]
    output = output.transpose(1, 2).contiguous()  # [b, q, h, dv]
    return output if editor is None or site is None else editor.edit_output(site, output)


def _needs_grad(*tensors: Tensor | KeyLayout | None) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)
