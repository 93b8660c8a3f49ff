"""Options shared by several commands (Typer ``Annotated`` aliases), grouped in help panels.

A closed set of values is an Enum of :mod:`attnviz.cli.choice_parsing` (``choice_enum``, ``choice_parser``:
importable from here too); the command classes of ``--help`` are :mod:`attnviz.cli.plain_flags`."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from attnviz.cli.choice_parsing import choice_enum, choice_parser
from attnviz.core.choices import WEIGHTINGS
from attnviz.core.stacks import STACKS
from attnviz.models.choices import DTYPE_ALIASES, DTYPE_NAMES

MODEL_PANEL = "Model"
INPUT_PANEL = "Input"
OUTPUT_PANEL = "Output"
VIEW_PANEL = "What to show"
#: the metavar of an output option that names a directory (every other output option names a file)
DIRECTORY_METAVAR = "DIR"


def option(annotation: Any, *flags: str, help: str, panel: str, **extra: Any) -> Any:
    """``Annotated[annotation, typer.Option(*flags, …)]``: a command option listed under ``panel`` in ``--help``
    (``extra``: more of ``typer.Option``'s arguments, such as ``min``, ``metavar`` or ``show_default``)."""
    return Annotated[annotation, typer.Option(*flags, help=help, rich_help_panel=panel, **extra)]


def choice_option(
    choices: type[Enum],
    flag: str,
    what: str,
    *,
    help: str,
    panel: str,
    optional: bool = False,
    aliases: dict[str, str] | None = None,
    **extra: Any,
) -> Any:
    """An :func:`option` taking one member of ``choices`` (an Enum of :func:`choice_enum`), any case, parsed by
    :func:`choice_parser` (``what``: its name in the error, ``aliases``: former names); ``optional``: None when left
    out."""
    annotation = choices | None if optional else choices
    return option(annotation, flag, help=help, panel=panel, parser=choice_parser(choices, what, aliases), **extra)


MODEL_SPECS = (
    "'minilm' (default, BERT encoder), 'smollm2' (LLaMA-architecture causal LM), a Hugging Face model directory, "
    "a .gguf file, a hub id in the local cache, or an attnviz toy or pruned checkpoint directory"
)

CheckpointArgument = Annotated[
    str,
    typer.Argument(help=f"Model spec: {MODEL_SPECS}. Example: smollm2"),
]

ModelOption = option(
    str, "--model", "-m", help=f"Model spec: {MODEL_SPECS}. Example: --model smollm2", panel=MODEL_PANEL
)


#: the forms --device takes; the library (attnviz.models.specs.resolve_device) accepts the same
DEVICE_FORMS = ("auto", "cpu", "cuda", "cuda:N")


def parse_device(value: Any) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (any case) -> the lower-case form; anything else is refused."""
    device = str(value).strip().lower()
    if device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdecimal()):
        return device
    raise typer.BadParameter(f"unknown device {value!r}: use {', '.join(DEVICE_FORMS)} (N: the GPU number)")


def complete_device(incomplete: str) -> list[str]:
    """Shell completion of --device (the GPU numbers are not probed: that would import torch)."""
    return [form for form in ("auto", "cpu", "cuda", "cuda:0", "cuda:1") if form.startswith(incomplete.lower())]


DeviceOption = option(
    str,
    "--device",
    parser=parse_device,
    metavar="<device>",
    autocompletion=complete_device,
    help="Where the model runs: auto (CUDA when available, else the CPU), cpu, cuda, or cuda:N for GPU number N. "
    "Example: --device cpu",
    panel=MODEL_PANEL,
)


def parse_dtype(value: Any) -> str:
    """A precision name or alias (any case) -> its name in :data:`DTYPE_NAMES`; anything else is refused."""
    dtype = str(value).strip().lower()
    dtype = DTYPE_ALIASES.get(dtype, dtype)
    if dtype not in DTYPE_NAMES:
        raise typer.BadParameter(f"unknown dtype {value!r}: use one of {', '.join(DTYPE_NAMES)}")
    return dtype


def complete_dtype(incomplete: str) -> list[str]:
    """Shell completion of --dtype."""
    return [name for name in DTYPE_NAMES if name.startswith(incomplete.lower())]


DtypeOption = option(
    str,
    "--dtype",
    parser=parse_dtype,
    metavar="<dtype>",
    autocompletion=complete_dtype,
    help="Precision of the weights: auto (float32, exact patterns), float32, float16 or bfloat16 (half the "
    "memory; fp32, fp16 and bf16 work too). Example: --dtype bfloat16",
    panel=MODEL_PANEL,
)


MaxLengthOption = option(
    int | None,
    "--max-length",
    min=1,
    help="Truncate inputs to this many tokens (default: the model's maximum). Example: --max-length 128",
    panel=INPUT_PANEL,
)

NoTruncateOption = option(
    bool,
    "--no-truncate",
    help="Refuse inputs longer than the maximum length instead of truncating them with a warning. "
    "Example: --no-truncate",
    panel=INPUT_PANEL,
)

TargetOption = option(
    str | None,
    "--target",
    help="Decoder text of an encoder-decoder model, the caption of --image for an image captioner, or the "
    "transcript of --audio for Whisper. "
    'Example: --target "Le chat"',
    panel=INPUT_PANEL,
)


class DeviceMap(str, Enum):
    """Big-model placement: ``auto`` spreads a model over the GPUs and CPU memory (accelerate)."""

    auto = "auto"


DeviceMapOption = choice_option(
    DeviceMap,
    "--device-map",
    "device map",
    help="auto: spread a model too big for one device over the GPUs and CPU memory (accelerate); "
    "means the CPU on machines without CUDA. Overrides --device. Example: --device-map auto",
    panel=MODEL_PANEL,
    show_default=False,
    optional=True,
)

MaxTokensPerBatchOption = option(
    int | None,
    "--max-tokens-per-batch",
    min=1,
    help="Most padded tokens (examples × longest) per forward pass; examples are sorted by length so "
    "little goes to padding (default: no token limit, only --batch-size). Example: --max-tokens-per-batch 4096",
    panel=INPUT_PANEL,
    show_default=False,
)

GENERATION_PANEL = "Generation"

GenerateOption = option(
    int | None,
    "--generate",
    min=1,
    help="Let a causal LM or encoder-decoder model continue TEXT (an image captioner: describe --image) by up "
    "to N tokens (greedy unless --sample) and capture every step's attention, key/value cache included. "
    "Example: --generate 20",
    panel=GENERATION_PANEL,
)

SampleOption = option(
    bool,
    "--sample",
    help="With --generate: draw each token from softmax(logits / temperature) instead of taking the argmax. "
    "Example: --sample --temperature 0.8 --seed 1",
    panel=GENERATION_PANEL,
)

TemperatureOption = option(
    float,
    "--temperature",
    help="With --sample: divides the logits; below 1 is more conservative. Example: --temperature 0.7",
    panel=GENERATION_PANEL,
)

SampleSeedOption = option(
    int | None,
    "--seed",
    help="With --sample: random seed, so the same seed writes the same text. Example: --seed 42",
    panel=GENERATION_PANEL,
)


BatchSizeOption = option(
    int, "--batch-size", "-b", min=1, help="Examples per forward pass. Example: --batch-size 16", panel=INPUT_PANEL
)

ToyExamplesOption = option(
    int,
    "--toy-examples",
    min=1,
    help="Toy checkpoints (without --data): task examples to draw. Example: --toy-examples 256",
    panel=INPUT_PANEL,
)

DataOption = option(
    Path | None,
    "--data",
    "-d",
    help='Text file, one example per line, or JSON Lines with a "text" field (default: the shipped '
    "English corpus; toy checkpoints: their task); '-' reads standard input. Example: --data reviews.jsonl",
    panel=INPUT_PANEL,
)

TextFileOption = option(
    list[Path] | None,
    "--text-file",
    help="A file read whole as one text, every line of it (a long context; --data reads one example per "
    "line); repeatable; '-' reads standard input. Example: --text-file book.txt",
    panel=INPUT_PANEL,
)

TextOption = option(
    list[str] | None,
    "--text",
    "-t",
    help='An example given inline (repeatable). Example: --text "The cat sat on the mat."',
    panel=INPUT_PANEL,
)


# -- tables of per-head results (stats, heads) and their files ------------------------------------------------

LimitOption = option(
    int | None, "--limit", "-n", min=0, help="Show at most this many table rows. Example: --limit 20", panel=VIEW_PANEL
)

AscendingOption = option(
    bool, "--ascending", help="With --sort: smallest first. Example: --sort entropy --ascending", panel=VIEW_PANEL
)

NoTableOption = option(
    bool, "--no-table", help="Skip the per-head table (grid and summary only). Example: --no-table", panel=VIEW_PANEL
)

JsonOption = option(
    Path | None,
    "--json",
    help="Write the results as JSON (fields: docs/file-formats.md). Example: --json results.json",
    panel=OUTPUT_PANEL,
    show_default=False,
)

CsvOption = option(
    Path | None,
    "--csv",
    help="Write one row per head as CSV. Example: --csv results.csv",
    panel=OUTPUT_PANEL,
    show_default=False,
)


def terminal_list_option(listed: str) -> Any:
    """``--terminal`` of a command that ranks ``listed`` (heads, edges): their top ones as a table in the terminal."""
    return option(
        bool, "--terminal", help=f"List the top {listed} in the terminal. Example: --terminal", panel=VIEW_PANEL
    )


#: an attention stack (see :data:`attnviz.core.stacks.STACKS`)
StackChoice = choice_enum("StackChoice", STACKS)


def stack_value(choice: StackChoice | None) -> str | None:
    """The stack name of a ``--stack`` choice (None: all stacks / the first)."""
    return choice.value if choice is not None else None


StackOption = choice_option(
    StackChoice,
    "--stack",
    "stack",
    help="Encoder-decoder models: the stack to show, encoder, decoder or cross (default: all). "
    "Example: --stack decoder",
    panel=VIEW_PANEL,
    show_default=False,
    optional=True,
)


#: the default of ``--max-bytes``: most memory a capture's patterns may take
DEFAULT_MAX_BYTES = "4GB"

MaxBytesOption = option(
    str,
    "--max-bytes",
    help="Refuse, before the model runs, a capture whose attention weights (float32) would take more memory "
    "than this (512MB, 4GB, 1.5GiB, …); --layer and --head record less. Example: --max-bytes 8GB",
    panel=INPUT_PANEL,
)


#: what an attention map holds (see :data:`attnviz.core.choices.WEIGHTINGS`)
WeightingChoice = choice_enum("WeightingChoice", WEIGHTINGS)

WeightingOption = choice_option(
    WeightingChoice,
    "--weighting",
    "weighting",
    help="weights: the softmax weights α_ij; norm: each weight times the norm of the value vector it moves, "
    "α_ij·‖f_h(x_j)‖ (Kobayashi et al. 2020: how much each key changes the head's output). "
    "Example: --weighting norm",
    panel=VIEW_PANEL,
)
