"""Option groups: options that several commands take together, declared once and received as one value.

Typer has no parameter groups. A group is a dataclass whose fields are Typer options (``Annotated`` aliases of
:mod:`attnviz.cli.options` with their defaults); a command declares it as one parameter whose default is the group's
:class:`OptionGroup` (``running: RunOptions = RUN_OPTIONS``). :func:`expand_option_groups` shows Typer the group's
options in its place (same order, same help panels) and hands the command the dataclass built from them.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints

from attnviz.cli.options import (
    DEFAULT_MAX_BYTES,
    INPUT_PANEL,
    BatchSizeOption,
    DataOption,
    DeviceMapOption,
    DeviceOption,
    DtypeOption,
    GenerateOption,
    MaxBytesOption,
    MaxLengthOption,
    NoTruncateOption,
    SampleOption,
    SampleSeedOption,
    TemperatureOption,
    TextOption,
    option,
)

Command = TypeVar("Command", bound=Callable[..., Any])


class OptionGroup:
    """The default of a command parameter that stands for the options of ``group`` (a dataclass whose fields are
    Typer options; ``defaults``: this command's defaults where they differ from the fields'); the command receives
    ``group(**those options)``."""

    def __init__(self, group: type, **defaults: Any):
        self.build = group
        annotations = get_type_hints(group, include_extras=True)
        self.parameters = [
            inspect.Parameter(
                field.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=defaults.get(field.name, field.default),
                annotation=annotations[field.name],
            )
            for field in dataclasses.fields(group)
        ]


def expand_option_groups(command: Command) -> Command:
    """``command`` as Typer should see it: each parameter whose default is an :class:`OptionGroup` replaced by the
    group's options (keyword-only, in place, so ``--help`` lists them where the group stands)."""
    signature = inspect.signature(command, eval_str=True)
    groups = {name: p.default for name, p in signature.parameters.items() if isinstance(p.default, OptionGroup)}
    parameters = []
    for parameter in signature.parameters.values():
        group = groups.get(parameter.name)
        parameters.extend(group.parameters if group is not None else [parameter])

    @functools.wraps(command)
    def run(**values: Any) -> Any:
        for name, group in groups.items():
            values[name] = group.build(**{option.name: values.pop(option.name) for option in group.parameters})
        return command(**values)

    expanded = [parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY) for parameter in parameters]
    run.__signature__ = signature.replace(parameters=expanded)
    run.__annotations__ = {parameter.name: parameter.annotation for parameter in expanded}
    return run  # type: ignore[return-value]


@dataclass(frozen=True)
class RunOptions:
    """How a command runs its model on a text."""

    max_length: MaxLengthOption = None
    max_bytes: MaxBytesOption = DEFAULT_MAX_BYTES
    no_truncate: NoTruncateOption = False
    device: DeviceOption = "auto"
    dtype: DtypeOption = "auto"


@dataclass(frozen=True)
class GenerationOptions:
    """Whether and how the model continues its input (``--generate``)."""

    generate: GenerateOption = None
    sample: SampleOption = False
    temperature: TemperatureOption = 1.0
    seed: SampleSeedOption = None

    def settings(self, target: str | None) -> dict | None:
        """Keyword arguments of ``attnviz.generate``, or None without ``--generate`` (refusing options that
        contradict each other or ``--target``)."""
        from attnviz.common.errors import InputError

        generate, sample, temperature, seed = self.generate, self.sample, self.temperature, self.seed
        if generate is None:
            if sample or seed is not None or temperature != 1.0:
                raise InputError("--sample, --temperature and --seed apply only with --generate N")
            return None
        if target is not None:
            raise InputError("give either --target (a fixed decoder text) or --generate N, not both")
        if not sample and (seed is not None or temperature != 1.0):
            raise InputError("--temperature and --seed apply only with --sample (greedy decoding has no randomness)")
        from attnviz.captures.generation import check_generation_settings

        check_generation_settings(generate, sample, temperature)  # before the model loads
        return {"max_new_tokens": generate, "sample": sample, "temperature": temperature, "seed": seed}


