"""Benchmark: streaming ``attnviz stats`` against the ways peers compute per-head statistics.

Prints, measured side by side in one process on SmolLM2-135M (the ``smollm2`` model):

1. attnviz stats time ÷ sdpa forward time, at 512 and 2048 tokens (target ≤ 1.1× at both), with the
   attention core's fused softmax kernel (``attnviz.core.kernel``, the default once built; its build/load
   time is printed separately) and on torch's operations (the fallback); and of a process's first call on the
   model, which also factorises the output projections for the value norms (kept for later calls);
2. attnviz stats time ÷ (HF eager + output_attentions + vectorised statistics) (target ≥ 2× faster);
3. attnviz peak memory vs the output_attentions approach (target: ≤ weights + two layers of patterns);
4. a naive per-head Python loop vs attnviz, on the shipped corpus (target ≥ 100×).

Timings interleave the contenders round by round and keep each one's fastest round, so a
busy machine slows all of them alike. Peak memory is the resident-set high-water mark
(reset through /proc/self/clear_refs) above what was resident before the call; the model
weights are resident already, so the budget for the call itself is two layers of patterns.

    python benchmarks/bench_stats.py            # 512 and 2048 tokens, a few minutes on 2 cores
    python benchmarks/bench_stats.py --quick    # 256 and 512 tokens, fewer rounds (a smoke run)
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from attnviz.common.texts import default_corpus_path, read_examples
from attnviz.core import AttentionSite, kernel
from attnviz.models.base import EncodedBatch
from attnviz.models.specs import load_model
from attnviz.stats import HeadStatistics, StatisticsAccumulator, compute_statistics

MB = 1024 * 1024


# -- measuring -------------------------------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def peak_memory(fn) -> tuple[float, object]:
    """(peak resident memory above the resident memory before the call, in bytes; fn's result).

    The attention core's reusable buffers are dropped first, so they count against the call,
    and free heap memory is handed back to the system (malloc_trim), so that memory freed by an
    earlier contender cannot hide this one's allocations.
    """
    import ctypes
    import gc

    from attnviz.core import attention

    attention._workspace.buffers.clear()
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        return math.nan, fn()
    before = _status_kib("VmRSS")
    result = fn()
    return (_status_kib("VmHWM") - before) * 1024.0, result


class Timings(dict):
    """Fastest wall time of each contender (the dict), and every round's times (``rounds``)."""

    def __init__(self, best: dict[str, float], rounds: list[dict[str, float]]) -> None:
        super().__init__(best)
        self.rounds = rounds

    def round_ratios(self, numerator: str, denominator: str) -> str:
        """``median (min–max)`` of the per-round ratios: each round times both back to back, so a
        slow spell of the machine (other tenants of a shared host) divides out."""
        ratios = sorted(times[numerator] / times[denominator] for times in self.rounds)
        return f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}–{ratios[-1]:.2f})"


def interleaved(contenders: dict, rounds: int) -> Timings:
    """Fastest wall time of each contender over ``rounds`` rounds, contenders alternating within a round."""
    best = {name: math.inf for name in contenders}
    history = []
    for _ in range(rounds):
        times = {}
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            times[name] = time.perf_counter() - start
            best[name] = min(best[name], times[name])
        history.append(times)
    return Timings(best, history)


FIRST_CALL = (
    "a process's first call on the model, which also factorises its output projections for the value norms "
    "(kept for later calls while the weights are unchanged)"
)


# -- inputs ------------------------------------------------------------------------------------------------------


