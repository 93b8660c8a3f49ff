"""Benchmark: what attnviz.wrap costs over a model attnviz loads itself.

A wrapped model is switched onto attnviz's core (configs and training flags) around every forward pass
and switched back afterwards. This times ``attnviz.capture`` and ``attnviz.compute_statistics`` on MiniLM
loaded both ways (same weights, same threads), fastest of interleaved rounds, and prints the ratios; it
also prints how far the wrapped capture is from the model's own eager attention.

    python benchmarks/bench_wrap.py
    python benchmarks/bench_wrap.py --rounds 7 --texts 64
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
import transformers

import attnviz
from attnviz.common.texts import load_texts
from attnviz.models.specs import minilm_path


def _timed(function, *arguments) -> float:
    start = time.perf_counter()
    function(*arguments)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--texts", type=int, default=32)
    args = parser.parse_args()
    folder = minilm_path()
    model = transformers.AutoModel.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    wrapped = attnviz.wrap(model, tokenizer)
    loaded = attnviz.load_model("minilm", device="cpu")
    texts = load_texts()[: args.texts]
    text = " ".join(texts[:4])

    inputs = tokenizer(text, return_tensors="pt")
    own = model.config._attn_implementation
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model.eval()(**inputs, output_attentions=True).attentions
    model.set_attn_implementation(own)
    capture = attnviz.capture(wrapped, text)
    difference = max(float((capture.layer(i) - layer[0]).abs().max()) for i, layer in enumerate(eager))
    print(f"wrapped capture vs eager output_attentions ({len(capture.tokens)} tokens): max |Δ| = {difference:.1e}")

    for what, run in (
        ("capture", lambda m: attnviz.capture(m, text)),
        (f"statistics, {len(texts)} texts", lambda m: attnviz.compute_statistics(m, texts, progress=False)),
    ):
        times: dict[str, list[float]] = {"wrapped": [], "loaded": []}
        for _ in range(args.rounds):  # interleaved, so a busy machine slows both alike
            times["wrapped"].append(_timed(run, wrapped))
            times["loaded"].append(_timed(run, loaded))
        best = {name: min(values) for name, values in times.items()}
        per_round = ", ".join(f"{w / l:.2f}" for w, l in zip(times["wrapped"], times["loaded"]))
        print(
            f"{what}: wrapped {best['wrapped'] * 1000:.0f} ms, loaded {best['loaded'] * 1000:.0f} ms, "
            f"ratio {best['wrapped'] / best['loaded']:.2f} (per round: {per_round})"
        )


if __name__ == "__main__":
    main()
