"""Options shared by several commands (Typer ``Annotated`` aliases), grouped in help panels."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

MODEL_PANEL = "Model"
INPUT_PANEL = "Input"
OUTPUT_PANEL = "Output"

ModelOption = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help=(
            "Model spec: 'minilm' (default, BERT encoder), 'smollm2' (LLaMA-architecture causal LM), "
            "a Hugging Face model directory, a .gguf file, a hub id in the local cache, or an attnviz "
            "toy or pruned checkpoint directory. Example: --model smollm2"
        ),
        rich_help_panel=MODEL_PANEL,
    ),
]

DeviceOption = Annotated[
    str,
    typer.Option(
        "--device",
        help="cpu, cuda or auto (CUDA when available). Example: --device cpu",
        rich_help_panel=MODEL_PANEL,
    ),
]

DtypeOption = Annotated[
    str,
    typer.Option(
        "--dtype",
        help="auto (float32), float32, float16 or bfloat16. Example: --dtype bfloat16",
        rich_help_panel=MODEL_PANEL,
    ),
]

MaxLengthOption = Annotated[
    int | None,
    typer.Option(
        "--max-length",
        min=1,
        help="Truncate inputs to this many tokens (default: the model's maximum). Example: --max-length 128",
        rich_help_panel=INPUT_PANEL,
    ),
]

NoTruncateOption = Annotated[
    bool,
    typer.Option(
        "--no-truncate",
        help="Refuse inputs longer than the maximum length instead of truncating them with a warning. "
        "Example: --no-truncate",
        rich_help_panel=INPUT_PANEL,
    ),
]

TargetOption = Annotated[
    str | None,
    typer.Option(
        "--target",
        help='Decoder text of an encoder-decoder model. Example: --target "Le chat"',
        rich_help_panel=INPUT_PANEL,
    ),
]


class DeviceMap(str, Enum):
    """Big-model placement: ``auto`` spreads a model over the GPUs and CPU memory (accelerate)."""

    auto = "auto"


DeviceMapOption = Annotated[
    DeviceMap | None,
    typer.Option(
        "--device-map",
        help="auto: spread a model too big for one device over the GPUs and CPU memory (accelerate); "
        "means the CPU on machines without CUDA. Overrides --device. Example: --device-map auto",
        rich_help_panel=MODEL_PANEL,
        show_default=False,
    ),
]

MaxTokensPerBatchOption = Annotated[
    int | None,
    typer.Option(
        "--max-tokens-per-batch",
        min=1,
        help="Most padded tokens (examples × longest) per forward pass; examples are sorted by length so "
        "little goes to padding (default: no token limit, only --batch-size). Example: --max-tokens-per-batch 4096",
        rich_help_panel=INPUT_PANEL,
        show_default=False,
    ),
]

GENERATION_PANEL = "Generation"

GenerateOption = Annotated[
    int | None,
    typer.Option(
        "--generate",
        min=1,
        help="Let a causal LM or encoder-decoder model continue TEXT by up to N tokens (greedy unless --sample) "
        "and capture every step's attention, key/value cache included. Example: --generate 20",
        rich_help_panel=GENERATION_PANEL,
    ),
]

SampleOption = Annotated[
    bool,
    typer.Option(
        "--sample",
        help="With --generate: draw each token from softmax(logits / temperature) instead of taking the argmax. "
        "Example: --sample --temperature 0.8 --seed 1",
        rich_help_panel=GENERATION_PANEL,
    ),
]

TemperatureOption = Annotated[
    float,
    typer.Option(
        "--temperature",
        help="With --sample: divides the logits; below 1 is more conservative. Example: --temperature 0.7",
        rich_help_panel=GENERATION_PANEL,
    ),
]

SampleSeedOption = Annotated[
    int | None,
    typer.Option(
        "--seed",
        help="With --sample: random seed, so the same seed writes the same text. Example: --seed 42",
        rich_help_panel=GENERATION_PANEL,
    ),
]


DataOption = Annotated[
    Path | None,
    typer.Option(
        "--data",
        "-d",
        help='Text file, one example per line, or JSON Lines with a "text" field (default: the shipped '
        "English corpus; toy checkpoints: their task); '-' reads standard input. Example: --data reviews.jsonl",
        rich_help_panel=INPUT_PANEL,
    ),
]

TextOption = Annotated[
    list[str] | None,
    typer.Option(
        "--text",
        "-t",
        help='An example given inline (repeatable). Example: --text "The cat sat on the mat."',
        rich_help_panel=INPUT_PANEL,
    ),
]


class StackChoice(str, Enum):
    """An attention stack (see :data:`attnviz.core.stacks.STACKS`)."""

    self_ = "self"
    encoder = "encoder"
    decoder = "decoder"
    cross = "cross"


def stack_value(choice: StackChoice | None) -> str | None:
    """The stack name of a ``--stack`` choice (None: all stacks / the first)."""
    return choice.value if choice is not None else None