@dataclass(frozen=True)
class BatchOptions:
    """How a command runs its model over batches of examples."""

    batch_size: BatchSizeOption = 16
    max_length: MaxLengthOption = None
    device: DeviceOption = "auto"
    dtype: DtypeOption = "auto"

    def batching(self) -> dict[str, Any]:
        """``batch_size=…, max_length=…`` as the library's calls take them."""
        return {"batch_size": self.batch_size, "max_length": self.max_length}


@dataclass(frozen=True)
class ModelDevice:
    """Where and in which precision a command loads its model."""

    device: DeviceOption = "auto"
    dtype: DtypeOption = "auto"

    def loading(self) -> dict[str, Any]:
        """``device=…, dtype=…`` as the library's loading calls take them."""
        return {"device": self.device, "dtype": self.dtype}


@dataclass(frozen=True)
class ModelPlacement(ModelDevice):
    """:class:`ModelDevice`, and a big model spread over devices (``--device-map``)."""

    device_map: DeviceMapOption = None

    def loading(self) -> dict[str, Any]:
        """``device=…, dtype=…, device_map=…`` as the library's loading calls take them."""
        return {**super().loading(), "device_map": self.device_map.value if self.device_map else None}

    def session(self) -> Any:
        """The command's processes (one, or torchrun's): :func:`attnviz.cli.distributed.cli_session`."""
        from attnviz.cli.distributed import cli_session

        return cli_session(self.device, self.device_map)


@dataclass(frozen=True)
class TextInputs:
    """The examples a command reads: ``--data`` (a file of examples) and ``--text`` (examples given inline)."""

    data: DataOption = None
    text: TextOption = None

    def texts(self, text_files: list | None = None) -> list[str] | None:
        """The examples of both (and of ``--text-file``), None without any (see ``corpus_from_options``)."""
        from attnviz.cli.stdin import corpus_from_options

        return corpus_from_options(self.data, self.text, text_files)


def _prompt(flag: str, help_text: str) -> Any:
    return option(str, flag, help=help_text, panel=INPUT_PANEL, show_default=False)


@dataclass(frozen=True)
class PromptPair:
    """One prompt pair of causal analysis (``patch``, ``circuit``): the prompt, its corrupted twin, the right and the
    wrong next token."""

    clean: _prompt(
        "--clean",
        'The prompt the model answers correctly. Example: --clean "When Mary and John went to the store, John '
        'gave a drink to"',
    ) = ""
    corrupt: _prompt(
        "--corrupt",
        "The same prompt changed where it matters, with as many tokens. Example: --corrupt "
        '"When Mary and John went to the store, Mary gave a drink to"',
    ) = ""
    answer: _prompt("--answer", 'The right next token (one token). Example: --answer " Mary"') = ""
    wrong: _prompt("--wrong", 'The wrong next token it competes with (one token). Example: --wrong " John"') = ""

    def flags(self) -> tuple[tuple[str, str], ...]:
        """``(flag, value)`` of each of the four options, in order."""
        return (
            ("--clean", self.clean),
            ("--corrupt", self.corrupt),
            ("--answer", self.answer),
            ("--wrong", self.wrong),
        )

    def missing(self) -> str | None:
        """The first flag left out (or blank), None when all four are given."""
        return next((flag for flag, value in self.flags() if not value.strip()), None)

    def arguments(self) -> dict[str, Any]:
        """``clean=…, corrupt=…, answer=…, wrong=…`` as the library's calls take them."""
        return dataclasses.asdict(self)


#: the group defaults commands declare (typed Any: the command receives the group's dataclass, not the marker)
RUN_OPTIONS: Any = OptionGroup(RunOptions)
GENERATION_OPTIONS: Any = OptionGroup(GenerationOptions)
PROMPT_PAIR: Any = OptionGroup(PromptPair)
BATCH_OPTIONS: Any = OptionGroup(BatchOptions)
TEXT_INPUTS: Any = OptionGroup(TextInputs)
PLACEMENT: Any = OptionGroup(ModelPlacement)
MODEL_DEVICE: Any = OptionGroup(ModelDevice)
