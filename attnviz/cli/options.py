"""Options shared by several commands (Typer ``Annotated`` aliases), grouped in help panels."""

from __future__ import annotations

from enum import Enum
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
