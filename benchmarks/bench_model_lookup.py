"""Benchmark: how long a misspelled model name takes to be refused (target: under 3 s), next to the CLI's start-up.

Each run is a fresh ``python -m attnviz`` process, as a user's shell starts it, WITHOUT ``HF_HUB_OFFLINE`` and with
the Hugging Face endpoint on a closed loopback port (a network attempt would fail fast there, and show as its
error). ``attnviz --version`` is the floor: the interpreter and the CLI's own imports. Prints the fastest of
``--rounds`` for each typo and its ratio to the floor.

    python benchmarks/bench_model_lookup.py
    python benchmarks/bench_model_lookup.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

TYPOS = ("minlm", "smolm2", "toy-inductoin", "bert-base-uncased")
TARGET_SECONDS = 3.0


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def timed(args: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "attnviz", *args], check=False, env=env, capture_output=True, text=True
    )
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    env = {name: value for name, value in os.environ.items() if name != "HF_HUB_OFFLINE"}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{closed_port()}"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")

    runs = {"--version (floor)": ["--version"]}
    runs |= {f"--model {typo}": ["heatmap", "The cat sat.", "--model", typo, "--out", "x.png"] for typo in TYPOS}
    best = {name: float("inf") for name in runs}
    for _ in range(arguments.rounds):  # interleaved: the machine's load falls on every case alike
        for name, args in runs.items():
            seconds, result = timed(args, env)
            best[name] = min(best[name], seconds)
            if name != "--version (floor)":
                lines = result.stderr.strip().splitlines()
                assert result.returncode != 0 and len(lines) == 1 and lines[0].startswith("error:"), result.stderr
                assert "127.0.0.1" not in result.stderr, f"{name} reached for the network: {result.stderr}"
    floor = best["--version (floor)"]
    print(f"{'run':<32} {'seconds':>8} {'× floor':>8}")
    for name, seconds in best.items():
        verdict = "" if name.startswith("--version") else ("ok" if seconds < TARGET_SECONDS else "SLOW")
        print(f"{name:<32} {seconds:8.2f} {seconds / floor:8.2f}  {verdict}")
    print(f"target: every misspelled name refused in under {TARGET_SECONDS:.0f} s, with no network attempt")


if __name__ == "__main__":
    main()
