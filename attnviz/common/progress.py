"""How the library tells its caller about progress and notices, without printing.

Library code never prints. Where a long loop runs or something deserves a notice (an input was
truncated, a family falls back to eager attention), it calls :func:`warn`, :func:`status` or
:func:`progress_bar` here, and these hand the message to the *current reporter*:

* by default, :class:`Reporter`: warnings become Python warnings (:class:`AttnvizWarning`, so a
  script can filter or escalate them); information lines (:func:`info`: which model was loaded
  from where), status messages and progress bars are silent;
* the command line installs its rich reporter (:mod:`attnviz.cli.console`) for the whole run with
  :func:`use_reporter`; a script can install its own the same way.

The reporter lives in a :class:`contextvars.ContextVar`, so threads and async tasks each see the
one their caller installed.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager as ContextManager

from rich.progress import Progress


class AttnvizWarning(UserWarning):
    """A notice from attnviz's library: the result is usable, but not exactly what was asked for."""


class AttnvizNotice(AttnvizWarning):
    """Information worth seeing once (a one-time build that takes a while): nothing is wrong."""


class Reporter:
    """The silent reporter: warnings and notices go to :mod:`warnings`, status lines and progress bars nowhere."""

    def warning(self, message: str) -> None:
        warnings.warn(message, AttnvizWarning, stacklevel=3)

    def notice(self, message: str) -> None:
        warnings.warn(message, AttnvizNotice, stacklevel=3)

    def info(self, message: str) -> None:
        """A line of plain information (which model was loaded from where); the silent reporter drops it."""

    def status(self, message: str) -> ContextManager[object]:
        return contextlib.nullcontext()

    def progress(self) -> Progress:
        """A rich ``Progress`` to drive with ``add_task``/``update`` (this one draws nothing)."""
        return Progress(disable=True)


_SILENT = Reporter()
_CURRENT: contextvars.ContextVar[Reporter | None] = contextvars.ContextVar("attnviz_reporter", default=None)


def current_reporter() -> Reporter:
    return _CURRENT.get() or _SILENT


@contextlib.contextmanager
def use_reporter(reporter: Reporter) -> Iterator[Reporter]:
    """Send the library's progress and notices to ``reporter`` inside the ``with`` block."""
    token = _CURRENT.set(reporter)
    try:
        yield reporter
    finally:
        _CURRENT.reset(token)


def warn(message: str) -> None:
    """A one-line notice to the current reporter."""
    current_reporter().warning(message)


def notice(message: str) -> None:
    """A one-line notice that nothing is wrong but the caller should know (e.g. a minute-long build starts)."""
    current_reporter().notice(message)


def info(message: str) -> None:
    """A line of plain information for whoever watches the run (silent in a script: see :func:`notice`)."""
    current_reporter().info(message)


def status(message: str) -> ContextManager[object]:
    """A status line shown while the ``with`` block runs (e.g. a conversion that takes seconds)."""
    return current_reporter().status(message)


def progress_bar() -> Progress:
    """A progress bar of the current reporter, used as ``with progress_bar() as bar: bar.add_task(...)``."""
    return current_reporter().progress()


@contextlib.contextmanager
def quiet_third_party() -> Iterator[None]:
    """Inside the ``with`` block: transformers' and huggingface_hub's progress bars ("Loading weights", "Writing
    model shards") and info logs off, and tqdm's "IProgress not found" warning (a kernel without ipywidgets)
    filtered, so a caller sees attnviz's own progress only. Everything is as it was after the block: a
    caller's own bars, verbosity and warning filters are left alone.
    """
    with warnings.catch_warnings():
        # tqdm warns once, while transformers first imports it: that import may be this one
        warnings.filterwarnings("ignore", message=r"IProgress not found")
        from transformers.utils import logging as transformers_logging

        hub_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")  # the module (the package exports a class)
        bars_were_on = transformers_logging.is_progress_bar_enabled()
        hub_states = dict(getattr(hub_tqdm, "progress_bar_states", {}))  # huggingface_hub's per-group switches
        verbosity = transformers_logging.get_verbosity()
        transformers_logging.disable_progress_bar()
        transformers_logging.set_verbosity_error()
        try:
            yield
        finally:
            transformers_logging.set_verbosity(verbosity)
            if bars_were_on:
                transformers_logging.enable_progress_bar()
            states = getattr(hub_tqdm, "progress_bar_states", None)
            if states is not None:
                states.clear()
                states.update(hub_states)
