"""Benchmark: the statistics pass on a CUDA GPU against a plain sdpa forward of the same model, same tokens, same dtype.

Builds LLaMA-architecture models with random weights (no download) in two layer shapes — SmolLM2-135M's (576 wide,
9 query heads sharing 3 key/value heads of 64) and LLaMA-3-8B's (4,096 wide, 32 query heads sharing 8 of 128), with
``--layers`` layers each — and, for every length and dtype, times in one process, interleaved, fastest of
``--rounds``:

* ``sdpa``: transformers' sdpa forward (flash attention on the GPU), no weights kept — the floor;
* ``stats``: :func:`attnviz.compute_statistics` on the same tokens: on the GPU every layer runs the Triton tile
  kernel (:mod:`attnviz.core.triton_rows`), which computes the output and each row's summary in one pass;

and prints the ratio with each one's peak GPU memory. Targets: stats ≤ 1.3× sdpa at 2,048–32,768 tokens.

The pass chooses its kernel's launch itself: the first call of each kind times the candidate launches on the GPU
(:mod:`attnviz.core.triton_launch`; the fastest of the rounds is reported, so that first call is not), and the
script prints what it chose with every candidate's time. ``--tune`` first times the kernel alone, one layer's heads
at ``--tune-tokens``, against torch's ``scaled_dot_product_attention`` (causal, same dtype), for each candidate,
and in float32 the fastest with the other arithmetic of its products.

    python benchmarks/bench_stats_gpu.py                                   # both shapes, 2k–32k, fp32 and bf16
    python benchmarks/bench_stats_gpu.py --shapes smollm2 --tokens 2048,8192 --dtypes bfloat16 --tune
"""

from __future__ import annotations

import argparse
import functools
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

#: layer shapes: hidden size, query heads, key/value heads, MLP width
SHAPES = {
    "smollm2": {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536},
    "llama8b": {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336},
}


