"""Benchmark: capturing attention while SmolLM2 writes, with the key/value cache vs without it.

``attnviz.generate`` runs one query row per step through the core (key/value
cache). Without a cache, capturing every step means a new forward pass over prompt + text so far
at every step (what a tool that only captures fixed texts would have to do). Both produce the same
patterns; this prints their times side by side (fastest of interleaved rounds) and the ratio.

    python benchmarks/bench_generation.py                 # 64-token prompt, 32 new tokens
    python benchmarks/bench_generation.py --prompt-tokens 256 --new-tokens 64 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

import attnviz
from attnviz.common.texts import default_corpus_path, read_examples
from attnviz.core import CONTEXT_KWARG
from attnviz.core.recorder import PatternRecorder
from attnviz.models.specs import load_model


def prompt_of(loaded, tokens: int) -> str:
    """Corpus sentences run together, cut to about ``tokens`` tokens."""
    text = " ".join(read_examples(default_corpus_path()))
    ids = loaded.tokenizer(text)["input_ids"][:tokens]
    return loaded.tokenizer.decode(ids)


def without_cache(loaded, prompt: str, token_ids: list[int]) -> None:
    """Every step as a fresh forward over everything so far, capturing all patterns (greedy tokens given)."""
    prompt_ids = loaded.encode([prompt]).inputs["input_ids"]  # [1, n]
    for step in range(len(token_ids) + 1):
        ids = torch.cat([prompt_ids, torch.tensor([token_ids[:step]], dtype=torch.long)], dim=1)  # [1, n + step]
        recorder = PatternRecorder()
        with torch.no_grad():
            loaded.model(input_ids=ids, use_cache=False, **{CONTEXT_KWARG: loaded.context([recorder])})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model("smollm2", device="cpu")
    prompt = prompt_of(loaded, args.prompt_tokens)
    best = {"cached": float("inf"), "no cache": float("inf")}
    token_ids: list[int] = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        generation = attnviz.generate(loaded, prompt, max_new_tokens=args.new_tokens)
        best["cached"] = min(best["cached"], time.perf_counter() - start)
        token_ids = generation.token_ids
        start = time.perf_counter()
        without_cache(loaded, prompt, token_ids)
        best["no cache"] = min(best["no cache"], time.perf_counter() - start)
    print(
        f"SmolLM2-135M, {args.prompt_tokens}-token prompt, {len(token_ids)} new tokens, {torch.get_num_threads()} threads"
    )
    print(f"  with key/value cache (attnviz):   {best['cached']:.2f} s")
    print(f"  a new forward pass at every step: {best['no cache']:.2f} s")
    print(f"  ratio: {best['no cache'] / best['cached']:.1f}x")


if __name__ == "__main__":
    main()
