"""The toy vision task ``odd-patch``: a small ViT whose class token has a known job.

Each image is 32×32 RGB, a 4×4 grid of 8×8-pixel patches, all one random colour but one patch of
a clearly different random colour; the label is that patch's index (row-major, 0–15). To answer,
the class token must find the odd patch and read its position, so in a trained model its attention
in the last layer lands on that patch.

The model is transformers' own ``ViTForImageClassification`` (tiny), saved as a Hugging Face
directory with its image processor: it loads through the same loader as any ViT
(:mod:`attnviz.models.vision`), and the directory's :data:`IMAGE_TASK_FILE` records the task and
the training, so the model can draw examples of its own task. Training reuses the token toys'
settings, schedule and progress bar (:mod:`attnviz.toy.training`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

if sys.version_info >= (3, 11):
    from typing import Self
else:  # pragma: no cover
    from typing_extensions import Self

from attnviz.common.errors import InputError
from attnviz.common.progress import progress_bar, quiet_third_party
from attnviz.models.base import IMAGE_TASK_FILE  # marks an image-task toy checkpoint (next to config.json)
from attnviz.outputs import files
from attnviz.toy.checkpoint import check_checkpoint_output
from attnviz.toy.tasks import IMAGE_TASKS
from attnviz.toy.training import TrainingSettings, learning_rate_at

if TYPE_CHECKING:
    from PIL.Image import Image

    from attnviz.models.vision import VisionModel

TASK_NAME = IMAGE_TASKS[0]
IMAGE_SIZE = 32
PATCH_SIZE = 8
GRID = IMAGE_SIZE // PATCH_SIZE
#: the smallest RGB distance (colours in 0–1) between the odd patch and the others: "clearly different"
MIN_COLOUR_DISTANCE = 0.3


@dataclass(frozen=True)
class ToyImageModelSettings:
    """What every toy image model's size starts with (stored in the checkpoint, these fields first)."""

    #: the model, as messages name it
    MODEL: ClassVar[str] = "the toy image model"

    width: int = 64
    num_heads: int = 4

    def validate(self) -> Self:
        check_model_sizes(self, self.MODEL)
        return self


@dataclass(frozen=True)
class OddPatchModelSettings(ToyImageModelSettings):
    """The toy ViT's size (stored in the checkpoint)."""

    MODEL: ClassVar[str] = "the odd-patch ViT"

    num_layers: int = 2
    mlp_width: int = 128


def check_model_sizes(settings: Any, model: str) -> None:
    """InputError unless every size field of a toy image model's settings is at least 1 and the heads divide the width."""
    for item in fields(settings):
        if getattr(settings, item.name) < 1:
            raise InputError(f"{item.name} must be at least 1 for {model} (got {getattr(settings, item.name)})")
    if settings.width % settings.num_heads:
        raise InputError(f"{settings.num_heads} heads do not divide the width {settings.width}: choose a divisor")


def toy_image_processor(size: int):
    """The image processor of the toy image models: ``size``×``size`` pixels, mean 0.5 and std 0.5 per channel."""
    import transformers

    from attnviz.models.hf_checks import quiet_image_processors

    with quiet_image_processors():
        return transformers.ViTImageProcessor(
            size={"height": size, "width": size}, image_mean=[0.5] * 3, image_std=[0.5] * 3
        )


