"""Benchmark: peak resident memory of ``attnviz stats`` at length against a plain forward pass, each in its own process.

Two children, each a fresh process over the same text (the shipped corpus run together, cut to ``--tokens``):

* ``forward``: SmolLM2-135M loaded as ``attnviz stats`` loads it, then transformers' own sdpa forward pass of
  the text: the floor (weights, Python, torch, one forward);
* ``stats``: the command itself, ``attnviz stats smollm2 --data FILE --max-length N --json OUT``, run in the
  child through the CLI's entry point.

Each child reports its own peak (``ru_maxrss`` of the process) and, apart, the largest peak among the
processes it started (``RUSAGE_CHILDREN``: the C++ compiler when the fused kernel is built, 1.5 GB; a
forked helper such as ``ninja`` counts the pages it shared with the command when it started). ``/usr/bin/time``
reports the larger of the two as the command's peak, so a kernel build reads as a rise of the command's
memory (1.05 → 1.54 GB): this script tells them apart. Target: the command's own peak at
2,048 tokens ≤ 1.15 GB.

    python benchmarks/bench_memory.py                    # 2,048 tokens
    python benchmarks/bench_memory.py --tokens 2048,8192
    python benchmarks/bench_memory.py --tokens 8192 --padded   # a batch of that text and one of half its length

``--padded`` batches the text with its first half, so the shorter one is padded: transformers' sdpa then builds a
boolean ``[b, 1, q, k]`` mask (it cannot say padding to torch's sdpa otherwise); attnviz describes it without one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

GB = 1e9
TARGET_GB = 1.15


def _peaks() -> dict:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {"own_bytes": own, "children_bytes": children}


def child(mode: str, data: Path, length: int) -> dict:
    if mode == "stats":
        from attnviz.cli.app import main as cli

        with tempfile.TemporaryDirectory() as scratch:
            sys.argv = ["attnviz", "stats", "smollm2", "--data", str(data), "--max-length", str(length)]
            sys.argv += ["--batch-size", "2", "--max-tokens-per-batch", str(2 * length)]
            sys.argv += ["--json", str(Path(scratch) / "stats.json"), "--no-table"]
            try:
                cli()
            except SystemExit as done:
                if done.code:
                    raise
        return _peaks()
    import torch
    import transformers

    from attnviz.models.specs import load_model

    loaded = load_model("smollm2", device="cpu")
    batch = loaded.encode(data.read_text(encoding="utf-8").splitlines(), max_length=length)
    path = loaded.model.config._name_or_path
    del loaded  # only the sdpa model stays resident
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    with torch.no_grad():
        model.model(**batch.inputs, use_cache=False)
    return _peaks()


def _first_tokens(text: str, count: int) -> str:
    """The text of ``text``'s first ``count`` tokens in SmolLM2's tokenizer."""
    import transformers

    from attnviz.models.specs import load_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(
        load_model("smollm2", device="cpu").model.config._name_or_path
    )
    return tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"][:count])


def measure(mode: str, data: Path, length: int) -> dict:
    command = [sys.executable, __file__, "--child", mode, "--data", str(data), "--tokens", str(length)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{mode} at {length} tokens failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="2048", help="comma-separated lengths (default 2048)")
    parser.add_argument("--padded", action="store_true", help="batch the text with its first half (padding)")
    parser.add_argument("--child", choices=["forward", "stats"], help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    lengths = [int(value) for value in args.tokens.split(",")]
    if args.child:
        print(json.dumps(child(args.child, args.data, lengths[0])))
        return
    from attnviz.common.texts import default_corpus_path

    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "long.txt"
        text = " ".join(default_corpus_path().read_text(encoding="utf-8").split("\n"))
        long = " ".join([text] * (1 + max(lengths) // 3000))
        what = "the text and its first half, one padded batch" if args.padded else "one text"
        print(f"SmolLM2-135M, {what}; peak resident memory of each process (GB); load {os.getloadavg()[0]:.1f}")
        print(f"{'tokens':>7} {'forward':>8} {'stats':>8} {'stats÷fwd':>10} {'stats children':>15}  target")
        for length in lengths:
            lines = [long]
            if args.padded:  # the first half of the tokens beside it: padded in the batch
                lines.append(_first_tokens(long, length // 2))
            data.write_text("\n".join(lines) + "\n", encoding="utf-8")
            forward = measure("forward", data, length)
            stats = measure("stats", data, length)
            own = stats["own_bytes"] / GB
            verdict = (
                f"≤ {TARGET_GB} GB: {'yes' if own <= TARGET_GB else 'NO'}" if length == 2048 and not args.padded else ""
            )
            print(
                f"{length:>7} {forward['own_bytes'] / GB:>8.2f} {own:>8.2f} "
                f"{stats['own_bytes'] / forward['own_bytes']:>9.2f}× {stats['children_bytes'] / GB:>15.2f}  {verdict}",
                flush=True,
            )
    print(
        "stats children: the largest process the command started (the C++ compiler when it builds the kernel; "
        "a forked helper counts the pages it shared with the command)"
    )


if __name__ == "__main__":
    main()
