"""The GPU counterpart of the CPU tile kernel: attention with every row's summary in one pass, in Triton.

:func:`attend_rows_triton` computes what :func:`attnviz.core.kernel_calls.attend_rows_` computes on the CPU —
``pattern V`` and each query row's :class:`~attnviz.core.kernel_calls.RowSummary` (max weight, entropy, distance,
the band of weights around the diagonal, the weights on chosen key columns) and the weighted sums of the carriers —
tile by tile of keys, flash-attention style, so that no pattern is ever written. Each program takes one head's
``BLOCK_M`` queries and walks the keys in tiles of ``BLOCK_N`` with a running maximum ``m`` and sum ``l``; the
summary's sums are rescaled with them (:mod:`attnviz.core.triton_kernel` holds the kernel, in base-2 logits)::

    l = Σ_j e^{s_j − m}            max weight = 1 / l          (the largest weight is e^{m − m} / l)
    T = Σ_j e^{s_j − m}(s_j − m)    entropy    = ln l − T / l   (−Σ_j p_j ln p_j with p_j = e^{s_j − m} / l)
    D = Σ_j e^{s_j − m}|i − j|      distance   = D / l
    W = Σ_j e^{s_j − m} w_j         weighted   = W / l
    band and columns: the raw logits s_j of those keys, turned into weights e^{s_j − m} / l at the end

When ``m`` grows to ``m'`` every sum is multiplied by ``α = e^{m − m'}``, and ``T`` also gains ``(m − m')·l``.

Which keys a query may weigh comes either from an additive mask tensor (transformers' ``[b|1, h|1, q|1, k]``), or
from a description that needs no ``[q, k]`` tensor: causal (key ``j`` visible to query ``i`` when
``j ≤ i + k − q``), a sliding window of ``window`` keys, and per-sequence ``key_start``/``key_stop`` (padding on
the left or right); the two combine. Inputs may be float32, bfloat16 or float16; scores, softmax and every
statistic are float32, the output has the value's dtype.

Triton compiles the kernel for CUDA GPUs; with ``TRITON_INTERPRET=1`` it runs on CPU tensors through NumPy
(slowly), which is how the suite checks it without a GPU.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Literal

import torch
from torch import Tensor

from attnviz.core.kernel_calls import RowSummary
from attnviz.core.triton_launch import (
    LaunchConfig,
    LaunchTuner,
    call_kind,
    may_time,
    power_of_two,
    shared_tuner,
    table_launch,
    tuning_enabled,
)


def launch_config(dtype: torch.dtype, head_dim: int) -> LaunchConfig:
    """The launch for inputs of ``dtype`` and ``head_dim`` (value size included) where none has been timed on the
    GPU: :data:`~attnviz.core.triton_launch.LAUNCH_CONFIGS` or the default."""
    return table_launch(dtype, power_of_two(head_dim, 16))


@functools.cache
def triton_available() -> bool:
    """Whether Triton imports (it is an optional dependency: ``pip install triton``)."""
    try:
        import triton
        import triton.language  # noqa: F401
    except (ImportError, RuntimeError, OSError):  # not installed, or a Triton that cannot find its compiler
        return False
    return True


def precise_tf32x3(version: str) -> bool:
    """Whether Triton ``version`` sums TF32×3's two remainder products apart from the running sum and adds them to it
    with the main product (3.2 and later; earlier ones add them into the running sum first, where an attention
    output's large running sum rounds away much of what they carry)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return found is not None and (int(found[1]), int(found[2])) >= (3, 2)


@functools.cache
def float32_precision(choice: Literal["auto", "ieee", "tf32x3"] = "auto") -> Literal["ieee", "tf32x3"]:
    """The arithmetic of float32 products that a launch's ``float32_products`` stands for with the installed Triton."""
    if choice != "auto":
        return choice
    import triton

    return "tf32x3" if precise_tf32x3(triton.__version__) else "ieee"


def interpreting() -> bool:
    """Whether Triton runs kernels on the CPU through its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_applies(query: Tensor) -> bool:
    """Whether the core runs :func:`attend_rows_triton` for ``query``: on a CUDA device, where Triton is installed
    (on the CPU the core has its own tile kernel; the interpreter is for tests, which call the kernel directly)."""
    return query.device.type == "cuda" and triton_available()


@functools.lru_cache(maxsize=64)
def _columns_on(columns: tuple[int, ...], device: torch.device) -> Tensor:
    """The key columns as an int32 tensor on ``device`` (the kernel compares them with 32-bit key positions), made
    once: a copy from the host at every layer would make the host wait for the GPU each time (a copy from pageable
    memory follows the work queued before it)."""
    return torch.tensor(columns, dtype=torch.int32, device=device)


@functools.lru_cache(maxsize=16)
def _placeholder_on(device: torch.device) -> Tensor:
    """A float32 tensor of one element on ``device``, passed where the kernel reads nothing (no mask, no sinks…),
    made once per device rather than allocated at every layer."""
    return torch.zeros(1, dtype=torch.float32, device=device)


def attend_rows_triton(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    scaling: float,
    output: Tensor,
    *,
    mask: Tensor | None = None,
    causal: bool = False,
    window: int | None = None,
    key_start: Tensor | None = None,
    key_stop: Tensor | None = None,
    summary: RowSummary | None = None,
    key_weights: Tensor | None = None,
    weighted: Tensor | None = None,
    sinks: Tensor | None = None,
    sink_share: Tensor | None = None,
    launch: LaunchConfig | None = None,
    tuner: LaunchTuner | None = None,
) -> None:
    """Attention of every query, key tile by key tile, with the rows' summary; nothing of ``[q, k]`` is written.

    ``query`` ``[b, h, q, d]``, ``key`` ``[b, kvh, k, d]``, ``value`` ``[b, kvh, k, dv]`` (``h`` a multiple of
    ``kvh``: grouped-query heads read their key/value head without a copy); ``output`` ``[b, q, h, dv]`` receives
    ``pattern V`` in its dtype. Which keys each query weighs: ``mask`` (additive ``[b|1, h|1, q|1, k]``), ``causal``,
    ``window`` (the last ``window`` keys up to the diagonal; without ``causal``, the keys less than ``window`` away),
    ``key_start``/``key_stop`` (int ``[b]``: each sequence's keys ``[start, stop)``, its padding outside).
    ``summary`` receives the rows' :class:`~attnviz.core.kernel_calls.RowSummary` (float32 ``[4 + 2r + G, b, h, q]``),
    ``weighted`` (float32 ``[b, h, q]``) each row's ``Σ_j pattern_ij · key_weights_j`` (``key_weights``
    ``[b, h, ≥k]``).
    ``sinks`` (``[h]`` logits, or None): each head's attention sink, one more softmax term without a value (its
    running max and sum start from it; the summary's entropy counts it); ``sink_share`` (float32 ``[b, h, q]``)
    then receives each row's weight on it. A row that ``key_start``/``key_stop`` leave no key (left padding
    under causality) weighs every key alike, as softmax does on transformers' mask, whose row then holds the lowest
    value on every key; under a mask of ``-inf`` such a row gets zeros; with a sink, it puts all weight on the sink.
    ``launch``: tile sizes and warps. Without one, ``tuner`` gives the launch for this kind of call, timing the
    candidates the first time (by default, on a CUDA GPU, the tuner that keeps them in attnviz's cache:
    :mod:`attnviz.core.triton_launch`); else :func:`launch_config` of the inputs.
    """
    batch, heads, query_len, head_dim = query.shape
    kv_heads, key_len, value_dim = key.shape[1], key.shape[2], value.shape[-1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads")
    if (key_start is None) != (key_stop is None):
        raise ValueError("give key_start and key_stop together")
    if mask is not None:
        mask = mask.expand(batch, heads, query_len, mask.shape[-1])[..., :key_len]  # stride 0 where broadcast
    reach = 0 if summary is None else summary.band_reach
    columns = () if summary is None else summary.columns
    dummy = _placeholder_on(query.device)
    column_tensor = _columns_on(tuple(columns) or (0,), query.device)
    strides_of = lambda tensor, count: tensor.stride() if tensor is not None else (0,) * count
    summary_values = summary.values if summary is not None else None
    block_d, block_dv = power_of_two(head_dim, 16), power_of_two(value_dim, 16)
    from attnviz.core.triton_kernel import attend_rows_kernel

    def run(chosen: LaunchConfig) -> None:
        # (triton.cdiv is a jitted function: called from the host it costs several microseconds a launch)
        attend_rows_kernel[(-(-query_len // chosen.block_m), batch * heads)](
            query, key, value,
            mask if mask is not None else dummy,
            output,
            summary_values if summary_values is not None else dummy,
            column_tensor,
            key_weights if key_weights is not None else dummy,
            weighted if weighted is not None else dummy,
            key_start if key_start is not None else column_tensor,
            key_stop if key_stop is not None else column_tensor,
            sinks if sinks is not None else dummy,
            sink_share if sink_share is not None else dummy,
            *query.stride(), *key.stride(), *value.stride(), *strides_of(mask, 4), *output.stride(),
            *strides_of(summary_values, 4), *strides_of(key_weights, 3), *strides_of(weighted, 3),
            *strides_of(sink_share, 3),
            heads, heads // kv_heads, query_len, key_len, head_dim, value_dim, float(scaling), int(window or 0),
            HAS_MASK=mask is not None, CAUSAL=causal, WINDOWED=bool(window), PADDED=key_start is not None,
            SUMMARY=summary is not None, REACH=reach, BAND_P2=power_of_two(2 * reach + 1),
            COLUMNS=len(columns), COLUMNS_P2=power_of_two(len(columns)), WEIGHTS=key_weights is not None,
            BLOCK_M=chosen.block_m, BLOCK_N=chosen.block_n,
            BLOCK_D=block_d, BLOCK_DV=block_dv, EVEN_D=block_d == head_dim and block_dv == value_dim,
            # Triton's interpreter multiplies half-precision tiles wrongly (it reads their bits as integers)
            UPCAST=query.dtype != torch.float32 and interpreting(),
            SINKS=sinks is not None, SHARE=sinks is not None and sink_share is not None,
            # float32 products as the launch says (by default three TF32 products: one would round their inputs to
            # TF32's 10-bit mantissa)
            PRECISION=float32_precision(chosen.float32_products) if query.dtype == torch.float32 else "tf32",
            num_warps=chosen.num_warps, num_stages=chosen.num_stages,
            # scaling and centring each logit as one multiply-add, whatever the installed Triton's default
            enable_fp_fusion=True,
        )  # fmt: skip

    if launch is None:
        head_size = max(block_d, block_dv)
        launch = table_launch(query.dtype, head_size)
        if tuner is None and tuning_enabled() and not interpreting() and query.device.type == "cuda":
            tuner = shared_tuner()
        if tuner is not None:
            kind = call_kind(
                query, key, head_size, statistics=summary is not None or key_weights is not None,
                keys_shown=_keys_shown(mask is not None, causal, window, key_start is not None, sinks is not None),
            )  # fmt: skip
            known = tuner.known(kind)
            if known is not None:
                launch = known
            elif query.device.type != "cuda":  # a tuner given for CPU tensors (Triton's interpreter, in tests)
                launch = tuner.launch_for(kind, run, fallback=launch)
            elif may_time(query.device, batch * heads * query_len * key_len):
                with torch.cuda.device(query.device):  # timed on that GPU's current stream
                    launch = tuner.launch_for(kind, run, fallback=launch)
    run(launch)


@functools.lru_cache(maxsize=64)
def _keys_shown(masked: bool, causal: bool, window: int | None, padded: bool, sinks: bool) -> str:
    """Which keys each query weighs, in a few words (part of a call's kind: each compiles its own code)."""
    words = ["mask" if masked else "causal" if causal else "all"]
    words += [word for word, present in (("window", window), ("padding", padded), ("sinks", sinks)) if present]
    return "+".join(words)