def odd_patch_pixels(count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``count`` examples: ``[b, 32, 32, 3]`` float32 colours in 0–1, and ``[b]`` long labels (the odd patch)."""
    base = torch.rand(count, 3, generator=generator)  # [b, rgb]
    odd = torch.rand(count, 3, generator=generator)  # [b, rgb]
    for _ in range(100):  # redraw odd colours too close to the base colour
        close = (odd - base).norm(dim=1) < MIN_COLOUR_DISTANCE  # [b]
        if not close.any():
            break
        odd[close] = torch.rand(int(close.sum()), 3, generator=generator)
    labels = torch.randint(0, GRID * GRID, (count,), generator=generator)  # [b]
    is_odd = torch.nn.functional.one_hot(labels, GRID * GRID).bool().view(count, GRID, GRID)  # [b, 4, 4]
    colours = torch.where(is_odd[..., None], odd[:, None, None, :], base[:, None, None, :])  # [b, 4, 4, rgb]
    pixels = colours.repeat_interleave(PATCH_SIZE, 1).repeat_interleave(PATCH_SIZE, 2)  # [b, 32, 32, rgb]
    return pixels, labels


def odd_patch_images(count: int, seed: int) -> tuple[list[Image], list[int]]:
    """``count`` odd-patch examples drawn with ``seed``, as 8-bit RGB PIL images, and their labels."""
    from PIL import Image as PILImage

    pixels, labels = odd_patch_pixels(count, torch.Generator().manual_seed(seed))
    bytes_ = (pixels * 255).round().to(torch.uint8).numpy()  # [b, 32, 32, rgb]
    return [PILImage.fromarray(array, "RGB") for array in bytes_], labels.tolist()


def task_images(count: int, seed: int) -> list[Image]:
    """``count`` fresh odd-patch images drawn with ``seed``: a trained toy's own examples (``own_images``)."""
    from attnviz.common.resources import require_memory

    # every image is held at once (float pixels, the 8-bit picture, the processed tensor): refuse what cannot fit
    require_memory("toy_examples", count, 16.0 * count * IMAGE_SIZE * IMAGE_SIZE * 3, "the task images")
    return odd_patch_images(count, seed)[0]


def toy_vit_config(settings: Any, num_layers: int, **extra: Any):
    """The ``ViTConfig`` of a toy image model (odd-patch's classifier, the captioner's encoder): ``settings``' width,
    heads and MLP width, ``num_layers`` layers, 32×32 images in 8×8 patches, no dropout; ``extra``: more fields."""
    import transformers

    return transformers.ViTConfig(
        hidden_size=settings.width,
        num_hidden_layers=num_layers,
        num_attention_heads=settings.num_heads,
        intermediate_size=settings.mlp_width,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **extra,
    )


@quiet_third_party()
def build_odd_patch_model(settings: OddPatchModelSettings, seed: int = 0):
    """An untrained tiny ``ViTForImageClassification`` (16 classes) and its image processor."""
    import transformers

    settings.validate()
    config = toy_vit_config(
        settings,
        settings.num_layers,
        num_labels=GRID * GRID,
        id2label={index: f"r{index // GRID}c{index % GRID}" for index in range(GRID * GRID)},
        label2id={f"r{index // GRID}c{index % GRID}": index for index in range(GRID * GRID)},
    )
    processor = toy_image_processor(IMAGE_SIZE)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.ViTForImageClassification(config)
    return model, processor


@dataclass
class OddPatchResult:
    """A trained odd-patch ViT and how well it does on fresh held-out images."""

    model: Any  # ViTForImageClassification, eval mode
    processor: Any
    accuracy: float  # held-out classification accuracy
    attention_hits: float  # share of held-out images whose last-layer [CLS] attention peaks on the odd patch
    seconds: float
    settings: TrainingSettings
    model_settings: OddPatchModelSettings


def normalised_pixels(pixels: Tensor) -> Tensor:
    """``[b, H, W, 3]`` 0–1 -> ``[b, 3, H, W]`` as the processor makes it (mean 0.5, std 0.5)."""
    return (pixels.permute(0, 3, 1, 2) - 0.5) / 0.5


def train_odd_patch(
    settings: TrainingSettings, model_settings: OddPatchModelSettings | None = None, *, description: str | None = None
) -> OddPatchResult:
    """Train the toy ViT on fresh odd-patch images every step (AdamW, warmup then cosine decay), then measure it."""
    settings.validate()
    model_settings = (model_settings or OddPatchModelSettings()).validate()
    model, processor = build_odd_patch_model(model_settings, settings.seed)
    generator = torch.Generator().manual_seed(settings.seed)

    def batch_loss(step: int) -> tuple[Tensor, Callable[[], str]]:
        pixels, labels = odd_patch_pixels(settings.batch_size, generator)
        logits = model(pixel_values=normalised_pixels(pixels)).logits  # [b, 16]
        loss = torch.nn.functional.cross_entropy(logits, labels)

        def status() -> str:
            accuracy = float((logits.argmax(-1) == labels).float().mean())
            return f"loss {loss.item():.3f}  accuracy {accuracy:.1%}"

        return loss, status

    seconds = train_image_model(model, settings, description or f"training {TASK_NAME}", batch_loss, status_every=10)
    accuracy, hits = measure_odd_patch(model, settings.eval_examples, seed=10_000 + settings.seed)
    return OddPatchResult(model, processor, accuracy, hits, seconds, settings, model_settings)


def train_image_model(
    model: torch.nn.Module,
    settings: TrainingSettings,
    description: str,
    batch_loss: Callable[[int], tuple[Tensor, Callable[[], str]]],
    *,
    status_every: int,
) -> float:
    """Train a toy image model in place for ``settings.steps`` steps (AdamW, warmup then cosine decay, gradients
    clipped at 1), leave it in eval mode and return the seconds it took.

    ``batch_loss(step)``: the loss of that step's fresh batch, and the progress status to show every
    ``status_every`` steps (and at the last).
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=settings.weight_decay)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # toy-sized matrices are fastest on one thread
    started = time.perf_counter()
    try:
        model.train()
        with progress_bar() as progress:
            task = progress.add_task(description, total=settings.steps, status="")
            for step in range(settings.steps):
                for group in optimizer.param_groups:
                    group["lr"] = learning_rate_at(step, settings)
                loss, status = batch_loss(step)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                if step % status_every == 0 or step == settings.steps - 1:
                    progress.update(task, status=status())
                progress.advance(task)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return time.perf_counter() - started


def class_token_peaks(last_layer: Tensor, extra_tokens: int = 1) -> Tensor:
    """``[b]``: the patch on which the class token's attention peaks, maximised over heads.

    ``last_layer``: ``[b, h, q, k]`` patterns of the last layer (token 0 the class token).
    """
    to_patches = last_layer[:, :, 0, extra_tokens:]  # [b, h, patches]
    return to_patches.amax(dim=1).argmax(dim=-1)  # [b]


@contextmanager
def eager_attention(model) -> Iterator[None]:
    """Run a transformers ``model`` with its eager attention (which can return the patterns), then restore its own."""
    implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(implementation)


def measure_odd_patch(model, count: int, *, seed: int) -> tuple[float, float]:
    """(accuracy, share of images whose last-layer class-token attention peaks on the odd patch) on fresh images."""
    pixels, labels = odd_patch_pixels(count, torch.Generator().manual_seed(seed))
    with torch.no_grad(), eager_attention(model):
        outputs = model(pixel_values=normalised_pixels(pixels), output_attentions=True)
    accuracy = float((outputs.logits.argmax(-1) == labels).float().mean())
    hits = float((class_token_peaks(outputs.attentions[-1]) == labels).float().mean())
    return accuracy, hits


def check_odd_patch_output(path: str | os.PathLike) -> Path:
    """A checkpoint destination: new, empty, or an earlier odd-patch checkpoint (replaced); else OutputError."""
    out = Path(path).expanduser()
    if out.is_dir() and (out / IMAGE_TASK_FILE).is_file():
        files.check_output_parent(out)
        return out
    return check_checkpoint_output(out)


def save_odd_patch(result: OddPatchResult, path: str | os.PathLike) -> Path:
    """Write the trained model, its image processor and :data:`IMAGE_TASK_FILE` into a new directory, atomically."""
    return save_image_task(
        path,
        (result.model, result.processor),
        {"task": TASK_NAME, "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE},
        result,
        {"accuracy": result.accuracy, "class_token_on_odd_patch": result.attention_hits},
    )


@quiet_third_party()  # no "Writing model shards" bar
def save_image_task(
    path: str | os.PathLike,
    parts: Sequence[Any],
    task: Mapping[str, Any],
    result: Any,
    held_out: Mapping[str, float],
) -> Path:
    """Write a trained toy image model into a new directory, atomically: each of ``parts`` (the model, its image
    processor, a tokenizer: anything with ``save_pretrained``) and :data:`IMAGE_TASK_FILE`, which records ``task``
    (its name and facts), the result's ``model_settings``, its training ``settings`` and ``seconds``, and the
    ``held_out`` measurements."""
    out = check_odd_patch_output(path)
    document = {
        **task,
        "model": asdict(result.model_settings),
        "training": {"settings": asdict(result.settings), "seconds": round(result.seconds, 1)},
        "held_out": dict(held_out),
    }
    with files.staged_directory(out) as staging:
        for part in parts:
            part.save_pretrained(staging)
        (staging / IMAGE_TASK_FILE).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return out


def own_odd_patch_examples(loaded: VisionModel, count: int, seed: int):
    """A batch of ``count`` fresh odd-patch images for ``loaded`` (a model trained on the task)."""
    images, _ = odd_patch_images(count, seed)
    return loaded.encode_images(images)
