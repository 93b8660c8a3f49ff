"""Benchmark of ``attnviz prune`` on image classifiers: does importance beat chance, and what does pruning save?

Measured side by side in one run and printed as one table per model:

1. the shipped ``toy-odd-patch`` (2 layers × 4 heads): remove 2 heads chosen by ``gradient``
   (Fisher probes), ``ablation`` and ``random`` importance (mean of ``--seeds`` seeds); KL divergence
   from the unpruned model's predictions and agreement (share of unchanged top classes) on 256 fresh
   task images, parameters before and after;
2. a random ViT-base-sized classifier (12 layers × 12 heads, width 768, 224×224 images in 16×16
   patches, 1000 classes; transformers' own random initialisation): remove 25 % of the heads by ``gradient`` and ``random`` importance on
   ``--images`` random block images, evaluated on as many others; parameters and the forward latency
   of one image before and after (fastest of ``--repeats`` interleaved rounds).

Targets: gradient and ablation change the predictions less than random (lower KL, higher agreement).

Run:  python benchmarks/bench_prune_vision.py            (about 10 minutes on 2 busy CPU cores)
      python benchmarks/bench_prune_vision.py --quick    (fewer images, a 4-layer model; a smoke test)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from attnviz.models.specs import load_model
from attnviz.prune.pipeline import PruneConfig, prune_model


def block_images(count: int, seed: int, size: int = 224):
    """``count`` seeded RGB images of 8×8 blocks of random colour."""
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    images = []
    for _ in range(count):
        blocks = torch.randint(0, 256, (8, 8, 3), generator=generator, dtype=torch.uint8)  # [8, 8, rgb]
        pixels = blocks.repeat_interleave(size // 8, 0).repeat_interleave(size // 8, 1)  # [size, size, rgb]
        images.append(Image.fromarray(pixels.numpy(), "RGB"))
    return images


def vit_base_classifier(path: Path, layers: int) -> Path:
    """A random ViT-base-sized ``ViTForImageClassification`` (1000 classes) and its processor, saved in ``path``."""
    import transformers

    config = transformers.ViTConfig(num_hidden_layers=layers, num_labels=1000)
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(config).eval()
    model.save_pretrained(path)
    transformers.ViTImageProcessor().save_pretrained(path)
    return path


def run(loaded, method: str, config: dict, **data):
    outcome = prune_model(loaded, PruneConfig(importance=method, **config), **data)
    return outcome.report


def row(name: str, reports: list) -> str:
    kl = statistics.mean(r.loss_after for r in reports)
    agreement = statistics.mean(r.metric_after for r in reports)
    first = reports[0]
    return (
        f"{name:<22} {kl:>10.4f} {agreement:>10.3f} {first.params_before:>13,} {first.params_after:>13,} "
        f"{first.latency_before_ms:>9.1f} {first.latency_after_ms:>9.1f}"
    )


def table(title: str, rows: list[str]) -> None:
    print(f"\n{title}")
    print(
        f"{'importance':<22} {'KL (nats)':>10} {'agreement':>10} {'params before':>13} {'params after':>13} "
        f"{'ms before':>9} {'ms after':>9}"
    )
    for line in rows:
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=3, help="random-importance seeds to average")
    parser.add_argument("--images", type=int, default=16, help="scoring (and as many evaluation) images, ViT-base")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved latency rounds")
    args = parser.parse_args()
    seeds = 1 if args.quick else args.seeds
    count = 8 if args.quick else args.images
    print(
        f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; torch threads {torch.get_num_threads()}"
    )

    toy = load_model("toy-odd-patch", device="cpu")
    settings = {"count": 2, "latency_repeats": args.repeats}
    rows = [row(method, [run(toy, method, settings)]) for method in ("gradient", "ablation")]
    rows.append(row(f"random ({seeds} seeds)", [run(toy, "random", {**settings, "seed": s}) for s in range(seeds)]))
    table("toy-odd-patch: 2 of 8 heads removed, 256 fresh task images", rows)

    with tempfile.TemporaryDirectory() as folder:
        layers = 4 if args.quick else 12
        vit = load_model(str(vit_base_classifier(Path(folder) / "vit", layers)), device="cpu")
        data = {"images": block_images(count, seed=1), "eval_images": block_images(count, seed=2)}
        settings = {"ratio": 0.25, "latency_repeats": args.repeats, "batch_size": 8}
        rows = [row("gradient", [run(vit, "gradient", settings, **data)])]
        rows.append(
            row(f"random ({seeds} seeds)", [run(vit, "random", {**settings, "seed": s}, **data) for s in range(seeds)])
        )
        table(
            f"random ViT-base-sized classifier ({layers} layers × 12 heads): 25 % of the heads removed, "
            f"{count} + {count} images",
            rows,
        )
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