def tune(shape: str, dtype: torch.dtype, length: int) -> None:
    """Time the tile kernel alone (every statistic on: band, two key columns, a carrier's weights) for each candidate
    launch against sdpa on one layer's heads."""
    import triton.testing

    from attnviz.core import triton_rows
    from attnviz.core.kernel_calls import RowSummary
    from attnviz.core.triton_launch import CANDIDATE_LAUNCHES

    heads, kv_heads = SHAPES[shape]["num_attention_heads"], SHAPES[shape]["num_key_value_heads"]
    head_dim = SHAPES[shape]["hidden_size"] // heads
    torch.manual_seed(0)
    query = torch.randn(1, heads, length, head_dim, device="cuda", dtype=dtype)  # [b, h, q, d]
    key, value = (torch.randn(1, kv_heads, length, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    output = torch.empty(1, length, heads, head_dim, device="cuda", dtype=dtype)  # [b, q, h, dv]
    columns = (0, length - 1)
    summary = RowSummary(torch.empty(RowSummary.buffer_shape(1, heads, length, 1, 2), device="cuda"), columns)
    key_weights = torch.rand(1, heads, length, device="cuda")
    weighted = torch.empty(1, heads, length, device="cuda")
    sdpa = triton.testing.do_bench(
        lambda: torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
    )
    statistics = {"summary": summary, "key_weights": key_weights, "weighted": weighted}
    best = None
    for launch in CANDIDATE_LAUNCHES:
        run = functools.partial(
            triton_rows.attend_rows_triton, query, key, value, head_dim**-0.5, output, causal=True, launch=launch,
            **statistics,
        )  # fmt: skip
        try:
            milliseconds = triton.testing.do_bench(run)
        except Exception as error:  # noqa: BLE001  # a launch that needs more registers or shared memory than the GPU has
            print(f"  tune {shape} {dtype} {launch}: {type(error).__name__}: {str(error)[:120]}")
            continue
        print(
            f"  tune {shape} {str(dtype)[6:]} {length} tokens {launch.label}: "
            f"sdpa {sdpa:.3f} ms  kernel with statistics {milliseconds:.3f} ms ({milliseconds / sdpa:.2f}x)"
        )
        if best is None or milliseconds < best[0]:
            best = (milliseconds, launch)
    if best is not None:
        plain = triton.testing.do_bench(
            functools.partial(
                triton_rows.attend_rows_triton, query, key, value, head_dim**-0.5, output, causal=True, launch=best[1]
            )
        )
        print(f"  tune {shape} {str(dtype)[6:]}: fastest {best[1].label}; without statistics {plain:.3f} ms")
        if dtype == torch.float32:
            compare_full_precision(shape, (query, key, value, head_dim**-0.5, output), statistics, best)


def compare_full_precision(shape: str, inputs: tuple, statistics: dict, best: tuple) -> None:
    """The fastest float32 launch again with the other arithmetic of its products (full precision where the default
    is three TF32 products, and the reverse): its time, and how far the output and statistics lie apart."""
    import dataclasses

    import triton.testing

    from attnviz.core import triton_rows

    default = triton_rows.float32_precision(best[1].float32_products)
    other = "ieee" if default == "tf32x3" else "tf32x3"
    launch = dataclasses.replace(best[1], float32_products=other)
    gaps = precision_gaps(inputs, statistics, best[1], launch)
    run = functools.partial(triton_rows.attend_rows_triton, *inputs, causal=True, launch=launch, **statistics)
    milliseconds = triton.testing.do_bench(run)
    print(
        f"  tune {shape} float32 products as {other} instead of {default}: {milliseconds:.3f} ms against "
        f"{best[0]:.3f} ms; largest differences: " + ", ".join(f"{name} {gap:.1e}" for name, gap in gaps.items())
    )


def precision_gaps(inputs: tuple, statistics: dict, exact, other) -> dict[str, float]:
    """The largest differences of the output and of each statistic between the launches ``exact`` and ``other``
    on ``inputs`` (query, key, value, scaling, output), causal, with ``statistics`` (summary, key weights, weighted)."""
    from attnviz.core import triton_rows
    from attnviz.core.kernel_calls import RowSummary

    output, summary, weighted = inputs[4], statistics["summary"], statistics["weighted"]
    results = []
    for launch in (exact, other):
        triton_rows.attend_rows_triton(*inputs, causal=True, launch=launch, **statistics)
        results.append((output.clone(), RowSummary(summary.values.clone(), summary.columns), weighted.clone()))
    (output_0, fields_0, weighted_0), (output_1, fields_1, weighted_1) = results
    gaps = {
        "output": output_1.float() - output_0.float(),
        "max weight": fields_1.max_weight - fields_0.max_weight,
        "entropy": fields_1.entropy - fields_0.entropy,
        "distance": fields_1.distance - fields_0.distance,
        "weighted": weighted_1 - weighted_0,
    }
    return {name: float(gap.abs().max()) for name, gap in gaps.items()}


def build(shape: str, layers: int, dtype: torch.dtype, positions: int, device: str):
    """A random LLaMA model of ``shape`` (MiniLM's tokenizer, no download), and the same model wrapped by attnviz."""
    import transformers

    import attnviz
    from attnviz.models.specs import minilm_path

    config = transformers.LlamaConfig(
        **SHAPES[shape], num_hidden_layers=layers, vocab_size=30522, max_position_embeddings=positions + 8
    )
    torch.manual_seed(0)
    with torch.device(device):  # drawn where it runs: an 8B-wide model's random init on the CPU takes a while
        model = transformers.LlamaForCausalLM(config).to(dtype=dtype).eval()
    model.set_attn_implementation("sdpa")
    return model, attnviz.wrap(model, transformers.AutoTokenizer.from_pretrained(minilm_path()))


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(function, device: str) -> tuple[float, int]:
    """Seconds ``function`` takes, and the GPU's peak memory meanwhile (0 on the CPU)."""
    synchronize(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    function()
    synchronize(device)
    return time.perf_counter() - start, torch.cuda.max_memory_allocated() if device == "cuda" else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="smollm2,llama8b")
    parser.add_argument("--tokens", default="2048,8192,32768")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="cuda; cpu only checks that the script runs")
    parser.add_argument("--tune", action="store_true", help="time the kernel's launches first and use the fastest")
    parser.add_argument("--tune-tokens", type=int, default=8192)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU (--device cpu only checks that it runs)")
    from attnviz.core.triton_rows import triton_available

    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    print(f"device: {where}; Triton: {'yes' if triton_available() else 'no (torch operations)'}")
    lengths = [int(value) for value in args.tokens.split(",")]
    for shape in args.shapes.split(","):
        for dtype_name in args.dtypes.split(","):
            if args.tune and args.device == "cuda":
                tune(shape, getattr(torch, dtype_name), args.tune_tokens)
            measure_shape(shape, dtype_name, lengths, args)
            if args.device == "cuda":
                torch.cuda.empty_cache()
    if args.device == "cuda":
        report_launches()


def report_launches() -> None:
    """The launch the pass chose for each kind of call it timed in this process, and every candidate's time."""
    from attnviz.core.triton_launch import shared_tuner

    tuner = shared_tuner()
    print(f"launches (kept in {tuner.path}):")
    for kind, launch in tuner.chosen.items():
        times = ", ".join(
            f"{label} {'failed' if ms is None else f'{ms:.3f} ms'}" for label, ms in tuner.timings.get(kind, {}).items()
        )
        print(
            f"  {kind.dtype} d{kind.head_size} {kind.keys_shown} q{kind.queries} x{kind.programs}: {launch.label} ({times})"
        )


def measure_shape(shape: str, dtype_name: str, lengths: list[int], args: argparse.Namespace) -> None:
    """Print sdpa against the statistics pass at every length, for one layer shape and dtype."""
    import attnviz

    model, loaded = build(shape, args.layers, getattr(torch, dtype_name), max(lengths), args.device)
    for length in lengths:
        batch = loaded.encode([" ".join(["hello"] * (length - 2))])  # [CLS] + words + [SEP]
        ids = batch.inputs["input_ids"]
        forward = functools.partial(model.model, input_ids=ids)
        statistics = functools.partial(attnviz.compute_statistics, loaded, batches=[batch], progress=False)
        best = {"sdpa": (float("inf"), 0), "stats": (float("inf"), 0)}
        try:
            for _ in range(args.rounds):
                with torch.no_grad():
                    best["sdpa"] = min(best["sdpa"], timed(forward, args.device))
                best["stats"] = min(best["stats"], timed(statistics, args.device))
        except torch.cuda.OutOfMemoryError:
            print(f"{shape} {dtype_name} {length}: out of GPU memory")
            torch.cuda.empty_cache()
            continue
        (sdpa, sdpa_peak), (stats, stats_peak) = best["sdpa"], best["stats"]
        print(
            f"{shape} {dtype_name} {ids.shape[1]:>6} tokens: sdpa {sdpa * 1e3:8.1f} ms "
            f"({sdpa_peak / 2**30:.2f} GiB)  stats {stats * 1e3:8.1f} ms ({stats_peak / 2**30:.2f} GiB)  "
            f"{stats / sdpa:.2f}x"
        )


if __name__ == "__main__":
    main()
