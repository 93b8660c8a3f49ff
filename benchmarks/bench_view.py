"""Benchmark: the attention page at length — its size, the time to build it, and the time Chromium takes to open it.

A page that kept every cell would grow as ``layers · heads · n²``; past a limit the page keeps a pooled overview
and each query row's strongest keys within a byte budget (``attnviz.render.html_rows``). This builds the page of
one text while the model runs (``stream_attention_view``: no capture of all layers is held), writes it, opens it in
headless Chromium and prints, per length: the page's size, the keys kept per row, the build time beside a plain
forward pass (ratio, fastest of interleaved rounds), the peak memory of this process, and the time until the page
has drawn its head view.

It also times the page of a **saved capture** (``--capture-tokens``, default 512, every layer): the capture
is made, saved and loaded again, then ``attention_view_html`` of every layer and of one layer are timed with
torch's default threads and with one (fastest of ``--rounds``; target: every layer of SmolLM2 at 512 tokens
in ≤ 3 s).

    python benchmarks/bench_view.py                          # tiny model with SmolLM2's 30 x 9 heads, 1,024-4,096 tokens
    python benchmarks/bench_view.py --model smollm2 --lengths 4096 --rounds 1
    python benchmarks/bench_view.py --model smollm2 --lengths "" --capture-tokens 512
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from attnviz.captures.attention_capture import AttentionCapture, capture
from attnviz.common.texts import default_corpus_path
from attnviz.models.specs import load_model, minilm_path
from attnviz.render.html_stream import stream_attention_view
from attnviz.render.html_view import attention_view_html, view_html

CHROMIUM = "/usr/bin/chromium"


def tiny_model(directory: Path, layers: int = 30, positions: int = 8192):
    """A random LLaMA with SmolLM2's head layout (30 layers x 9 query heads, 3 key/value heads), tiny otherwise."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=30522,
        hidden_size=36,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=4,
        max_position_embeddings=positions,
        initializer_range=0.2,
        tie_word_embeddings=True,
        bos_token_id=101,
        eos_token_id=102,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM._from_config(config, attn_implementation="eager").save_pretrained(directory)
    transformers.AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(directory)
    return load_model(str(directory), device="cpu")


def open_seconds(path: Path) -> tuple[float, list[str]]:
    """Seconds from navigation until the page has drawn its view, and its console errors."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        start = time.perf_counter()
        page.goto(path.resolve().as_uri())
        page.wait_for_selector("body[data-ready=true]", timeout=120_000)
        seconds = time.perf_counter() - start
        browser.close()
    return seconds, errors


def saved_capture_page(loaded, text: str, length: int, rounds: int, scratch: Path) -> None:
    """Time the page of a saved capture of every layer (and of one layer), default threads and one thread."""
    path = capture(loaded, text, max_length=length).save(scratch / f"capture-{length}.safetensors")
    saved = AttentionCapture.load(path)
    default_threads = torch.get_num_threads()
    for threads in sorted({default_threads, 1}, reverse=True):
        torch.set_num_threads(threads)
        every, one = [], []
        for _ in range(rounds):
            start = time.perf_counter()
            page = attention_view_html(saved)
            every.append(time.perf_counter() - start)
            start = time.perf_counter()
            attention_view_html(saved, layers=[0])
            one.append(time.perf_counter() - start)
        print(
            f"saved capture, {len(saved.tokens):>5} tokens, {threads} thread(s): page of every layer "
            f"({len(saved.recorded_layers())}) {min(every):.2f} s ({len(page) / 1e6:.1f} MB) · one layer "
            f"{min(one):.2f} s · load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    torch.set_num_threads(default_threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model spec (default: a tiny model with SmolLM2's heads)")
    parser.add_argument("--lengths", default="1024,4096", help="comma list of token counts")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (fastest kept)")
    parser.add_argument("--capture-tokens", type=int, default=512, help="tokens of the saved capture (0: skip)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        loaded = load_model(args.model, device="cpu") if args.model else tiny_model(Path(scratch) / "model")
        text = (default_corpus_path().read_text(encoding="utf-8") + " ") * 4
        print(f"model: {loaded.name} · {loaded.num_layers()} layers x {loaded.num_heads()} heads")
        if args.capture_tokens:
            saved_capture_page(loaded, text, args.capture_tokens, args.rounds, Path(scratch))
        for length in (int(n) for n in args.lengths.split(",") if n):
            batch = loaded.encode([text], max_length=length)
            forward, build = [], []
            for _ in range(args.rounds):
                start = time.perf_counter()
                with torch.no_grad():
                    loaded.forward(batch)
                forward.append(time.perf_counter() - start)
                start = time.perf_counter()
                payload = stream_attention_view(loaded, batch)
                build.append(time.perf_counter() - start)
            path = Path(scratch) / f"view-{length}.html"
            path.write_text(view_html(payload), encoding="utf-8")
            tops = sorted({layer.get("top", 0) for s in payload["stacks"] for layer in s["layers"]})
            seconds, errors = open_seconds(path)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(
                f"{len(batch.tokens[0]):>6} tokens: page {path.stat().st_size / 1e6:6.2f} MB · keys kept per row "
                f"{tops} · forward {min(forward):6.1f} s · page built while running {min(build):6.1f} s "
                f"(x{min(build) / min(forward):.2f}) · peak RSS {peak:,.0f} MB · Chromium draws it in {seconds:.1f} s"
                f" · console errors {len(errors)}"
            )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
