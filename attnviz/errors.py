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


class DistributedError(AttnvizError):
    """A distributed (torchrun) run that cannot start or whose processes disagree."""
