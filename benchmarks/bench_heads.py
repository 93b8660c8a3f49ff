"""Benchmark: ``attnviz heads`` probing on SmolLM2-135M against a plain sdpa forward of the same probes.

Prints, measured side by side in one process (contenders interleaved round by round, fastest
round kept, so a busy machine slows both alike):

* the sdpa forward pass of the default probe batches (16 × 101 tokens), no observers;
* ``attnviz.heads.probe_scores``: the same batches through attnviz's core with the streaming
  probe-score observer (token draw included);
* their ratio, and the model load time.

    python benchmarks/bench_heads.py               # 3 rounds
    python benchmarks/bench_heads.py --threads 1   # on a crowded machine one thread can be faster
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from attnviz.heads.compute import probe_scores
from attnviz.heads.probes import ProbeSettings, probe_batches
from attnviz.models.specs import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--sequences", type=int, default=ProbeSettings().sequences)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    loaded = load_model("smollm2", device="cpu")
    load_seconds = time.perf_counter() - start
    settings = ProbeSettings(sequences=args.sequences)
    batches = probe_batches(loaded, settings)
    tokens = sum(probe.batch.inputs["input_ids"].numel() for probe in batches)
    model = loaded.model.base_model

    def sdpa() -> None:
        model.set_attn_implementation("sdpa")
        try:
            with torch.no_grad():
                for probe in batches:
                    model(input_ids=probe.batch.inputs["input_ids"], use_cache=False)
        finally:
            model.set_attn_implementation("attnviz")

    def attnviz_probe() -> None:
        probe_scores(loaded, settings)

    best = {"sdpa": float("inf"), "attnviz": float("inf")}
    for _ in range(args.rounds):
        for name, run in (("sdpa", sdpa), ("attnviz", attnviz_probe)):
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    print(
        f"SmolLM2-135M, {settings.sequences} probes × {tokens // settings.sequences} tokens ({tokens} tokens), "
        f"{torch.get_num_threads()} threads, fastest of {args.rounds} rounds, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"  model load              {load_seconds:6.2f} s")
    print(f"  sdpa forward            {best['sdpa']:6.2f} s")
    print(f"  attnviz probe scores    {best['attnviz']:6.2f} s   ({best['attnviz'] / best['sdpa']:.2f}× sdpa)")


if __name__ == "__main__":
    main()