def corpus_batch(loaded, length: int, offset: int = 0) -> EncodedBatch:
    """One example of exactly ``length`` tokens: the shipped corpus run together (repeated if needed)."""
    tokenizer = loaded.tokenizer
    text = " ".join(read_examples(default_corpus_path()))
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    ids = (ids * (1 + (offset + length) // len(ids)))[offset : offset + length]
    special = set(tokenizer.all_special_ids)
    input_ids = torch.tensor([ids])
    return EncodedBatch(
        inputs={"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)},
        tokens=[tokenizer.convert_ids_to_tokens(ids)],
        special=[[i in special for i in ids]],
        word_ids=[list(range(length))],
    )


# -- the contenders ----------------------------------------------------------------------------------------------


def attnviz_statistics(loaded, batch, fused: bool = True, first_call: bool = False) -> HeadStatistics:
    """attnviz stats on one batch: with the fused kernel (the default) or on torch's operations (``fused=False``);
    ``first_call``: as a process's first call on the model, without the norms' factors of an earlier one."""
    if first_call:
        loaded.factor_cache.clear()
    if fused:
        return compute_statistics(loaded, batches=[batch], progress=False)
    with kernel.kernel_suspended():
        return compute_statistics(loaded, batches=[batch], progress=False)


def sdpa_forward(sdpa_model, batch) -> None:
    with torch.no_grad():
        sdpa_model.model(**batch.inputs, use_cache=False)


def eager_output_attentions_statistics(eager_model, batch) -> HeadStatistics:
    """The peers' way: keep every layer's patterns (output_attentions), then vectorised statistics on them."""
    with torch.no_grad():
        attentions = eager_model.model(**batch.inputs, use_cache=False, output_attentions=True).attentions
    accumulator = StatisticsAccumulator(causal=True)
    accumulator.begin_batch(batch)
    for layer, pattern in enumerate(attentions):
        accumulator.observe(AttentionSite("self", layer), pattern, 0)
    return HeadStatistics.from_accumulator(accumulator, "eager")


def seed_style_statistics(eager_model, batches: list[EncodedBatch], window: int = 2) -> tuple[float, float]:
    """The naive way: output_attentions per example, then Python loops per layer, head, query and key.

    Returns (seconds in forward passes, seconds in the loops).
    """
    totals: dict = {}
    forward_time = loop_time = 0.0
    for batch in batches:
        start = time.perf_counter()
        with torch.no_grad():
            attentions = eager_model.model(**batch.inputs, use_cache=False, output_attentions=True).attentions
        forward_time += time.perf_counter() - start
        start = time.perf_counter()
        special = batch.special[0]
        for layer, layer_attention in enumerate(attentions):
            weights = layer_attention[0].numpy()  # [h, n, n]
            for head in range(weights.shape[0]):
                rows = weights[head]
                sums = totals.setdefault((layer, head), [0.0] * 8 + [0])
                for i in range(rows.shape[0]):
                    entropy = max_weight = distance = local = special_mass = 0.0
                    for j in range(i + 1):  # causal: keys 0..i
                        p = float(rows[i, j])
                        if p > 0:
                            entropy -= p * math.log(p)
                        max_weight = max(max_weight, p)
                        distance += p * abs(i - j)
                        if abs(i - j) <= window:
                            local += p
                        if special[j]:
                            special_mass += p
                    previous = float(rows[i, i - 1]) if i > 0 else 0.0
                    for index, value in enumerate(
                        (
                            entropy,
                            max_weight,
                            distance,
                            float(rows[i, i]),
                            previous,
                            local,
                            float(rows[i, 0]),
                            special_mass,
                        )
                    ):
                        sums[index] += value
                    sums[8] += 1
        loop_time += time.perf_counter() - start
    return forward_time, loop_time


class ObserveTimer:
    """Adds up the time attnviz spends in its statistics observer (inside the forward pass)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._observe = StatisticsAccumulator.observe

    def __enter__(self) -> ObserveTimer:  # noqa: PYI034 (never subclassed)
        timer, observe = self, self._observe

        def timed(accumulator, site, pattern, query_start, scores=None, summary=None):
            start = time.perf_counter()
            observe(accumulator, site, pattern, query_start, scores, summary)
            timer.seconds += time.perf_counter() - start

        StatisticsAccumulator.observe = timed
        return self

    def __exit__(self, *exc) -> None:
        StatisticsAccumulator.observe = self._observe


def ratios_only(loaded, sdpa_model, lengths, rounds) -> None:
    """Section 1 without the eager contender: sdpa, attnviz (fused kernel) and attnviz on torch's operations."""
    print(
        f"{'tokens':>7} {'sdpa':>8} {'attnviz':>9} {'torch ops':>10} {'attnviz÷sdpa':>13} {'per round':>18} "
        f"{'torch÷sdpa':>11} {'max |Δ|':>9} {'':>36}{'first÷sdpa':>11}"
    )
    for length in lengths:
        batch = corpus_batch(loaded, length)
        contenders = {
            "sdpa": lambda batch=batch: sdpa_forward(sdpa_model, batch),
            "attnviz": lambda batch=batch: attnviz_statistics(loaded, batch),
            "torch": lambda batch=batch: attnviz_statistics(loaded, batch, fused=False),
            "first": lambda batch=batch: attnviz_statistics(loaded, batch, first_call=True),
        }
        for fn in contenders.values():  # warm-up (first touch of the buffers)
            fn()
        times = interleaved(contenders, rounds)
        fused, plain = attnviz_statistics(loaded, batch), attnviz_statistics(loaded, batch, fused=False)
        deltas = {n: float((fused.matrix(n) - plain.matrix(n)).abs().nan_to_num().max()) for n in fused.names}
        worst = max(deltas, key=deltas.get)
        print(
            f"{length:>7} {times['sdpa']:>8.2f} {times['attnviz']:>9.2f} {times['torch']:>10.2f} "
            f"{times['attnviz'] / times['sdpa']:>12.2f}× {times.round_ratios('attnviz', 'sdpa'):>18} "
            f"{times['torch'] / times['sdpa']:>10.2f}× "
            f"{deltas[worst]:>9.1e} ({worst}; others ≤ {max(v for n, v in deltas.items() if n != worst):.1e}) "
            f"{times['first'] / times['sdpa']:>11.2f}×",
            flush=True,
        )
    print("attnviz: the fused kernel; torch ops: the same core on torch's operations; max |Δ|: between the two")
    print(f"first÷sdpa: {FIRST_CALL}")
    print("attnviz÷sdpa: fastest ÷ fastest; per round: median (min–max) of each round's own ratio")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def kernel_prepared() -> tuple[str, str, float]:
    """Build or load the fused kernel, as the statistics command does; (state, why not, seconds)."""
    kernel.prepare_kernel()
    return kernel.kernel_status()


# -- main --------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short lengths and few rounds (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds per length (default 3; quick 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--ratios-only",
        action="store_true",
        help="only sdpa vs attnviz (fused kernel and torch ops): no eager+attentions, memory or naive loops",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = (256, 512) if args.quick else (512, 2048)
    rounds = args.rounds or (1 if args.quick else 3)

    import transformers

    loaded = load_model("smollm2", device="cpu")
    path = loaded.model.config._name_or_path
    sdpa_model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    eager_model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    config = loaded.model.config
    heads, layers = config.num_attention_heads, config.num_hidden_layers
    weights_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    print(
        f"SmolLM2-135M: {layers} layers × {heads} heads, weights {weights_bytes / MB:.0f} MB, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs"
    )
    state, why, seconds = kernel_prepared()
    print(f"fused kernel: {state} in {seconds:.1f} s (build once per machine, then a load){' — ' + why if why else ''}")
    print(
        f"timing: fastest of {rounds} interleaved round(s) after one warm-up; "
        f"load average before: {os.getloadavg()[0]:.2f}\n"
    )

    if args.ratios_only:
        ratios_only(loaded, sdpa_model, lengths, rounds)
        return
    rows = []
    worst_statistic = {}
    for length in lengths:
        batch = corpus_batch(loaded, length)
        contenders = {
            "sdpa": lambda batch=batch: sdpa_forward(sdpa_model, batch),
            "attnviz": lambda batch=batch: attnviz_statistics(loaded, batch),
            "torch": lambda batch=batch: attnviz_statistics(loaded, batch, fused=False),
            "eager+attentions": lambda batch=batch: eager_output_attentions_statistics(eager_model, batch),
            "first": lambda batch=batch: attnviz_statistics(loaded, batch, first_call=True),
        }
        for fn in contenders.values():  # warm-up (first touch of the buffers)
            fn()
        times = interleaved(contenders, rounds)
        plain_stats = attnviz_statistics(loaded, batch, fused=False)
        sdpa_peak, _ = peak_memory(lambda batch=batch: sdpa_forward(sdpa_model, batch))
        attnviz_peak, streamed = peak_memory(lambda batch=batch: attnviz_statistics(loaded, batch))
        eager_peak, stored = peak_memory(lambda batch=batch: eager_output_attentions_statistics(eager_model, batch))
        deltas = {name: float((streamed.matrix(name) - stored.matrix(name)).abs().max()) for name in streamed.names}
        agreement = max(deltas.values())
        worst_statistic[length] = max(deltas, key=deltas.get)
        plain_agreement = max(
            float((plain_stats.matrix(name) - stored.matrix(name)).abs().nan_to_num().max()) for name in streamed.names
        )
        two_layers = 2 * heads * length * length * 4
        rows.append((length, times, (sdpa_peak, attnviz_peak, eager_peak, two_layers), agreement, plain_agreement))

    print("1-2. time: one sequence of N tokens (the corpus run together), seconds")
    print(
        f"{'tokens':>7} {'sdpa':>8} {'attnviz':>9} {'eager+att':>10} {'attnviz÷sdpa':>13} {'per round':>18} "
        f"{'eager+att÷attnviz':>18} {'max |Δ|':>9} {'first÷sdpa':>26}"
    )
    for length, times, _, agreement, _ in rows:
        print(
            f"{length:>7} {times['sdpa']:>8.2f} {times['attnviz']:>9.2f} {times['eager+attentions']:>10.2f} "
            f"{times['attnviz'] / times['sdpa']:>12.2f}× {times.round_ratios('attnviz', 'sdpa'):>18} "
            f"{times['eager+attentions'] / times['attnviz']:>17.2f}× "
            f"{agreement:>9.1e} {'(' + worst_statistic[length] + ')':<15} {times['first'] / times['sdpa']:>10.2f}×"
        )
    print(f"   first÷sdpa: {FIRST_CALL}")
    print("\n1b. the same core on torch's operations (ATTNVIZ_KERNEL=0, or no C++ compiler), same rounds")
    print(f"{'tokens':>7} {'attnviz':>9} {'torch ops':>10} {'torch÷sdpa':>11} {'max |Δ|':>9}")
    for length, times, _, _, plain_agreement in rows:
        print(
            f"{length:>7} {times['attnviz']:>9.2f} {times['torch']:>10.2f} {times['torch'] / times['sdpa']:>10.2f}× "
            f"{plain_agreement:>9.1e}"
        )
    print("   max |Δ|: torch ops vs eager + output_attentions\n")
    print("   attnviz: forward + streaming statistics; eager+att: eager forward with output_attentions, then the")
    print("   same statistics vectorised over the stored patterns; max |Δ|: largest difference between the two")
    print("   attnviz÷sdpa: fastest ÷ fastest; per round: median (min–max) of each round's own ratio\n")
    print("3. peak memory above the resident model (weights are resident already), MB")
    print(f"{'tokens':>7} {'sdpa fwd':>9} {'attnviz':>8} {'eager+att':>10} {'2 layers of patterns':>21}")
    for length, _, (sdpa_peak, attnviz_peak, eager_peak, two_layers), _, _ in rows:
        print(
            f"{length:>7} {sdpa_peak / MB:>9.0f} {attnviz_peak / MB:>8.0f} {eager_peak / MB:>10.0f} "
            f"{two_layers / MB:>21.0f}"
        )
    print("   budget: weights + two layers of patterns, i.e. the last column; 'sdpa fwd' is a plain forward pass\n")

    # 4. naive per-head loops vs attnviz on the corpus.
    sentences = read_examples(default_corpus_path())[: 12 if args.quick else 48]
    sentence_batches = [loaded.encode([s]) for s in sentences]
    document_length = 256 if args.quick else 512
    documents = [
        corpus_batch(loaded, document_length, offset=k * document_length) for k in range(1 if args.quick else 2)
    ]
    print("4. naive per-head Python loop vs attnviz, same texts")
    print("   end to end: output_attentions forward + loops, vs attnviz's streaming forward")
    print("   statistics only: the loops over stored patterns, vs the time attnviz spends in its observer")
    print(
        f"{'corpus':>34} {'naive fwd s':>11} {'naive loops s':>13} {'attnviz s':>10} {'observer s':>11} "
        f"{'end to end':>11} {'statistics':>11}"
    )
    for label, seed_batches, run in [
        (
            f"{len(sentences)} sentences ({sum(len(b.tokens[0]) for b in sentence_batches)} tokens)",
            sentence_batches,
            lambda: compute_statistics(loaded, sentences, batch_size=8, progress=False),
        ),
        (
            f"{len(documents)} × {document_length}-token documents",
            documents,
            lambda: compute_statistics(loaded, batches=documents, progress=False),
        ),
    ]:
        run()  # warm-up
        seed_forward, seed_loops = seed_style_statistics(eager_model, seed_batches)
        best_total = best_observer = math.inf
        for _ in range(max(1, rounds)):
            with ObserveTimer() as timer:
                start = time.perf_counter()
                run()
                best_total = min(best_total, time.perf_counter() - start)
            best_observer = min(best_observer, timer.seconds)
        print(
            f"{label:>34} {seed_forward:>11.2f} {seed_loops:>13.2f} {best_total:>10.3f} {best_observer:>11.3f} "
            f"{(seed_forward + seed_loops) / best_total:>10.0f}× {seed_loops / best_observer:>10.0f}×"
        )
    print(f"\nload average after: {os.getloadavg()[0]:.2f} (other processes slow every contender alike)")


if __name__ == "__main__":
    main()
