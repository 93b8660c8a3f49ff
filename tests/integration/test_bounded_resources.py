"""Bounded resources, streams, signals and clearing: what ``docs/reliability.md`` promises beyond bad input.

Size options run under an address-space cap (``RLIMIT_AS``, 4 GB) in a real process: each finishes or
stops with one ``error:`` line naming its option, never a crash, a traceback or an exhausted machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_cli

import attnviz

CAP_BYTES = 4 * 2**30
#: run ``attnviz`` with its address space capped: a runaway allocation fails fast instead of taking the machine
CAPPED = (
    "import resource, runpy, sys\n"
    f"resource.setrlimit(resource.RLIMIT_AS, ({CAP_BYTES}, {CAP_BYTES}))\n"
    "sys.argv = ['attnviz', *sys.argv[1:]]\n"
    "runpy.run_module('attnviz', run_name='__main__')\n"
)


def run_capped(args: list[str], cwd: Path, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "ATTNVIZ_CACHE": str(cwd / "cache")}
    environment["PYTHONPATH"] = str(Path(attnviz.__file__).resolve().parents[1])
    return subprocess.run(
        [sys.executable, "-c", CAPPED, *args],
        check=False,
        cwd=cwd,
        env=environment,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["stats", "toy-copy", "--toy-examples", "8", "-w", "1000000000", "--no-table"], None),
        (["stats", "toy-copy", "--toy-examples", "1000000000"], "--toy-examples"),
        (["heads", "toy-copy", "--sequences", "1000000000"], "--sequences"),
        (["train", "copy", "--width", "1000000000", "--heads", "1", "--steps", "1", "--out", "t"], "--width"),
        (["train", "copy", "--batch-size", "1000000000", "--steps", "1", "--out", "t"], "--batch-size"),
    ],
    ids=["local-window", "toy-examples", "sequences", "toy-width", "train-batch"],
)
def test_sizes_finish_or_name_their_option_under_a_memory_cap(tmp_path, args, flag):
    result = run_capped(args, tmp_path)
    assert "Traceback" not in result.stderr and "unexpected internal error" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    if flag is None:
        assert result.returncode == 0 and errors == [], result.stderr
    else:
        assert result.returncode == 2 and len(errors) == 1 and flag in errors[0], result.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name != "cache"] == []


def test_a_window_wider_than_the_sequence_is_the_whole_sequence(capsys, tmp_path):
    """-w 10⁹ gives the statistics of a window covering every key (-w 17 on 18-token examples)."""
    import json

    for window in ("17", "1000000000"):
        args = ["stats", "toy-copy", "--toy-examples", "8", "-w", window, "--json", tmp_path / f"w{window}.json"]
        assert run_cli(capsys, *args, "--no-table").exit_code == 0
    wide, whole = (json.loads((tmp_path / f"w{w}.json").read_text()) for w in ("1000000000", "17"))
    assert wide["heads"] == whole["heads"] and wide["local_window"] == 1000000000


def test_a_full_or_closed_stdout_is_one_error_line(tmp_path):
    with open("/dev/full", "w") as full:
        result = run_capped(["stats", "toy-copy", "--toy-examples", "4", "--no-table", "--json", "-"], tmp_path, full)
    assert result.returncode == 2, result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: cannot write standard output (No space left on device): nothing was written"
    ]
    with open("/dev/full", "w") as full:
        result = run_capped(["--version"], tmp_path, full)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "error: cannot write" in result.stderr


def test_clearing_the_cache_leaves_each_entry_whole_or_gone(tmp_path, monkeypatch):
    from attnviz.common.errors import OutputError
    from attnviz.models.inventory import clear_conversion_cache

    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path))
    for name in ("a", "b"):
        (tmp_path / "gguf" / name / "deep").mkdir(parents=True)
        (tmp_path / "gguf" / name / "deep" / "weights").write_text(name * 10)
    real_replace = os.replace

    def replace_fails_on_b(source, target):
        if Path(source).name == "b":
            raise OSError(13, "Permission denied")
        return real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace_fails_on_b)
    with pytest.raises(OutputError, match="could not remove"):
        clear_conversion_cache()
    # a is gone, b is whole, nothing half-deleted or set aside is left
    assert sorted(p.name for p in (tmp_path / "gguf").iterdir()) == ["b"]
    assert (tmp_path / "gguf" / "b" / "deep" / "weights").read_text() == "b" * 10
    monkeypatch.setattr(os, "replace", real_replace)
    assert clear_conversion_cache() == (1, 10)
    assert not (tmp_path / "gguf").exists()


def test_ctrl_c_again_during_clean_up_prints_no_traceback(tmp_path):
    import time

    from attnviz.outputs import staging

    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(attnviz.__file__).resolve().parents[1])}
    args = [
        "train",
        "copy",
        "--out",
        "run",
        "--steps",
        "1000000",
        "--checkpoint-every",
        "2",
        "--width",
        "16",
        "--heads",
        "2",
        "--layers",
        "1",
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "attnviz", *args], cwd=tmp_path, env=environment, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        staged = [p for p in tmp_path.iterdir() if p.name.startswith(staging.TEMP_PREFIX)]
        if staged and any((staged[0] / "steps").glob("step-*")):
            break
        time.sleep(0.2)
    for signum in (signal.SIGINT, signal.SIGINT, signal.SIGQUIT, signal.SIGINT):
        process.send_signal(signum)
        time.sleep(0.005)
    _, stderr = process.communicate(timeout=120)
    # a signal that lands after the clean-up, as the process exits, may end it by that signal itself
    assert process.returncode in (128 + signal.SIGINT, -signal.SIGINT, -signal.SIGQUIT), stderr
    assert "Traceback" not in stderr
    assert [line for line in stderr.splitlines() if line.startswith("error:")] == [
        "error: interrupted by SIGINT: unfinished outputs were discarded"
    ]
    assert list(tmp_path.iterdir()) == []
