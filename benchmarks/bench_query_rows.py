"""Benchmark: one query's rows (``heatmap --query last``, ``capture_query_rows``) against a plain sdpa forward.

One process loads SmolLM2-135M twice: attnviz's loaded model, and transformers' own with
``attn_implementation="sdpa"``. For each length and thread count (torch's default and one thread), rounds
alternate the two on the same text (a plain sdpa forward of the base model; ``capture_query_rows`` of the
last query, every layer and head, tokenising included), so a busy machine slows both alike. It prints the
fastest round of each, their ratio (target: ≤ 1.2× from 2k to 8k tokens) and the largest difference between
the rows and transformers' eager attention on the first layer at the shortest length (a check that the rows
are the real ones).

    python benchmarks/bench_query_rows.py                          # 2048,4096,8192 tokens, 2 rounds
    python benchmarks/bench_query_rows.py --tokens 2048 --rounds 3 --threads 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="2048,4096,8192", help="comma-separated lengths")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (fastest kept)")
    parser.add_argument("--threads", default=None, help="comma list of thread counts (default: torch's, then 1)")
    args = parser.parse_args()

    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_stats import corpus_batch

    from attnviz.captures.query_rows import capture_query_rows
    from attnviz.models.specs import load_model

    default_threads = torch.get_num_threads()
    threads = [int(t) for t in args.threads.split(",")] if args.threads else sorted({default_threads, 1}, reverse=True)
    loaded = load_model("smollm2", device="cpu")
    path = loaded.model.config._name_or_path
    sdpa = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    lengths = [int(value) for value in args.tokens.split(",")]
    texts = {}
    for length in lengths:  # a text of about `length` tokens (the corpus run together)
        ids = corpus_batch(loaded, length).inputs["input_ids"][0, 1:]  # without the BOS encode() adds
        texts[length] = loaded.tokenizer.decode(ids)
    check = _eager_check(loaded, path, texts[lengths[0]][:2000], capture_query_rows)
    print(
        f"SmolLM2-135M · {os.cpu_count()} CPUs · load {os.getloadavg()[0]:.1f} · rows vs eager (layer 0, 2k chars): {check:.1e}"
    )
    print(
        f"{'tokens':>7} {'threads':>7} {'sdpa s':>8} {'rows s':>8} {'rows÷sdpa':>10}   rounds (sdpa | rows)       load"
    )
    for length in lengths:
        batch = loaded.encode([texts[length]])
        for count in threads:
            torch.set_num_threads(count)
            plain, rows = [], []
            for _ in range(args.rounds):
                start = time.perf_counter()
                with torch.no_grad():
                    sdpa.model(**batch.inputs, use_cache=False)
                plain.append(time.perf_counter() - start)
                start = time.perf_counter()
                capture_query_rows(loaded, texts[length], "last")
                rows.append(time.perf_counter() - start)
            rounds = " ".join(f"{t:.1f}" for t in plain) + " | " + " ".join(f"{t:.1f}" for t in rows)
            print(
                f"{len(batch.tokens[0]):>7} {count:>7} {min(plain):>8.2f} {min(rows):>8.2f} "
                f"{min(rows) / min(plain):>9.2f}×   {rounds:<24} {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    torch.set_num_threads(default_threads)


def _eager_check(loaded, path: str, text: str, capture_query_rows) -> float:
    """Largest |Δ| between the last query's rows of layer 0 and transformers' eager attention."""
    import torch
    import transformers

    eager = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    batch = loaded.encode([text])
    with torch.no_grad():
        attentions = eager.model(**batch.inputs, use_cache=False, output_attentions=True).attentions
    rows = capture_query_rows(loaded, text, "last", layers=[0])
    return float((rows.rows[0] - attentions[0][0, :, -1]).abs().max())


if __name__ == "__main__":
    main()
