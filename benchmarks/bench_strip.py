"""Benchmark: one query's strips at length (``heatmap --query last``) — peak memory, run time, drawing time.

A capture behind an ordinary figure holds ``layers · heads · n²`` floats (SmolLM2 at 4,096 tokens: 18 GB);
``capture_query_rows`` keeps one row per head (``layers · heads · n``: 4.4 MB) while the attention core
computes the rest block by block. Each measurement runs in a fresh process, so its peak RSS is its own:

* ``forward``: the model's plain forward pass on the text (no observer): the floor for memory;
* ``strips``: ``capture_query_rows`` of the last query, every layer and head (what ``--query last --layer all`` runs),
  its peak RSS taken before anything else runs in that process; then the times of a plain forward pass and of
  ``capture_query_rows``, interleaved (fastest of ``--rounds``); then drawing: ``query_strip`` to PNG and
  ``terminal_strip`` to a 120-column console.

It prints both side by side with their ratios.

    python benchmarks/bench_strip.py                            # SmolLM2 at 4,096 tokens
    python benchmarks/bench_strip.py --lengths 1024,4096 --rounds 3
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


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(mode: str, model: str, length: int, rounds: int) -> dict:
    """One measurement in this (fresh) process: seconds (fastest round), peak RSS, and for strips the drawing."""
    import torch

    from attnviz.captures.query_rows import capture_query_rows
    from attnviz.common.texts import default_corpus_path
    from attnviz.models.specs import load_model

    loaded = load_model(model, device="cpu")
    text = (default_corpus_path().read_text(encoding="utf-8") + " ") * 8
    batch = loaded.encode([text], max_length=length)
    tokens = len(batch.tokens[0])
    loaded_mb = _peak_mb()
    if mode == "forward":  # this process's peak: the floor for the strips' one
        with torch.no_grad():
            loaded.forward(batch)
        return {"tokens": tokens, "peak_mb": _peak_mb(), "loaded_mb": loaded_mb}
    rows = capture_query_rows(loaded, text, "last", max_length=length)
    result = {"tokens": tokens, "peak_mb": _peak_mb(), "loaded_mb": loaded_mb}  # before anything else runs here
    forward_times, strip_times = [], []
    for _ in range(rounds):  # interleaved in one process, so that both see the same machine
        start = time.perf_counter()
        with torch.no_grad():
            loaded.forward(batch)
        forward_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        rows = capture_query_rows(loaded, text, "last", max_length=length)
        strip_times.append(time.perf_counter() - start)
    result |= {"forward_seconds": min(forward_times), "seconds": min(strip_times)}
    from rich.console import Console

    from attnviz.render.heatmap import save_figure
    from attnviz.render.query_strip import query_strip
    from attnviz.render.strip_terminal import terminal_strip

    result["kept_mb"] = sum(row.numel() for row in rows.rows) * 4 / 1e6
    result["strips"] = sum(row.shape[0] for row in rows.rows)
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        save_figure(query_strip(rows), Path(scratch) / "strip.png")
        result["figure_seconds"] = time.perf_counter() - start
    with open(os.devnull, "w") as sink:
        console = Console(file=sink, width=120, force_terminal=True, color_system="truecolor")
        start = time.perf_counter()
        console.print(terminal_strip(rows, width=120))
        result["terminal_seconds"] = time.perf_counter() - start
    result["peak_after_drawing_mb"] = _peak_mb()
    return result


def run_child(mode: str, model: str, length: int, rounds: int) -> dict:
    command = [sys.executable, __file__, "--child", mode, "--model", model, "--lengths", str(length)]
    output = subprocess.run([*command, "--rounds", str(rounds)], capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a model spec (default smollm2)")
    parser.add_argument("--lengths", default="4096", help="comma list of token counts")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds (fastest kept)")
    parser.add_argument("--child", choices=["forward", "strips"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.child:
        print(json.dumps(child(args.child, args.model, lengths[0], args.rounds)))
        return
    print(f"model {args.model} · CPU threads {os.cpu_count()} · load average {os.getloadavg()[0]:.1f}")
    for length in lengths:
        plain = run_child("forward", args.model, length, args.rounds)
        strips = run_child("strips", args.model, length, args.rounds)
        print(
            f"{strips['tokens']:>6} tokens · time: forward {strips['forward_seconds']:.1f} s, strips "
            f"{strips['seconds']:.1f} s (x{strips['seconds'] / strips['forward_seconds']:.2f}) · "
            f"peak RSS: forward {plain['peak_mb']:,.0f} MB, strips "
            f"{strips['peak_mb']:,.0f} MB (x{strips['peak_mb'] / plain['peak_mb']:.2f}; model loaded "
            f"{strips['loaded_mb']:,.0f} MB) · rows kept {strips['kept_mb']:.1f} MB for {strips['strips']} strips "
            f"(a capture of every pattern: {strips['strips'] * strips['tokens'] ** 2 * 4 / 1e9:.1f} GB) · "
            f"figure {strips['figure_seconds']:.1f} s, terminal {strips['terminal_seconds']:.2f} s "
            f"(peak RSS after drawing {strips['peak_after_drawing_mb']:,.0f} MB)"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
