"""Benchmark: ``attnviz stats`` on long inputs, against a plain sdpa forward, each in its own process.

For each length (one sequence of N tokens of SmolLM2-135M, the shipped corpus run together),
three contenders, each round of each in a fresh child process that loads the model itself:

* ``sdpa``: transformers' own sdpa forward pass (no attention weights kept), the floor;
* ``stats``: attnviz's statistics pass (:func:`attnviz.stats.compute_statistics`, fused kernel as
  ``attnviz stats`` uses it);
* ``by-position``: the same pass with ``by_position=True`` (default bucket size).

A child warms up on a 256-token input (loads the fused kernel, touches torch's code paths), then
times one pass at full length and reports it with its own peak resident memory
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``: model weights, the process's Python and torch, and
the pass). Rounds interleave the contenders (sdpa, stats, by-position, sdpa, …) so that a busy
machine slows them alike; each contender's fastest round is kept, and its largest peak. Separate
processes keep one contender's allocations from hiding another's peak.
Every length runs with each thread count of ``--threads`` (default: torch's default, then one), the ratio
printed per thread count: a pass that scales worse than sdpa with more threads shows there.
Targets: stats ≤ 1.2× sdpa at 2,048 and 8,192 tokens at every thread count; peak RSS ≤ 2.5 GB.

``--window W`` runs both contenders on SmolLM2's weights in Mistral's architecture with a sliding window of ``W``
keys (LLaMA's layers, each query reading only its last ``W`` keys): transformers' sdpa then builds a boolean
``[q, k]`` mask and reads every key; attnviz's tile kernel reads only the tiles inside the window.

    python benchmarks/bench_stats_long.py                          # 2048,4096,8192 tokens, 3 rounds each
    python benchmarks/bench_stats_long.py --tokens 2048 --rounds 2 --threads 2,1
    python benchmarks/bench_stats_long.py --tokens 8192 --window 512 --modes sdpa,stats
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MODES = ("sdpa", "stats", "by-position")
GB = 1024**3


def windowed_model(window: int, directory: Path) -> Path:
    """SmolLM2-135M's weights saved in ``directory`` as a Mistral model with a sliding window of ``window`` keys."""
    import transformers

    from attnviz.models.specs import load_model

    llama = load_model("smollm2", device="cpu").model
    fields = {key: value for key, value in llama.config.to_dict().items() if key not in ("architectures", "model_type")}
    config = transformers.MistralConfig(**{**fields, "sliding_window": window})
    mistral = transformers.MistralForCausalLM(config)
    mistral.load_state_dict(llama.state_dict())  # the same parameter names: LLaMA's layers
    mistral.save_pretrained(directory)
    transformers.AutoTokenizer.from_pretrained(llama.config._name_or_path).save_pretrained(directory)
    return directory


def child(mode: str, length: int, model: str = "smollm2") -> dict:
    """Time ``mode`` once on one ``length``-token sequence, after a short warm-up; its time and peak RSS."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_stats import corpus_batch, sdpa_forward

    from attnviz.models.specs import load_model
    from attnviz.stats import compute_statistics

    loaded = load_model(model, device="cpu")
    batch, warm_up = corpus_batch(loaded, length), corpus_batch(loaded, 256)
    if mode == "sdpa":
        import transformers

        path = loaded.model.config._name_or_path
        model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
        del loaded  # only the sdpa model stays resident, as in a plain forward

        def run(batch) -> None:
            sdpa_forward(model, batch)
    else:

        def run(batch) -> None:
            compute_statistics(loaded, batches=[batch], progress=False, by_position=mode == "by-position")

    with torch.no_grad():
        run(warm_up)
        start = time.perf_counter()
        run(batch)
        seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"mode": mode, "tokens": length, "seconds": seconds, "peak_bytes": peak_kib * 1024}


def measure(mode: str, length: int, threads: int | None, model: str = "smollm2") -> dict:
    """:func:`child` in a fresh process."""
    command = [sys.executable, __file__, "--child", mode, "--tokens", str(length), "--model", model]
    if threads:
        command += ["--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{mode} at {length} tokens failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="2048,4096,8192", help="comma-separated lengths (default 2048,4096,8192)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per contender and length (fastest is kept)")
    parser.add_argument(
        "--threads",
        default="0,1",
        help="comma list of torch threads in the children; 0 is torch's default (default 0,1)",
    )
    parser.add_argument("--modes", default=",".join(MODES), help=f"contenders to run (default {','.join(MODES)})")
    parser.add_argument("--window", type=int, help="SmolLM2 as Mistral with a sliding window of this many keys")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="smollm2", help=argparse.SUPPRESS)
    args = parser.parse_args()
    lengths = [int(value) for value in args.tokens.split(",")]
    thread_counts = [int(value) for value in args.threads.split(",")]
    if args.child:
        if thread_counts[0]:
            import torch

            torch.set_num_threads(thread_counts[0])
        print(json.dumps(child(args.child, lengths[0], args.model)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        model = str(windowed_model(args.window, Path(scratch))) if args.window else "smollm2"
        _compare(args, lengths, thread_counts, model)


def _compare(args: argparse.Namespace, lengths: list[int], thread_counts: list[int], model: str) -> None:
    modes = [mode for mode in MODES if mode in args.modes.split(",")]
    what = f"as Mistral with a sliding window of {args.window} keys" if args.window else ""
    print(
        f"SmolLM2-135M {what}, one sequence per length; fastest of {args.rounds} interleaved round(s); "
        f"{os.cpu_count()} CPUs"
    )
    header = f"{'tokens':>7} {'threads':>7}" + "".join(f" {mode + ' s':>14} {'peak GB':>8}" for mode in modes)
    header += f" {'stats÷sdpa':>11} {'by-pos÷stats':>13} {'load':>14}"
    print(header, flush=True)
    for length, threads in [(length, threads) for length in lengths for threads in thread_counts]:
        load_before = os.getloadavg()[0]
        runs: dict[str, list[dict]] = {mode: [] for mode in modes}
        for _ in range(args.rounds):
            for mode in modes:
                runs[mode].append(measure(mode, length, threads, model))
        results = {
            mode: {
                "best": min(run["seconds"] for run in done),
                "times": [run["seconds"] for run in done],
                "peak_bytes": max(run["peak_bytes"] for run in done),
            }
            for mode, done in runs.items()
        }
        line = f"{length:>7} {threads or 'default':>7}"
        for mode in modes:
            line += f" {results[mode]['best']:>14.2f} {results[mode]['peak_bytes'] / GB:>8.2f}"
        ratio = results["stats"]["best"] / results["sdpa"]["best"] if {"stats", "sdpa"} <= set(results) else None
        extra = (
            results["by-position"]["best"] / results["stats"]["best"]
            if {"stats", "by-position"} <= set(results)
            else None
        )
        line += f" {'' if ratio is None else f'{ratio:.2f}×':>11} {'' if extra is None else f'{extra:.2f}×':>13}"
        line += f" {load_before:>6.2f}→{os.getloadavg()[0]:<6.2f}"
        print(line, flush=True)
        for mode in modes:
            rounds = ", ".join(f"{t:.2f}" for t in results[mode]["times"])
            print(f"{'':>7}   {mode}: rounds {rounds} s", flush=True)
    print("peak GB: the child process's own ru_maxrss (weights, Python, torch and the pass); load: 1-min load average")


if __name__ == "__main__":
    main()
