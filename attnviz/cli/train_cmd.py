"""`attnviz train TASK`: train a toy transformer on a synthetic task and save it as a checkpoint directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.options import (
    DIRECTORY_METAVAR,
    OUTPUT_PANEL,
    DeviceOption,
    choice_enum,
    choice_option,
    choice_parser,
    option,
)
from attnviz.common.wording import layers_and_heads, plural
from attnviz.toy.config import ARCHITECTURES, VARIANT_NAMES
from attnviz.toy.tasks import IMAGE_TASKS, TASKS

# Closed sets as Enums, so --help lists the choices and Click refuses anything else.
TASK_NAMES = tuple(TASKS)
#: tasks on images (attnviz.toy.odd_patch): a small ViT, trained with the size and training options only
IMAGE_TASK_NAMES = IMAGE_TASKS
TaskName = choice_enum("TaskName", TASK_NAMES + IMAGE_TASK_NAMES)
Architecture = choice_enum("Architecture", ARCHITECTURES)
AttentionVariant = choice_enum("AttentionVariant", VARIANT_NAMES)

TASK_PANEL = "Task"
SIZE_PANEL = "Model size"
VARIANT_PANEL = "Attention variant"
TRAINING_PANEL = "Training"


def train(
    task: Annotated[
        TaskName,
        typer.Argument(
            parser=choice_parser(TaskName, "task"),
            help="The synthetic task (its known solution is an attention pattern). Example: attnviz train reverse",
            show_default=False,
        ),
    ],
    out: option(
        Path | None,
        "--out",
        "-o",
        metavar=DIRECTORY_METAVAR,
        help="Checkpoint directory to write (default: toy-TASK-trained, which no shipped model is called). "
        "Example: --out my-reverse",
        panel=OUTPUT_PANEL,
    ) = None,
    checkpoint_every: option(
        int | None,
        "--checkpoint-every",
        min=1,
        help="Also save a checkpoint every N steps, under OUT/steps/ (a series for attnviz stats). "
        "Example: --checkpoint-every 100",
        panel=OUTPUT_PANEL,
    ) = None,
    architecture: choice_option(
        Architecture,
        "--architecture",
        "architecture",
        help="Which stacks the model has (default: the task's; reverse is encoder-decoder). "
        "Example: --architecture decoder",
        panel=TASK_PANEL,
        optional=True,
    ) = None,
    lengths: option(
        str | None,
        "--lengths",
        help="Shortest and longest item count of the random examples, MIN:MAX (induction: of the half that "
        "repeats). Example: --lengths 3:8",
        panel=TASK_PANEL,
    ) = None,
    symbols: option(
        int | None,
        "--symbols",
        help="Distinct symbols the items are drawn from. Example: --symbols 10",
        panel=TASK_PANEL,
    ) = None,
    width: option(
        int | None, "--width", help="Residual stream width d_model (default 64). Example: --width 64", panel=SIZE_PANEL
    ) = None,
    heads: option(
        int | None,
        "--heads",
        help="Heads per attention layer; must divide the width (default 4). Example: --heads 4",
        panel=SIZE_PANEL,
    ) = None,
    layers: option(
        int | None,
        "--layers",
        help="Layers of the encoder and of the decoder (default 2; induction needs 2). Example: --layers 2",
        panel=SIZE_PANEL,
    ) = None,
    mlp_width: option(
        int | None,
        "--mlp-width",
        help="MLP hidden width; 0 for an attention-only model (default 4 × width; induction 0). "
        "Example: --mlp-width 128",
        panel=SIZE_PANEL,
    ) = None,
    absolute_positions: option(
        bool | None,
        "--absolute-positions/--no-absolute-positions",
        help="Add learned absolute position embeddings (default on; induction off). Example: --no-absolute-positions",
        panel=SIZE_PANEL,
        show_default=False,
    ) = None,
    attention: choice_option(
        AttentionVariant,
        "--attention",
        "attention variant",
        help="Attention variant (default scaled-dot; induction: relative). Example: --attention performer",
        panel=VARIANT_PANEL,
        optional=True,
    ) = None,
    window: option(
        int | None,
        "--window",
        help="local/strided/longformer/bigbird: keys with |i−j| ≤ window are visible (default 2). Example: --window 2",
        panel=VARIANT_PANEL,
    ) = None,
    stride: option(
        int | None,
        "--stride",
        help="strided: every stride-th key is visible too (default 4). Example: --stride 4",
        panel=VARIANT_PANEL,
    ) = None,
    global_tokens: option(
        int | None,
        "--global-tokens",
        help="longformer/bigbird: leading positions that see and are seen by all (default 1). "
        "Example: --global-tokens 1",
        panel=VARIANT_PANEL,
    ) = None,
    block_size: option(
        int | None,
        "--block-size",
        help="bigbird: tokens per random block (default 4). Example: --block-size 4",
        panel=VARIANT_PANEL,
    ) = None,
    random_blocks: option(
        int | None,
        "--random-blocks",
        help="bigbird: random key blocks per query block (default 1). Example: --random-blocks 1",
        panel=VARIANT_PANEL,
    ) = None,
    max_relative_position: option(
        int | None,
        "--max-relative-position",
        help="relative: offsets j−i are clipped to ±this (default 8; induction 2). Example: --max-relative-position 8",
        panel=VARIANT_PANEL,
    ) = None,
    features: option(
        int | None,
        "--features",
        help="performer: random features per head (default 32). Example: --features 64",
        panel=VARIANT_PANEL,
    ) = None,
    steps: option(
        int | None,
        "--steps",
        help="Optimisation steps (default: the task's, 600). Example: --steps 1500",
        panel=TRAINING_PANEL,
    ) = None,
    batch_size: option(
        int, "--batch-size", help="Random examples per step. Example: --batch-size 64", panel=TRAINING_PANEL
    ) = 64,
    learning_rate: option(
        float, "--lr", help="Peak AdamW learning rate. Example: --lr 0.003", panel=TRAINING_PANEL
    ) = 3e-3,
    seed: option(
        int,
        "--seed",
        help="Seeds weights and examples: the same seed gives the same model. Example: --seed 1",
        panel=TRAINING_PANEL,
    ) = 0,
    eval_examples: option(
        int,
        "--eval-examples",
        help="Held-out examples for the final accuracy. Example: --eval-examples 1000",
        panel=TRAINING_PANEL,
    ) = 1000,
    device: DeviceOption = "cpu",
) -> None:
    """Train a toy transformer on a synthetic task with a known attention solution, and save it.

    The checkpoint directory (default toy-TASK-trained) works as a model spec everywhere, e.g.
    attnviz heatmap "3 1 4 1 5" --model ./toy-reverse-trained --target "5 1 4 1 3". odd-patch trains a small
    ViT on 32×32 images (attnviz heatmap --image odd.png --model ./toy-odd-patch-trained); caption trains a small
    ViT + GPT-2 captioner (--layers: decoder layers; attnviz heatmap --image shapes.png --model ./toy-caption
    --generate 4).
    """
    from attnviz.cli.console import console
    from attnviz.common.errors import InputError
    from attnviz.models.base import parameter_count
    from attnviz.models.specs import path_spec, resolve_device
    from attnviz.toy.checkpoint import check_checkpoint_output
    from attnviz.toy.run import train_to_directory
    from attnviz.toy.tasks import get_task
    from attnviz.toy.training import TrainingSettings, build_toy_model

    task = task.value
    if task in IMAGE_TASK_NAMES:
        token_only = {
            "--architecture": architecture, "--lengths": lengths, "--symbols": symbols,
            "--absolute-positions": absolute_positions, "--attention": attention, "--window": window,
            "--stride": stride, "--global-tokens": global_tokens, "--block-size": block_size,
            "--random-blocks": random_blocks, "--max-relative-position": max_relative_position,
            "--features": features, "--checkpoint-every": checkpoint_every,
        }  # fmt: skip
        given = [flag for flag, value in token_only.items() if value is not None]
        if given:
            raise InputError(f"{', '.join(given)} apply to the token tasks; {task} trains a small ViT")
        from attnviz.cli.train_images import train_image_task

        train_image_task(
            task, out, width, heads, layers, mlp_width, steps, batch_size, learning_rate, seed, eval_examples
        )
        return
    min_length, max_length = _parse_lengths(lengths)
    loaded = build_toy_model(
        task,
        architecture=architecture.value if architecture is not None else None,
        min_length=min_length,
        max_length=max_length,
        num_symbols=symbols,
        width=width,
        num_heads=heads,
        num_layers=layers,
        mlp_width=mlp_width,
        absolute_positions=absolute_positions,
        attention=attention.value if attention is not None else None,
        window=window,
        stride=stride,
        global_tokens=global_tokens,
        block_size=block_size,
        random_blocks=random_blocks,
        max_relative_position=max_relative_position,
        num_features=features,
        seed=seed,
    )
    steps = steps if steps is not None else get_task(task).default_steps
    settings = TrainingSettings(
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
        eval_examples=eval_examples,
        checkpoint_every=checkpoint_every,
    ).validate()
    out = check_checkpoint_output(out if out is not None else Path(default_output(task)))
    loaded.model.to(resolve_device(device))
    config = loaded.config
    console.print(
        f"training [bold]{task}[/bold]: {config.architecture}, "
        f"{layers_and_heads([config.num_heads] * config.num_layers)}, width {config.width}, {config.attention} attention, "
        f"{parameter_count(loaded.model):,} parameters, {plural(steps, 'step')}",
        highlight=False,
    )
    run = train_to_directory(loaded, settings, out, description=f"training {task}")
    held_out, result, series = run.result.held_out, run.result, run.series
    console.print(
        f"held-out accuracy [bold]{held_out['accuracy']:.2%}[/bold] of {held_out['tokens']} labelled tokens, "
        f"{held_out['sequence_accuracy']:.2%} of {plural(int(held_out['examples']), 'example')} entirely right "
        f"(loss {held_out['loss']:.4f}; trained in {result.seconds:.0f} s)",
        highlight=False,
    )
    if run.best_head is not None:
        best = run.best_head
        console.print(
            f"head {best.head} of {best.site.name} puts {best.score:.0%} of its weight where the task's known "
            "solution looks",
            highlight=False,
        )
    extra = f" and {plural(len(series), 'step checkpoint')} under {out / 'steps'}" if series else ""
    console.print(f"saved the checkpoint{extra}; use it as --model {path_spec(str(out))}", highlight=False)
    print(out)  # the product, on stdout


def default_output(task: str) -> str:
    """``toy-TASK-trained``: the shipped models are called ``toy-TASK``, and a directory of that name would hide one."""
    return f"toy-{task}-trained"


def _parse_lengths(text: str | None) -> tuple[int | None, int | None]:
    """``"3:8"`` -> (3, 8); ``"5"`` -> (5, 5); None -> the task's defaults."""
    from attnviz.common.errors import InputError

    if text is None:
        return None, None
    low, _, high = text.partition(":")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise InputError(f"--lengths {text!r} is not MIN:MAX: give two whole numbers, e.g. --lengths 3:8") from None


def register(app: typer.Typer) -> None:
    """Add this command to ``app``."""
    app.command("train")(train)
