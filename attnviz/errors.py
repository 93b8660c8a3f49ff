"""Typed exceptions. Every message tells the user what to do next.

The CLI turns any :class:`AttnvizError` into one line on stderr and a non-zero
exit code; library users can catch the specific subclasses.
"""

from __future__ import annotations


class AttnvizError(Exception):
    """Base class of every error attnviz raises on purpose (bad input, missing model, ...)."""

    exit_code: int = 2


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


class Interrupted(BaseException):
    """A signal (SIGINT, SIGTERM, SIGHUP) stopped the run; outputs were rolled back.

    A ``BaseException`` like :class:`KeyboardInterrupt`, so ``except Exception`` in the
    library never swallows it and every ``finally`` still removes its temporaries.
    """

    def __init__(self, signum: int):
        import signal

        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}: unfinished outputs were discarded")
