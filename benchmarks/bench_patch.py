"""Benchmark: ``attnviz patch`` against the same number of plain sdpa forwards, batched the same way.

Prints, measured side by side in one process on SmolLM2-135M (the ``smollm2`` model) with the indirect-object
prompt pair of docs/patch.md (14 tokens, 30 layers × 9 heads = 270 patched runs):

* the time of :func:`attnviz.patch_heads` (the reference runs, every head's patched run, direct logit
  attribution) ÷ the time of the same forwards through transformers' sdpa attention with no patching: one batch
  of the two prompts, then 270 rows of the corrupt prompt in batches of ``--batch-size``, each with its logits
  (target ≤ 1.5×);
* with the default number of threads and with one thread.

Timings interleave the two contenders round by round and keep each one's fastest round, so a busy machine slows
both alike.

    python benchmarks/bench_patch.py               # 3 rounds per thread setting
    python benchmarks/bench_patch.py --quick       # layers 0-3 only (36 heads, one batch of 36), two rounds
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from attnviz.models.specs import load_model
from attnviz.patching import patch_heads

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"


def plain_forwards(model, tokenizer, heads: int, batch_size: int) -> None:
    """The forwards patching runs, with nothing patched: the pair once, then ``heads`` corrupt rows in batches."""
    pair = tokenizer([CLEAN, CORRUPT], return_tensors="pt")
    with torch.no_grad():
        model(**pair, use_cache=False)
        for start in range(0, heads, batch_size):
            rows = min(batch_size, heads - start)
            ids = pair["input_ids"][1:2].expand(rows, -1).contiguous()
            model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=None, help="rounds per contender (3; --quick: 2)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="patch the heads of layers 0-3 only, in one batch")
    args = parser.parse_args()
    layers = [0, 1, 2, 3] if args.quick else None
    if args.quick:
        args.batch_size = 36
    args.rounds = args.rounds or (2 if args.quick else 3)

    loaded = load_model("smollm2")
    heads = sum(count for site, count in loaded.layout().items() if layers is None or site.layer in layers)
    model, tokenizer = loaded.model, loaded.tokenizer
    own = model.config._attn_implementation

    def run_attnviz():
        return patch_heads(
            loaded,
            clean=CLEAN,
            corrupt=CORRUPT,
            answer=" Mary",
            wrong=" John",
            batch_size=args.batch_size,
            layers=layers,
        )

    def run_sdpa():
        model.set_attn_implementation("sdpa")
        try:
            plain_forwards(model, tokenizer, heads, args.batch_size)
        finally:
            model.set_attn_implementation(own)

    default_threads = torch.get_num_threads()
    print(f"SmolLM2-135M, {heads} heads, 14 tokens, batches of {args.batch_size}; fastest of {args.rounds} rounds")
    for threads in dict.fromkeys((default_threads, 1)):
        torch.set_num_threads(threads)
        run_attnviz()  # warm-up: the model's layout, the readout check, the allocator
        run_sdpa()
        best = {"attnviz": float("inf"), "sdpa": float("inf")}
        for _ in range(args.rounds):
            for name, function in (("attnviz", run_attnviz), ("sdpa", run_sdpa)):
                started = time.perf_counter()
                function()
                best[name] = min(best[name], time.perf_counter() - started)
        ratio = best["attnviz"] / best["sdpa"]
        print(
            f"threads {threads}: attnviz patch {best['attnviz']:.2f} s, sdpa forwards {best['sdpa']:.2f} s, "
            f"ratio {ratio:.2f}× (target ≤ 1.5×)"
        )
    torch.set_num_threads(default_threads)


if __name__ == "__main__":
    main()
