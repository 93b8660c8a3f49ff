"""What every ``attnviz`` command gets without asking: checked arguments, protected inputs,
all-or-nothing outputs, signals handled like Ctrl-C, and one ``error:`` line for every failure.

:func:`guard_commands` wraps each registered command: before the command body runs it
refuses NaN/infinite numbers and text that is not valid UTF-8, records the paths the
command reads (Path arguments outside the "Output" help panel, and the files behind model
specs) and refuses outputs (Path options in the "Output" panel) that are, lie inside or
contain one of them; the body then runs inside :func:`attnviz.outputs.files.output_session`, so all its
outputs are renamed into place together at its end, or none. :func:`run` is the entry point.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import math
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from attnviz.common.errors import OutputError

# typer ≥ 0.26 vendors Click: the exceptions and contexts its commands use live in typer._click.
from typer._click import exceptions as click_errors
from typer._click.globals import get_current_context
from typer._click.utils import echo

from attnviz.cli.options import OUTPUT_PANEL

#: parameters whose string value is a model spec (its files are inputs)
MODEL_PARAMETERS = ("model", "models", "checkpoint", "checkpoints")
#: parameters whose string value names a file the command reads (a string, for '-': standard input)
FILE_PARAMETERS = ("image", "audio")
#: whole numbers beyond this overflow torch (seeds, sizes); nothing sensible needs more
_LARGEST_INT = 2**62
#: errno values of a write to standard output that failed for the stream's sake (full, closed, gone)
_STREAM_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EPIPE, errno.EIO, errno.EBADF, errno.EFBIG, errno.ECONNRESET}
#: signals handled like Ctrl-C: temporaries removed, exit 128 + signal number (SIGQUIT too: no core dump)
HANDLED_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, name)
)


def guard_commands(app: typer.Typer) -> None:
    """Wrap the callback of every command registered on ``app`` (call once, after registering)."""
    for info in app.registered_commands:
        if info.callback is not None and not getattr(info.callback, "_attnviz_guarded", False):
            info.callback = guarded(info.callback)


def guarded(callback: Callable) -> Callable:
    """``callback`` with its arguments checked and its outputs written all or nothing (see the module docstring)."""

    @functools.wraps(callback)
    def run_command(*args: Any, **kwargs: Any) -> Any:
        from attnviz.common.errors import InputError
        from attnviz.outputs import files

        parameters = _parameters()
        _check_values(kwargs, parameters)
        _check_model_specs(kwargs)
        try:
            with files.output_session():
                _refuse_directory_syntax(parameters)
                inputs, outputs = _paths(kwargs, parameters)
                for path, what in inputs:
                    files.protect_inputs([path], what)
                files.check_outputs(outputs)
                result = callback(*args, **kwargs)
                sys.stdout.flush()  # a full or closed stdout fails here, before the file outputs are committed
                return result
        except OSError as exc:
            error = standard_output_error(exc)
            if error is None:
                raise
            raise error from None
        except (MemoryError, RuntimeError) as exc:
            from attnviz.common.resources import is_out_of_memory

            if not is_out_of_memory(exc):
                raise
            raise InputError(_out_of_memory_message(kwargs, parameters)) from None

    run_command._attnviz_guarded = True
    return run_command


def _parameters() -> dict[str, Any]:
    context = get_current_context(silent=True)
    return {p.name: p for p in context.command.params if p.name} if context is not None else {}


def _flag(name: str, parameters: dict[str, Any]) -> str:
    parameter = parameters.get(name)
    options = [opt for opt in getattr(parameter, "opts", ()) if opt.startswith("-")]
    if options:
        return max(options, key=len)
    return name.upper()


def _values(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _check_values(kwargs: dict[str, Any], parameters: dict[str, Any]) -> None:
    """Refuse NaN/infinite numbers and undecodable text (argv bytes that were not UTF-8)."""
    from attnviz.common.encoding import check_utf8
    from attnviz.common.errors import InputError

    for name, value in kwargs.items():
        for item in _values(value):
            if isinstance(item, float) and not math.isfinite(item):
                raise InputError(f"{_flag(name, parameters)} must be a finite number, got {item}")
            if isinstance(item, int) and not isinstance(item, bool) and abs(item) > _LARGEST_INT:
                raise InputError(f"{_flag(name, parameters)} is too large: give a number below {_LARGEST_INT:,}")
            if isinstance(item, str):  # Path arguments may hold any bytes the file system allows
                check_utf8(item, _flag(name, parameters))


def _check_model_specs(kwargs: dict[str, Any]) -> None:
    """Refuse a model spec that names nothing here (a typo) before anything slow is imported or loaded."""
    from attnviz.models.lookup import check_model_spec

    for name in MODEL_PARAMETERS:
        for item in _values(kwargs.get(name)):
            if isinstance(item, str):
                check_model_spec(item)


def _raw_values(parameter: Any) -> list[str]:
    """The values given for ``parameter`` as typed (``Path`` drops a trailing slash; the command line keeps it)."""
    options = [opt for opt in getattr(parameter, "opts", ()) if opt.startswith("-")]
    args = sys.argv[1:]
    values = []
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg in options and index + 1 < len(args):
            values.append(args[index + 1])
        values.extend(arg.split("=", 1)[1] for option in options if arg.startswith(option + "="))
    return values


def _refuse_directory_syntax(parameters: dict[str, Any]) -> None:
    """Refuse a file output given with a trailing slash: like POSIX tools, attnviz reads it as a directory."""
    from attnviz.cli.options import DIRECTORY_METAVAR
    from attnviz.common.errors import OutputError

    for parameter in parameters.values():
        if getattr(parameter, "rich_help_panel", None) != OUTPUT_PANEL or parameter.metavar == DIRECTORY_METAVAR:
            continue
        for value in _raw_values(parameter):
            if value.endswith(("/", os.sep)) and value != "-":
                raise OutputError(
                    f"{_flag(parameter.name, parameters)} {value} ends with a slash, so it names a directory, but "
                    "this output is a file: give a file name"
                )


def standard_output_error(exc: OSError) -> OutputError | None:
    """The :class:`OutputError` for a failed write to standard output (full device, closed pipe), or None when
    ``exc`` is another failure; standard output is then silenced, so Python's flush at exit fails no more."""
    from attnviz.common.errors import OutputError

    if exc.filename is not None or exc.errno not in _STREAM_ERRORS:
        return None
    try:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (Python flushes stdout at exit)
    except OSError:
        pass
    if isinstance(exc, BrokenPipeError):  # attnviz … | head -0: say so once, not at every flush
        return OutputError("standard output was closed before the run finished: nothing was written")
    return OutputError(f"cannot write standard output ({exc.strerror or exc}): nothing was written")


