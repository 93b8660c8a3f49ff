"""Benchmark: the statistics pass on a CUDA GPU against a plain sdpa forward of the same model, same tokens, same dtype.

Builds LLaMA-architecture models with random weights (no download) in two layer shapes — SmolLM2-135M's (576 wide,
9 query heads sharing 3 key/value heads of 64) and LLaMA-3-8B's (4,096 wide, 32 query heads sharing 8 of 128), with
``--layers`` layers each — and, for every length and dtype, times in one process, interleaved, fastest of
``--rounds``:

* ``sdpa``: transformers' sdpa forward (flash attention on the GPU), no weights kept — the floor;
* ``stats``: :func:`attnviz.compute_statistics` on the same tokens: on the GPU every layer runs the Triton tile
  kernel (:mod:`attnviz.core.triton_rows`), which computes the output and each row's summary in one pass;

and prints the ratio with each one's peak GPU memory. It also checks the pass's outputs against sdpa's logits.
Targets: stats ≤ 1.3× sdpa at 2,048–32,768 tokens.

    python benchmarks/bench_stats_gpu.py                                   # both shapes, 2k–32k, fp32 and bf16
    python benchmarks/bench_stats_gpu.py --shapes smollm2 --tokens 2048,8192 --dtypes bfloat16
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


def build(shape: str, layers: int, dtype: torch.dtype, positions: int, device: str):
    """A random LLaMA model of ``shape`` (MiniLM's tokenizer, no download), and the same model wrapped by attnviz."""
    import transformers

    import attnviz
    from attnviz.models.specs import minilm_path

    config = transformers.LlamaConfig(
        **SHAPES[shape], num_hidden_layers=layers, vocab_size=30522, max_position_embeddings=positions + 8
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
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
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU (--device cpu only checks that it runs)")
    from attnviz.core.triton_rows import triton_available

    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    print(f"device: {where}; Triton: {'yes' if triton_available() else 'no (torch operations)'}")
    lengths = [int(value) for value in args.tokens.split(",")]
    for shape in args.shapes.split(","):
        for dtype_name in args.dtypes.split(","):
            measure_shape(shape, dtype_name, lengths, args)
            if args.device == "cuda":
                torch.cuda.empty_cache()


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
