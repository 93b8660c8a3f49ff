"""Benchmark of ``attnviz prune``: does importance beat chance, and does pruning make models faster?

Measured side by side in one run and printed as tables:

1. SmolLM2-135M (30 layers × 9 heads = 270, grouped-query attention with 3
   key/value heads per layer): remove 20% of the heads (54) chosen by
   ``gradient`` importance (one-shot, and iterative in steps of 10% of the
   heads as Michel et al. — 2 steps here) or at random (mean of
   ``--seeds`` seeds), and compare perplexity on held-out text — corpus
   sentences that were not used for scoring. Heads are removed by masking
   (identical outputs to physical pruning: see the tests); the gradient
   one-shot choice is also pruned physically to show the perplexity is the same.
2. MiniLM and a toy model: forward latency at 512 tokens before and after
   physically removing 30% of the heads (gradient importance), timed in
   alternation in the same process (median of ``--repeats`` passes).

Targets (issue 5): gradient raises perplexity less than random; iterative is at
least as good as one-shot; latency drops by ≥ 20% at 512 tokens.

Run:  python benchmarks/bench_prune.py            (about 5–10 minutes on 2 CPU cores)
      python benchmarks/bench_prune.py --quick    (smaller data, for a smoke test)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from attnviz.common.texts import default_corpus_path, read_examples
from attnviz.models.head_sets import removal_mask, total_heads
from attnviz.models.physical import prune_heads_physically
from attnviz.models.specs import load_model
from attnviz.prune import PruneConfig, PruneStrategy, prune_model
from attnviz.prune.judging import text_batches
from attnviz.prune.strategy import run_pruning


def split_corpus(scoring: int, heldout: int) -> tuple[list[str], list[str]]:
    """Scoring text = even corpus lines, held-out text = odd lines (disjoint), longest sentences first."""
    lines = [line for line in read_examples(default_corpus_path()) if len(line.split()) >= 6]
    return lines[0::2][:scoring], lines[1::2][:heldout]


def smollm2_quality(args) -> dict:
    scoring_texts, heldout_texts = split_corpus(args.scoring, args.heldout)
    loaded = load_model("smollm2", device="cpu")
    layout = loaded.layout()
    count = round(0.2 * total_heads(layout))
    scoring = loaded.objective(text_batches(loaded, scoring_texts, batch_size=8))
    heldout = loaded.objective(text_batches(loaded, heldout_texts, batch_size=8))
    print(
        f"SmolLM2: {total_heads(layout)} heads in {len(layout)} layers; removing {count} (20%); "
        f"scoring on {scoring.total_units()} predicted tokens, perplexity on {heldout.total_units()} held-out tokens",
        flush=True,
    )
    rows = []
    start = time.perf_counter()
    base = heldout.evaluate()
    rows.append(("unpruned", base.metric, 0.0, time.perf_counter() - start))

    def evaluate(name, removed, seconds):
        quality = heldout.evaluate(removal_mask(layout, removed))
        rows.append((name, quality.metric, quality.metric - base.metric, seconds))
        print(f"  {name:<28} perplexity {quality.metric:8.2f}  ({seconds:.0f} s to choose)", flush=True)
        return quality

    runs = {}
    strategies = [("gradient, one-shot", PruneStrategy()), ("gradient, iterative", PruneStrategy(iterative=True))]
    if args.steps:
        strategies.append((f"gradient, iterative, {args.steps} steps", PruneStrategy(iterative=True, steps=args.steps)))
    for name, strategy in strategies:
        start = time.perf_counter()
        runs[name] = run_pruning(scoring, layout, "gradient", count, strategy)
        evaluate(name, runs[name].removed, time.perf_counter() - start)
    random_ppl = []
    for seed in range(args.seeds):
        start = time.perf_counter()
        run = run_pruning(scoring, layout, "random", count, PruneStrategy(), seed=seed)
        random_ppl.append(evaluate(f"random, seed {seed}", run.removed, time.perf_counter() - start).metric)

    # The masked perplexity is the physically pruned model's perplexity.
    one_shot = runs["gradient, one-shot"].removed
    pruned, plans = prune_heads_physically(loaded, one_shot)
    physical = heldout.for_model(pruned).evaluate()
    sliced = sum(len(plan.sliced) for plan in plans.values())
    masked = sum(len(plan.masked) for plan in plans.values())
    return {
        "rows": rows,
        "base": base.metric,
        "random_mean": statistics.mean(random_ppl),
        "random_std": statistics.stdev(random_ppl) if len(random_ppl) > 1 else 0.0,
        "seeds": args.seeds,
        "physical": physical.metric,
        "sliced": sliced,
        "masked": masked,
        "count": count,
    }


def latency(loaded, args, texts, label: str) -> dict:
    config = PruneConfig(ratio=0.3, latency_tokens=512, latency_repeats=args.repeats, toy_examples=128, max_length=128)
    outcome = prune_model(loaded, config, texts=texts)
    report = outcome.report
    return {
        "model": label,
        "heads": f"{report.heads_before} -> {report.heads_after}",
        "tokens": report.latency_tokens,
        "before": report.latency_before_ms,
        "after": report.latency_after_ms,
        "params": (report.params_before, report.params_after),
        "diff": report.max_abs_diff,
    }


def toy_model_512():
    """A toy model reading 512 positions, shaped like the shipped ``sample_data/toy/copy`` checkpoint
    (decoder, width 64, MLP 128, scaled-dot) but with 8 heads per layer so that 30% is a whole number
    of heads (5 of 16); the shipped checkpoints' position tables stop at 25. Untrained: latency
    does not depend on the weights."""
    from attnviz.toy import build_toy_model

    torch.manual_seed(0)
    # decoder copy reads <bos> items <sep> items: 2·255 + 2 = 512 positions
    return build_toy_model(
        "copy",
        architecture="decoder",
        max_length=255,
        width=64,
        num_heads=8,
        num_layers=2,
        mlp_width=128,
        name="toy copy decoder (2 × 8 heads, width 64, MLP 128)",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small data and few repeats (smoke test)")
    parser.add_argument("--seeds", type=int, default=3, help="random baselines to average")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="also run the iterative strategy with this many steps (default: only "
        "the default schedule, steps of 10%% of the heads: 2 steps for 20%%)",
    )
    parser.add_argument("--repeats", type=int, default=15, help="timed forward passes per model")
    parser.add_argument("--scoring", type=int, default=120, help="corpus sentences to score heads on")
    parser.add_argument("--heldout", type=int, default=120, help="held-out corpus sentences for perplexity")
    parser.add_argument(
        "--latency-threads",
        type=int,
        default=1,
        help="torch threads while timing (default 1: on a shared, loaded machine, multi-threaded ops stall "
        "on their thread barriers and the timings stop reflecting the work done)",
    )
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.scoring, args.heldout, args.repeats = 16, 16, 3
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, load average {load}",
        flush=True,
    )

    if not args.skip_latency:
        scoring_texts, _ = split_corpus(40, 0)
        threads = torch.get_num_threads()
        torch.set_num_threads(args.latency_threads)
        results = [latency(load_model("minilm", device="cpu"), args, scoring_texts, "MiniLM-L6 (6 × 12 heads)")]
        results.append(latency(toy_model_512(), args, None, "toy copy decoder (2 × 8 heads, w 64)"))
        torch.set_num_threads(threads)
        print(
            f"\nForward latency at 512 tokens, 30% of heads removed (median of {args.repeats} interleaved runs, "
            f"{args.latency_threads} thread(s)):"
        )
        print(f"  {'model':<38} {'heads':>10} {'before ms':>10} {'after ms':>10} {'change':>8} {'params':>22}")
        for r in results:
            change = (r["after"] - r["before"]) / r["before"] * 100
            params = f"{r['params'][0]:,} -> {r['params'][1]:,}"
            print(
                f"  {r['model']:<38} {r['heads']:>10} {r['before']:>10.1f} {r['after']:>10.1f} "
                f"{change:>+7.1f}% {params:>22}   (max |masked − pruned| {r['diff']:.1e})"
            )
            verdict = "met" if change <= -20 else "MISSED"
            print(f"    target: latency drop ≥ 20% -> {verdict} ({-change:.1f}% drop)")

    if not args.skip_smollm2:
        result = smollm2_quality(args)
        print(f"\nSmolLM2-135M: held-out perplexity after removing {result['count']} of 270 heads (20%):")
        print(f"  {'choice':<30} {'perplexity':>10} {'increase':>10}")
        for name, ppl, increase, _ in result["rows"]:
            print(f"  {name:<30} {ppl:>10.2f} {increase:>+10.2f}")
        print(
            f"  {'random, mean of ' + str(result['seeds']) + ' seeds':<30} {result['random_mean']:>10.2f} "
            f"{result['random_mean'] - result['base']:>+10.2f}   (std {result['random_std']:.2f})"
        )
        rows = {name: ppl for name, ppl, _, _ in result["rows"]}
        one_shot = rows["gradient, one-shot"]
        iterative = rows["gradient, iterative"]
        gradient_increase = one_shot - result["base"]
        random_increase = result["random_mean"] - result["base"]
        print(
            f"  gradient one-shot raises perplexity {gradient_increase:.2f} vs random {random_increase:.2f} "
            f"(ratio {gradient_increase / random_increase:.2f}) -> {'met' if gradient_increase < random_increase else 'MISSED'}"
        )
        print(
            f"  iterative {iterative:.2f} vs one-shot {one_shot:.2f} -> "
            f"{'met' if iterative <= one_shot else 'MISSED'} (iterative at least as good)"
        )
        print(
            f"  physically pruned one-shot model: perplexity {result['physical']:.2f} "
            f"(masked {one_shot:.2f}); {result['sliced']} heads sliced out, {result['masked']} masked (GQA)"
        )


if __name__ == "__main__":
    main()
