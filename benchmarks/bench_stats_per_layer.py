"""Benchmark: the statistics pass's fixed cost per layer, which short inputs on a GPU are made of.

On a GPU a short input's forward pass is bound by the host: every tensor operation is a kernel launched from Python,
and the GPU waits for the next one. What the statistics pass adds per layer is then the number of operations its
observers launch, and whether any of them waits for the GPU (a copy to the host, ``.item()``). This script counts,
per attention layer and with torch's dispatcher, the operations of a plain sdpa forward and those of
:func:`attnviz.compute_statistics` on the same tokens, and the ones that read a value back to the host; and times
both on a narrow model (64 wide, 30 layers, 32 tokens) where the host's work is all there is, side by side, fastest
of ``--rounds``, on the default threads and on one.

    python benchmarks/bench_stats_per_layer.py
    python benchmarks/bench_stats_per_layer.py --as-on-a-gpu   # sites reduced at the batch's end, as on a GPU
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from collections import Counter

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: operations that only describe a tensor (no kernel on a GPU)
VIEWS = ("view", "as_strided", "select", "slice", "unsqueeze", "expand", "detach", "alias", "t.default", "transpose")
#: operations that read a value back to the host (on a GPU they wait for every kernel before them)
READS = ("_local_scalar_dense", "item")


class OperationCounter(TorchDispatchMode):
    """Counts the kernels an operation launches (views excepted) and the reads back to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels: Counter[str] = Counter()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if not any(view in name for view in VIEWS):
            self.kernels[name] += 1
        if any(read in name for read in READS) or (
            "_to_copy" in name and str((kwargs or {}).get("device", "")) == "cpu"
        ):
            self.reads += 1
        return func(*args, **(kwargs or {}))


def build(layers: int):
    import transformers

    import attnviz
    from attnviz.models.specs import minilm_path

    config = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        num_hidden_layers=layers, vocab_size=30522, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.set_attn_implementation("sdpa")
    return model, attnviz.wrap(model, transformers.AutoTokenizer.from_pretrained(minilm_path()))


def fastest(function, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--as-on-a-gpu", action="store_true", help="reduce the sites together, as a GPU pass does")
    args = parser.parse_args()
    import attnviz
    from attnviz.stats import deferral

    if args.as_on_a_gpu:
        deferral.DEFERRED_DEVICES = (*deferral.DEFERRED_DEVICES, "cpu")

    model, loaded = build(args.layers)
    batch = loaded.encode([" ".join(["hello"] * (args.tokens - 2))])
    forward = functools.partial(model.model, input_ids=batch.inputs["input_ids"])
    statistics = functools.partial(attnviz.compute_statistics, loaded, batches=[batch], progress=False)
    counts = {}
    for name, function in (("sdpa", forward), ("stats", statistics)):
        with torch.no_grad():
            function()  # warm
            with OperationCounter() as counter:
                function()
        counts[name] = counter
    per_layer = {name: sum(counter.kernels.values()) / args.layers for name, counter in counts.items()}
    # what a further batch costs: a call's own setup and result (once per call, mostly on host tensors) left out
    with OperationCounter() as two_batches:
        attnviz.compute_statistics(loaded, batches=[batch, batch], progress=False)
    per_batch = (sum(two_batches.kernels.values()) - sum(counts["stats"].kernels.values())) / args.layers
    print(
        f"{args.layers} layers, {args.tokens} tokens. Operations per layer: sdpa {per_layer['sdpa']:.0f}, "
        f"stats {per_layer['stats']:.0f} in a call of one batch, {per_batch:.0f} for each further batch; reads "
        f"back to the host per pass: sdpa {counts['sdpa'].reads}, stats {counts['stats'].reads}"
    )
    for threads in sorted({torch.get_num_threads(), 1}, reverse=True):
        torch.set_num_threads(threads)
        with torch.no_grad():
            sdpa = fastest(forward, args.rounds)
        stats = fastest(statistics, args.rounds)
        print(
            f"{threads} thread(s): sdpa {sdpa * 1e3 / args.layers:.3f} ms a layer, stats "
            f"{stats * 1e3 / args.layers:.3f} ms a layer: {stats / sdpa:.2f}x"
        )


if __name__ == "__main__":
    main()
