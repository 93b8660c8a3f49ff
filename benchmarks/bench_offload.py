"""Benchmark: what a model offloaded by accelerate costs against the same model in memory.

Loads one model twice — held in memory, and with ``max_memory`` and ``offload_folder`` so that accelerate keeps
the layers that do not fit on the disk and reads each one back during every forward (how a model larger than the
machine's memory runs) — then times ``attnviz.compute_statistics`` on the same texts both ways, interleaved,
fastest of ``--rounds``, and prints the ratio with the statistics' largest difference (0 expected).

    python benchmarks/bench_offload.py                          # MiniLM, everything offloaded to the disk
    python benchmarks/bench_offload.py --model smollm2 --memory 200MB --texts 8
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

import attnviz
from attnviz.common.texts import load_texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--memory", default="200KB", help="accelerate's max_memory for the CPU (default: none fits)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--texts", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: the machine's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    texts = load_texts()[: args.texts]
    with tempfile.TemporaryDirectory() as folder:
        in_memory = attnviz.load_model(args.model, device="cpu")
        offloaded = attnviz.load_model(args.model, device="cpu", max_memory={"cpu": args.memory}, offload_folder=folder)
        places = sorted(set(offloaded.model.hf_device_map.values()))
        best = {"memory": float("inf"), "offloaded": float("inf")}
        results = {}
        for _ in range(args.rounds):
            for label, model in (("memory", in_memory), ("offloaded", offloaded)):
                start = time.perf_counter()
                results[label] = attnviz.compute_statistics(model, texts)
                best[label] = min(best[label], time.perf_counter() - start)
    difference = max(
        abs(value - dict(other)[name])
        for (_, _, values), (_, _, other) in zip(results["memory"].heads(), results["offloaded"].heads())
        for name, value in values.items()
        if not math.isnan(value)
    )
    print(f"{args.model}: {args.texts} texts, {torch.get_num_threads()} threads, offloaded to {', '.join(places)}")
    print(f"  in memory  {best['memory']:.3f} s")
    print(f"  offloaded  {best['offloaded']:.3f} s  ({best['offloaded'] / best['memory']:.2f}x)")
    print(f"  largest statistic difference: {difference:.1e}")


if __name__ == "__main__":
    main()
