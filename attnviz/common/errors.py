"""Typed exceptions. Every message tells the user what to do next.

The CLI turns any :class:`AttnvizError` into one line on stderr and a non-zero
exit code; library users can catch the specific subclasses.
"""

from __future__ import annotations

import re


class AttnvizError(Exception):
    """Base class of every error attnviz raises on purpose (bad input, missing model, ...)."""

    exit_code: int = 2

    def __init__(self, *args: object) -> None:
        if args and isinstance(args[0], str):  # a message built around an empty reason reads whole
            args = (tidy_message(args[0]), *args[1:])
        super().__init__(*args)


#: what a reason left empty leaves behind: "…: " at the end, "()" or "( )", ": ;" before the next clause
_EMPTY_REASON = re.compile(r"\s*\(\s*\)|:\s*(?=;|$)")


def tidy_message(message: str) -> str:
    """``message`` without the separators an empty reason leaves: ``cannot read this image: `` reads
    ``cannot read this image``, ``damaged ()`` reads ``damaged``."""
    return _EMPTY_REASON.sub("", message.rstrip())


def reason(exc: BaseException) -> str:
    """Why ``exc`` happened, in words: its message's first line, or (for an exception that carries no
    message, such as a bare ``MemoryError``) what its kind means."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if lines:
        return lines[0]
    if isinstance(exc, MemoryError):
        return "out of memory"
    return re.sub(r"(?<=[a-z])(?=[A-Z])", " ", type(exc).__name__).lower()  # KeyError -> "key error"


class ModelSpecError(AttnvizError):
    """The model spec names nothing attnviz can load."""


class UnsupportedModelError(AttnvizError):
    """The model loaded, but attnviz cannot do what was asked with it."""


class InputError(AttnvizError):
    """Text, data file or option value that cannot be used."""


class OutputError(AttnvizError):
    """An output path that cannot be written."""


class CaptureFileError(AttnvizError):
    """A saved capture file that is missing, corrupted or of another format."""


#: a ``{parameter_name}`` placeholder in a :class:`ParameterError` template
_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


class ParameterError(InputError):
    """A value given for one of a library function's parameters that cannot be used.

    The message is a template whose ``{placeholders}`` are parameter names, so each caller can
    name them in its own terms: ``str(exc)`` says ``batch_size``, the command line says
    ``--batch-size`` (see :func:`attnviz.cli.errors.error_line`). ``parameter`` is the one at fault.
    """

    def __init__(self, parameter: str, template: str, value: object = None) -> None:
        self.parameter = parameter  # the library's name of the parameter, e.g. "batch_size"
        self.template = template  # e.g. "{batch_size} must be at least 1, got 0"
        self.value = value
        super().__init__(self.formatted())

    def formatted(self, namer=lambda parameter: parameter) -> str:
        """The message, with each parameter named by ``namer`` (the bare name by default)."""
        return tidy_message(_PLACEHOLDER.sub(lambda match: namer(match.group(1)), self.template))


class OutputParameterError(ParameterError, OutputError):
    """An output location given for a parameter that cannot be written."""


class Interrupted(BaseException):
    """A signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) stopped the run; outputs were rolled back.

    A ``BaseException`` like :class:`KeyboardInterrupt`, so ``except Exception`` in the
    library never swallows it and every ``finally`` still removes its temporaries.
    """

    def __init__(self, signum: int):
        import signal

        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}: unfinished outputs were discarded")


class DistributedError(AttnvizError):
    """A distributed (torchrun) run that cannot start or whose processes disagree."""
