"""The one CLI harness: ``run_cli`` runs ``attnviz`` as a user would from a shell.

By default the entry point runs in-process (fast; pytest's ``capsys`` captures its output). With
``subprocess=True`` it runs ``python -m attnviz`` as a fresh process, for what only a real process
shows: a cold start, stdin, signals (``while_running`` gets the process handle) and torchrun
(``processes=2``).
"""

from __future__ import annotations

import os
import subprocess as subprocesses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: variables that would make a child process believe torchrun launched it
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def error_lines(self) -> list[str]:
        """The ``error:`` lines the command printed on stderr."""
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


def run_cli(
    capsys,
    *args,
    subprocess: bool = False,
    stdin: str | None = None,
    cwd: Path | None = None,
    env: dict[str, str | None] | None = None,
    processes: int = 1,
    while_running: Callable[[subprocesses.Popen], None] | None = None,
    timeout: float = 600,
) -> CliResult:
    """Run ``attnviz *args`` and return its exit code and output.

    In-process (the default) ``capsys`` is pytest's fixture and the other options are refused; with
    ``subprocess=True`` it is not used (``None`` in a fixture wider than one test). With
    ``subprocess=True``: ``stdin`` is written to the process, ``cwd`` is its working directory, ``env``
    is added to its environment (a ``None`` value removes that variable), ``processes > 1`` launches it under
    torchrun (gloo on CPU), and ``while_running(process)`` is called once it started (to send it a signal, say) before its output is read.
    """
    if not subprocess:
        if stdin is not None or cwd is not None or env is not None or processes != 1 or while_running is not None:
            raise TypeError("stdin, cwd, env, processes and while_running need subprocess=True")
        return _run_in_process(capsys, [str(arg) for arg in args])
    return _run_in_subprocess([str(arg) for arg in args], stdin, cwd, env or {}, processes, while_running, timeout)


def _run_in_process(capsys, args: list[str]) -> CliResult:
    from attnviz.cli.app import main

    capsys.readouterr()
    old_argv = sys.argv
    sys.argv = ["attnviz", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = old_argv
    out = capsys.readouterr()
    return CliResult(code, out.out, out.err)


def _run_in_subprocess(
    args: list[str],
    stdin: str | None,
    cwd: Path | None,
    env: dict[str, str | None],
    processes: int,
    while_running: Callable[[subprocesses.Popen], None] | None,
    timeout: float,
) -> CliResult:
    import attnviz

    environment = {name: value for name, value in os.environ.items() if name not in TORCHRUN_VARIABLES}
    # the child imports the same attnviz as this test session (a worktree's, not the editable install's)
    source_root = str(Path(attnviz.__file__).resolve().parents[1])
    environment.update(PYTHONPATH=os.pathsep.join([source_root, *sys.path]), HF_HUB_OFFLINE="1")
    for name, value in env.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    process = subprocesses.Popen(
        [*launcher, "-m", "attnviz", *args],
        cwd=cwd,
        env=environment,
        stdin=subprocesses.PIPE if stdin is not None else subprocesses.DEVNULL,
        stdout=subprocesses.PIPE,
        stderr=subprocesses.PIPE,
        text=True,
    )
    try:
        if while_running is not None:
            while_running(process)
        stdout, stderr = process.communicate(stdin, timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return CliResult(process.returncode, stdout, stderr)


def assert_clean_error(result: CliResult, *fragments: str) -> None:
    """Non-zero exit, no traceback, and the message contains ``fragments``."""
    assert result.exit_code != 0, result
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    message = " ".join(result.stderr.split())
    for fragment in fragments:
        assert fragment.lower() in message.lower(), message
