"""Benchmark: captures and static figures at length (SmolLM2-135M, the ``smollm2`` model).

Prints, side by side:

1. capture of one head (layer 3, head 2) against a plain forward pass on the same text: time and peak
   resident memory above what was resident before (the capture records ``[1, q, k]`` float32, 64 MB at
   4,096 tokens, where recording every head of every layer would need 18 GB; it also tokenises the text,
   which the forward pass is given already encoded);
2. the figure of that one head, max-pooled, to PNG, SVG and PDF, next to the same figure drawn with every
   cell (unpooled; PNG only unless ``--unpooled-all``);
3. the figure of all 30 layers, one head each (the capture of 30 heads first, then the figure).

    python benchmarks/bench_figures.py                   # 4,096 tokens
    python benchmarks/bench_figures.py --tokens 1024     # shorter
    python benchmarks/bench_figures.py --no-unpooled     # skip the slow unpooled figures
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from bench_stats import MB, peak_memory

from attnviz.captures.attention_capture import capture
from attnviz.models.specs import load_model
from attnviz.render import pooling
from attnviz.render.capture_view import capture_heatmap
from attnviz.render.heatmap import save_figure

ROOT = Path(__file__).resolve().parent.parent


def long_text() -> str:
    """The repository's documentation, repeated: tens of thousands of tokens of ordinary prose."""
    parts = [path.read_text(encoding="utf-8") for path in sorted((ROOT / "docs").glob("*.md"))]
    return "\n\n".join(parts * 4)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def figure_seconds(result, out: Path, *, layers, heads, pooled: bool) -> float:
    """Seconds to build and save the figure (pooling switched off when not ``pooled``)."""
    saved = pooling.POOL_ABOVE
    if not pooled:
        pooling.POOL_ABOVE = 10**9
    try:

        def draw():
            figure = capture_heatmap(result, layers=layers, heads=heads)
            save_figure(figure, out)

        seconds, _ = timed(draw)
    finally:
        pooling.POOL_ABOVE = saved
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--no-unpooled", action="store_true", help="skip the figures drawn with every cell")
    parser.add_argument("--unpooled-all", action="store_true", help="unpooled SVG and PDF too (slow, large files)")
    parser.add_argument("--no-grid", action="store_true", help="skip the figure of all layers")
    args = parser.parse_args()
    loaded = load_model("smollm2", device="cpu")
    text = long_text()
    batch = loaded.encode([text], max_length=args.tokens)
    tokens = len(batch.tokens[0])
    print(f"smollm2 at {tokens:,} tokens, torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}")

    def forward():
        with torch.no_grad():
            loaded.forward(batch)

    forward()  # warm up (weights paged in, buffers sized)
    forward_peak, _ = peak_memory(lambda: timed(forward))
    forward_time, _ = timed(forward)
    capture_peak, (capture_time, one) = peak_memory(
        lambda: timed(lambda: capture(loaded, text, max_length=args.tokens, layers=[3], heads=[2]))
    )
    print("\n1. one head (layer 3, head 2) against a plain forward pass")
    print(f"   {'':22}{'time':>10}{'peak RSS':>14}")
    print(f"   {'plain forward':22}{forward_time:>9.1f}s{forward_peak / MB:>11.0f} MB")
    print(f"   {'capture L3 H2':22}{capture_time:>9.1f}s{capture_peak / MB:>11.0f} MB")
    print(
        f"   ratio capture / forward: time {capture_time / forward_time:.2f}×, peak {capture_peak / forward_peak:.2f}×"
    )

    print(f"\n2. figure of one head at {tokens:,} tokens")
    print(f"   {'format':8}{'pooled':>10}{'unpooled':>12}{'ratio':>9}")
    with tempfile.TemporaryDirectory() as folder:
        for suffix in (".png", ".svg", ".pdf"):
            pooled = figure_seconds(one, Path(folder) / f"pooled{suffix}", layers=[3], heads=[2], pooled=True)
            unpooled = float("nan")
            if not args.no_unpooled and (suffix == ".png" or args.unpooled_all):
                unpooled = figure_seconds(one, Path(folder) / f"full{suffix}", layers=[3], heads=[2], pooled=False)
            if not math.isnan(unpooled):  # drawn
                print(f"   {suffix:8}{pooled:>9.1f}s{unpooled:>11.1f}s{unpooled / pooled:>8.1f}×")
            else:
                print(f"   {suffix:8}{pooled:>9.1f}s{'—':>12}{'—':>9}")
        if args.no_grid:
            return
        del one
        capture_all, every = timed(lambda: capture(loaded, text, max_length=args.tokens, heads=[2]))
        print(f"\n3. all {every.num_layers()} layers, head 2 (capture {capture_all:.1f}s)")
        pooled = figure_seconds(every, Path(folder) / "layers.png", layers=None, heads=[2], pooled=True)
        print(f"   pooled PNG {pooled:.1f}s (unpooled: not drawn, {every.num_layers()} × {tokens:,}² cells)")


if __name__ == "__main__":
    main()
