"""Benchmark: what norm-based attention and "what each token carries" cost an ``attnviz stats`` pass.

Prints, measured side by side in one process (interleaved rounds, each contender's fastest round kept):

1. the statistics pass with what each token carries (``stats.carriers``, computed wherever the model's
   output projection can be cut by head) ÷ the same pass without it: one matrix–vector product per block
   of weights and one ``[b, h, k]`` tensor of value norms per layer;
2. ``weighting="norm"`` ÷ the weights: the statistics then read each block multiplied by the norms and
   renormalised, and the fused kernel's row summaries no longer apply.

    python benchmarks/bench_norm_weighting.py                 # MiniLM over the shipped corpus, 3 rounds
    python benchmarks/bench_norm_weighting.py --model smollm2 --lines 60 --threads 1
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--lines", type=int, default=200, help="lines of the shipped corpus")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    arguments = parser.parse_args()

    import torch

    from attnviz.common.texts import load_texts
    from attnviz.models.specs import load_model
    from attnviz.stats import compute

    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    model = load_model(arguments.model, device="cpu")
    texts = load_texts()[: arguments.lines]
    with_projections = compute._output_projections

    def timed(carriers: bool, weighting: str) -> float:
        compute._output_projections = with_projections if carriers else (lambda loaded, required: None)
        start = time.perf_counter()
        compute.compute_statistics(model, texts, progress=False, weighting=weighting)  # type: ignore[arg-type]
        return time.perf_counter() - start

    contenders = {"plain": (False, "weights"), "carriers": (True, "weights"), "norm": (True, "norm")}
    for carriers, weighting in contenders.values():  # warm up: kernel build, caches
        timed(carriers, weighting)
    best = {name: float("inf") for name in contenders}
    for _ in range(arguments.rounds):
        for name, (carriers, weighting) in contenders.items():
            best[name] = min(best[name], timed(carriers, weighting))
    compute._output_projections = with_projections
    print(f"{arguments.model}, {len(texts)} texts, {torch.get_num_threads()} threads, best of {arguments.rounds}:")
    print(f"  statistics without carriers {best['plain']:.2f} s")
    print(f"  with carriers               {best['carriers']:.2f} s  ({best['carriers'] / best['plain']:.2f}×)")
    print(f"  weighting='norm'            {best['norm']:.2f} s  ({best['norm'] / best['plain']:.2f}×)")


if __name__ == "__main__":
    main()
