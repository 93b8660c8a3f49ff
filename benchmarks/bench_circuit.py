"""Benchmark: each stage of ``attnviz circuit`` against a plain sdpa forward of the same batch.

Measured side by side in one process on SmolLM2-135M (the ``smollm2`` model) with the indirect-object prompt pair
of docs/circuit.md (14 tokens; 301 senders, 481 receivers, 70,651 edges):

* the baseline: one plain transformers forward (sdpa attention, logits) of the pair as one batch of two rows;
* the reference runs (the clean and corrupt prompts, every sender recorded through the core);
* node attribution (``atp``): one corrupt forward + backward, gradients at every head output and MLP output;
* edge attribution (``eap``): the same with every receiver reading its own copy of the stream, plus the products;
* ``eap-ig`` with ``--steps`` interpolated forwards + backwards (batched);
* the faithfulness evaluation: one patched forward per circuit on the curve (``--circuits``, batched).

Each is reported as seconds and as a multiple of the baseline. Timings interleave the contenders round by round
and keep each one's fastest round, so a busy machine slows them alike.

    python benchmarks/bench_circuit.py                 # 3 rounds, one thread
    python benchmarks/bench_circuit.py --threads 2 --steps 10 --circuits 16
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from attnviz.circuit.attribution import Setting, attribute, reference_runs
from attnviz.circuit.faithfulness import curve_counts, keep_top, patched_metrics, ranking_of
from attnviz.circuit.graph import build_graph
from attnviz.circuit.pairs import PromptPair, group_pairs
from attnviz.models.specs import load_model

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5, help="integrated-gradient steps of eap-ig")
    parser.add_argument("--circuits", type=int, default=16, help="circuits on the faithfulness curve")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    loaded = load_model("smollm2", device="cpu")
    model, tokenizer = loaded.model, loaded.tokenizer
    readers = loaded.residual_readers()
    graph = build_graph(readers)
    layout = loaded.layout()
    weights = {
        site: weight.view(weight.shape[0], layout[site], -1)
        for site, (weight, _) in loaded.head_output_weights().items()
    }
    setting = Setting(loaded, readers, graph, weights, "logit-diff", args.batch_size)
    (group,) = group_pairs(loaded, [PromptPair(CLEAN, CORRUPT, " Mary", " John")])
    with torch.no_grad():
        reference = reference_runs(setting, group)
    scores = attribute(setting, group, reference, "eap", steps=1, per_position=False)
    assert scores.edges is not None
    edges = graph.edges()
    ranking = ranking_of(scores.edges, edges)
    drops = keep_top(ranking, edges, curve_counts(int(edges.sum()), args.circuits))
    pair = tokenizer([CLEAN, CORRUPT], return_tensors="pt")
    own = model.config._attn_implementation

    def plain() -> None:
        model.set_attn_implementation("sdpa")
        try:
            with torch.no_grad():
                model(**pair, use_cache=False)
        finally:
            model.set_attn_implementation(own)

    def references() -> None:
        with torch.no_grad():
            reference_runs(setting, group)

    contenders = {
        "plain sdpa forward (2 rows)": plain,
        "reference runs (clean + corrupt)": references,
        "atp: corrupt forward+backward": lambda: attribute(
            setting, group, reference, "atp", steps=1, per_position=False
        ),
        "eap: forward+backward, edge products": lambda: attribute(
            setting, group, reference, "eap", steps=1, per_position=False
        ),
        f"eap-ig: {args.steps} steps": lambda: attribute(
            setting, group, reference, "eap-ig", steps=args.steps, per_position=False
        ),
        f"faithfulness: {drops.shape[0]} circuits": lambda: patched_metrics(
            setting, [(group, reference)], drops, source="clean"
        ),
    }
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(args.rounds):
        for name, run in contenders.items():
            started = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - started)
    baseline = best["plain sdpa forward (2 rows)"]
    print(f"SmolLM2-135M, {len(group.clean.tokens[0])} tokens, {args.threads} thread(s), best of {args.rounds} rounds")
    print(f"{len(graph.senders)} senders, {len(graph.receivers)} receivers, {int(edges.sum())} edges")
    for name, seconds in best.items():
        print(f"{name:42s} {seconds * 1000:9.1f} ms  {seconds / baseline:7.2f}x")
    node_total = best["reference runs (clean + corrupt)"] + best["atp: corrupt forward+backward"]
    print(f"{'node attribution in all (atp)':42s} {node_total * 1000:9.1f} ms  {node_total / baseline:7.2f}x")


if __name__ == "__main__":
    main()