def _out_of_memory_message(kwargs: dict[str, Any], parameters: dict[str, Any]) -> str:
    """Name the size-like option given on the command line that most likely exhausted memory.

    The library refuses the sizes it can estimate before allocating (:mod:`attnviz.common.resources`);
    this is the last resort for the rest: the whole-number option given with the largest value
    compared with its default is the one to lower.
    """
    from typer._click.core import ParameterSource

    context = get_current_context(silent=True)
    given = []
    for name, value in kwargs.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or "seed" in name:
            continue
        if context is not None and context.get_parameter_source(name) != ParameterSource.COMMANDLINE:
            continue
        default = getattr(parameters.get(name), "default", None)
        scale = default if isinstance(default, int) and not isinstance(default, bool) and default > 0 else 1
        given.append((value / scale, _flag(name, parameters), value))
    if not given:
        return "out of memory: the input is too large for the memory available; give a shorter input"
    _, flag, value = max(given)
    return f"out of memory with {flag} {value}: give a smaller {flag}"


def _paths(kwargs: dict[str, Any], parameters: dict[str, Any]) -> tuple[list[tuple[Path, str]], list[Path]]:
    """([(path the command reads, what it is)], [paths it writes]), from its arguments."""
    from attnviz.models.specs import model_input_paths

    inputs: list[tuple[Path, str]] = []
    outputs: list[Path] = []
    for name, value in kwargs.items():
        is_output = getattr(parameters.get(name), "rich_help_panel", None) == OUTPUT_PANEL
        for item in _values(value):
            if isinstance(item, Path):
                if is_output:
                    outputs.append(item)
                else:
                    inputs.append((item, _flag(name, parameters)))
            elif isinstance(item, str) and name in MODEL_PARAMETERS:
                inputs.extend((path, "model") for path in model_input_paths(item))
            elif isinstance(item, str) and name in FILE_PARAMETERS and item != "-":
                inputs.append((Path(item), _flag(name, parameters)))
    return inputs, outputs


# -- the entry point -----------------------------------------------------------------------------------


