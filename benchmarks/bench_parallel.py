"""Benchmark: ``attnviz stats`` over a corpus with torchrun's processes against one process.

Prints, measured side by side in one run (contenders interleaved round by round, fastest round
kept, so a busy machine slows both alike):

* one process, torch's default threads;
* ``torchrun --standalone --nproc-per-node N`` with attnviz's default (each process takes its share
  of the cores);
* optionally (``--match``) torchrun with ``ATTNVIZ_THREADS_PER_PROCESS=match`` (as many threads per
  process as one process uses: bit-identical statistics, oversubscribed cores);
* wall times, their ratio to one process, and the largest relative difference of any statistic.

Wall time includes start-up (model load, and torchrun's own) as a user sees it.

    python benchmarks/bench_parallel.py                       # MiniLM, 960 sentences, 2 processes, 2 rounds
    python benchmarks/bench_parallel.py --sentences 240 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "attnviz" / "sample_data" / "corpus.txt"
TIMING_FIELDS = {"seconds", "tokens_per_second"}


def largest_relative_difference(one, other) -> float:
    """Largest |a − b| / max(|a|, |b|) over every number of two JSON documents of the same shape."""
    if isinstance(one, dict):
        return max(
            (largest_relative_difference(one[key], other[key]) for key in one if key not in TIMING_FIELDS), default=0.0
        )
    if isinstance(one, list):
        return max((largest_relative_difference(a, b) for a, b in zip(one, other, strict=True)), default=0.0)
    if isinstance(one, float) or isinstance(other, float):
        scale = max(abs(one), abs(other))
        return 0.0 if scale == 0 or (math.isnan(one) and math.isnan(other)) else abs(one - other) / scale
    if one != other:
        raise AssertionError(f"{one!r} != {other!r}")
    return 0.0


def run(command: list[str], env: dict[str, str], out: Path) -> tuple[float, object]:
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--sentences", type=int, default=960)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--match", action="store_true", help="also time ATTNVIZ_THREADS_PER_PROCESS=match")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-parallel-"))
    lines = [line for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(lines[i % len(lines)] for i in range(args.sentences)) + "\n", encoding="utf-8")
    base_env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    base_env.pop("OMP_NUM_THREADS", None)
    base_env.pop("ATTNVIZ_THREADS_PER_PROCESS", None)
    torchrun = [shutil.which("torchrun") or "torchrun", "--standalone", f"--nproc-per-node={args.processes}"]

    def stats_command(prefix: list[str], name: str) -> tuple[list[str], Path]:
        out = work / f"{name}.json"
        return [
            *prefix,
            "-m",
            "attnviz",
            "stats",
            args.model,
            "--data",
            str(corpus),
            "--no-table",
            "--json",
            str(out),
        ], out

    contenders: dict[str, tuple[list[str], Path, dict[str, str]]] = {}
    command, out = stats_command([sys.executable], "one")
    contenders["1 process"] = (command, out, base_env)
    command, out = stats_command(torchrun, "share")
    contenders[f"{args.processes} processes, share of cores"] = (command, out, base_env)
    if args.match:
        command, out = stats_command(torchrun, "match")
        contenders[f"{args.processes} processes, match"] = (command, out, {**base_env, THREADS: "match"})

    best: dict[str, float] = {}
    results: dict[str, object] = {}
    for round_number in range(args.rounds):
        for name, (command, out, env) in contenders.items():
            seconds, results[name] = run(command, env, out)
            best[name] = min(best.get(name, math.inf), seconds)
            print(f"round {round_number + 1}: {name:<34} {seconds:7.2f} s", flush=True)

    reference_name = "1 process"
    print(f"\n{args.model}, {args.sentences} sentences, {os.cpu_count()} CPUs, fastest of {args.rounds} round(s):")
    for name, seconds in best.items():
        difference = largest_relative_difference(results[reference_name], results[name])
        print(
            f"  {name:<34} {seconds:7.2f} s   {seconds / best[reference_name]:5.2f}× one process   "
            f"largest relative difference {difference:.1e}"
        )
    shutil.rmtree(work, ignore_errors=True)


THREADS = "ATTNVIZ_THREADS_PER_PROCESS"

if __name__ == "__main__":
    main()
