"""Benchmark: ``attnviz diff`` of two models over the shipped corpus against one ``attnviz stats`` run.

Prints, measured side by side in one process on SmolLM2-135M (the ``smollm2`` model, loaded twice):

1. diff time ÷ stats time. A diff runs both models over every batch (model A in a worker thread,
   one layer ahead of B) and accumulates both models' statistics plus the divergence of every
   matched head, so ≈ 2× a stats run is the floor; the ratio to 2 × stats is the cost of pairing
   the patterns and computing the divergences;
2. peak memory of each call above what was resident before it (both models' weights are resident
   already): a diff holds at most three layers of A's patterns of one batch and one block of B's.

Timings interleave the contenders round by round and keep each one's fastest round, so a busy
machine slows both alike; the per-round ratios are printed as median (min–max). Both wall time and
CPU time (all threads of the process) are measured: on a machine shared with other work, torch's
intra-op threads wait for each other and wall times swing, so the benchmark runs torch on one
intra-op thread by default (``--threads``); a diff's two models then still run at once, one per thread.

    python benchmarks/bench_diff.py             # the shipped corpus, 3 rounds
    python benchmarks/bench_diff.py --quick     # its first 60 lines, 2 rounds (a smoke run)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from bench_stats import MB, peak_memory

from attnviz.common.texts import default_corpus_path, read_examples
from attnviz.compare import compare_models
from attnviz.models.specs import load_model
from attnviz.stats import compute_statistics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer texts and rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    texts = read_examples(default_corpus_path())
    if args.quick:
        texts = texts[:60]
    rounds = args.rounds or (2 if args.quick else 3)
    model_a = load_model("smollm2", device="cpu")
    model_b = load_model("smollm2", device="cpu")

    def stats():
        return compute_statistics(model_a, texts, progress=False)

    def diff():
        return compare_models(model_a, model_b, texts, progress=False)

    stats_memory, stats_result = peak_memory(stats)  # also the warm-up (kernel build, tokenizer caches)
    diff_memory, diff_result = peak_memory(diff)
    worst = max(h.js_divergence for h in diff_result.heads)
    rounds_measured = []
    for _ in range(rounds):  # contenders alternate within each round
        times = {}
        for name, fn in (("stats", stats), ("diff", diff)):
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            times[name] = (time.perf_counter() - wall, time.process_time() - cpu)
        rounds_measured.append(times)
    best = {name: min(r[name][0] for r in rounds_measured) for name in ("stats", "diff")}
    best_cpu = {name: min(r[name][1] for r in rounds_measured) for name in ("stats", "diff")}

    def ratios(index: int) -> str:
        values = sorted(r["diff"][index] / r["stats"][index] for r in rounds_measured)
        return f"{statistics.median(values):.2f} ({values[0]:.2f}–{values[-1]:.2f})"

    tokens = stats_result.num_tokens
    print(f"corpus: {len(texts)} texts, {tokens} tokens; SmolLM2-135M, float32, CPU, {args.threads} torch thread(s)")
    print(f"stats: {best['stats']:.2f} s wall ({tokens / best['stats']:.0f} tokens/s), {best_cpu['stats']:.2f} s CPU")
    print(f"diff:  {best['diff']:.2f} s wall, {best_cpu['diff']:.2f} s CPU (two models, {tokens} tokens each)")
    print(f"diff ÷ stats, wall: {ratios(0)}; CPU: {ratios(1)} (median (min–max) of per-round ratios)")
    print(
        f"diff CPU ÷ (2 × stats CPU): {best_cpu['diff'] / (2 * best_cpu['stats']):.2f} (the cost of pairing and divergences)"
    )
    print(f"peak memory above resident: stats {stats_memory / MB:.0f} MiB, diff {diff_memory / MB:.0f} MiB")
    print(f"largest JS divergence of the model against its own copy: {worst:.3g} nats (expected 0)")


if __name__ == "__main__":
    main()