def run(app: typer.Typer, debug: Callable[[], bool]) -> int:
    """Run the command line in ``sys.argv``; return the exit code. Every failure prints one ``error:`` line."""
    from attnviz.cli.errors import error_message
    from attnviz.common.errors import AttnvizError, Interrupted

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from attnviz.cli.console import take_warnings

    take_warnings()  # none left from an earlier run in this process
    if sys.stdout is None:  # started with stdout closed (attnviz … >&-): writing to it fails like a closed pipe
        sys.stdout = _ClosedStream()
    with _signals_raise():
        try:
            command = typer.main.get_command(app)
            result = command.main(args=sys.argv[1:], prog_name="attnviz", standalone_mode=False)
            sys.stdout.flush()  # --help, --version: their text is written outside any command
            _flush_warnings()
            return result if isinstance(result, int) else 0
        except click_errors.NoArgsIsHelpError as exc:
            echo(exc.ctx.get_help() if exc.ctx else str(exc))
            path = exc.ctx.command_path if exc.ctx else "attnviz"
            return error_line(f"{path} needs arguments: see the help above", 2)
        except click_errors.UsageError as exc:
            hint = f" (see: {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
            return error_line(exc.format_message() + hint, 2)
        except click_errors.ClickException as exc:
            return error_line(exc.format_message(), exc.exit_code or 1)
        except typer.Abort:
            return error_line("aborted", 1)
        except AttnvizError as exc:
            return error_line(error_message(exc), exc.exit_code)
        except Interrupted as exc:
            return error_line(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            return error_line("interrupted by SIGINT: unfinished outputs were discarded", 128 + signal.SIGINT)
        except OSError as exc:
            error = standard_output_error(exc)
            if error is None:
                return _internal_error(exc, debug)
            return error_line(str(error), error.exit_code)
        except MemoryError:  # outside a command (while parsing): no option to blame
            return error_line("out of memory: the input is too large for the memory available", 1)
        except Exception as exc:  # noqa: BLE001 (the last resort: one line instead of a traceback)
            return _internal_error(exc, debug)


class _ClosedStream(io.StringIO):
    """Standard output when the process was started without one: every write fails with EBADF."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


def _flush_warnings() -> None:
    from attnviz.cli.console import flush_warnings

    flush_warnings()


def _internal_error(exc: BaseException, debug: Callable[[], bool]) -> int:
    """The last resort: one line (the traceback with --debug)."""
    if debug():
        traceback.print_exc()
    lines = [line for line in str(exc).splitlines() if line.strip()]
    detail = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return error_line(f"unexpected internal error ({detail}); rerun with --debug to see the traceback", 1)


def error_line(message: str, code: int) -> int:
    """Print ``error: MESSAGE`` as exactly one line on stderr; return ``code``."""
    from rich.text import Text

    from attnviz.cli.console import console, take_warnings

    if os.environ.get("RANK", "0") != "0":  # under torchrun every rank meets the same error: rank 0 says it
        return code
    warnings = take_warnings()
    if warnings:  # what went wrong first belongs to the one line, not to lines of its own before it
        message = f"{message} (after: {'; '.join(warnings)})"
    from attnviz.common.errors import tidy_message

    text = Text("error: ", style="bold red") + Text(" ".join(tidy_message(message).split()))
    console.print(text, soft_wrap=True, highlight=False)
    return code


#: seconds a signalled run may take to unwind before it removes its temporaries and exits regardless
UNWIND_SECONDS = 20.0


def _exit_later(signum: int) -> None:
    """Last resort: if the raised Interrupted is swallowed or the unwinding hangs, still clean up and exit."""
    import threading

    from attnviz.outputs import staging

    def watchdog() -> None:
        staging.remove_live_temporaries()
        os._exit(128 + signum)

    timer = threading.Timer(UNWIND_SECONDS, watchdog)
    timer.daemon = True
    timer.start()
    _watchdogs.append(timer)


_watchdogs: list = []


def _ignore_signal(signum, frame) -> None:
    """A signal that arrives while an interrupted run exits: it is stopping already."""


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT, SIGTERM, SIGHUP and SIGQUIT raise :class:`~attnviz.common.errors.Interrupted`, so ``finally`` blocks
    clean up. Only the first signal raises: a second one (Ctrl-C pressed again) while the run unwinds would
    interrupt the clean-up itself, so it is ignored; the watchdog still bounds how long unwinding takes."""
    from attnviz.common.errors import Interrupted

    received: list[int] = []

    def interrupt(signum, frame):
        if received:
            return  # already unwinding: let the clean-up finish
        received.append(signum)
        _exit_later(signum)
        raise Interrupted(signum)

    try:
        previous = {number: signal.signal(number, interrupt) for number in HANDLED_SIGNALS}
    except ValueError:  # not the main thread: leave signals alone
        previous = {}
    try:
        yield
    finally:
        for number, handler in previous.items():
            # after a signal, more of them (Ctrl-C pressed again) must not print a traceback on the way out
            signal.signal(number, _ignore_signal if received else handler)
        while _watchdogs:  # unwound in time: no forced exit
            _watchdogs.pop().cancel()
