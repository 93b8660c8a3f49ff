"""The fused kernel's build as users meet it: said once when it fails, remembered per machine, no stale lock waits.

Each test gives the processes an extension cache of their own (``TORCH_EXTENSIONS_DIR``) where the
kernel's state is known, and runs real ``attnviz`` processes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli

from attnviz.core import kernel
from attnviz.core.kernel_build import OWNER_FILE, STALE_AFTER_SECONDS, clear_stale_lock

UNAVAILABLE = "fused attention kernel is unavailable"


def test_without_a_compiler_the_first_run_says_why_once_and_the_next_does_not_try(tmp_path):
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"), "CXX": str(tmp_path / "no-such-c++")}
    runs = []
    for name in ("first", "second"):
        out = tmp_path / f"{name}.json"
        result = run_cli(
            None, "stats", "toy-copy", "--toy-examples", "4", "--no-table", "--json", out, subprocess=True, env=env
        )
        assert result.exit_code == 0, result.stderr
        runs.append((result, json.loads(out.read_text())))
    (first, first_stats), (second, second_stats) = runs
    lines = [line for line in first.stderr.splitlines() if UNAVAILABLE in line]
    assert len(lines) == 1 and "no C++ compiler" in lines[0] and "ATTNVIZ_KERNEL=0" in first.stderr
    assert UNAVAILABLE not in second.stderr and "building" not in second.stderr
    # the statistics come from torch's operations both times: the same numbers
    timing = {"seconds", "tokens_per_second"}
    assert {k: v for k, v in first_stats.items() if k not in timing} == {
        k: v for k, v in second_stats.items() if k not in timing
    }
    report = run_cli(None, "env", "--json", subprocess=True, env=env)
    described = json.loads(report.stdout)["kernel"]
    assert described["state"] == "unavailable" and "not tried again" in described["why"]


def test_env_names_versions_device_kernel_and_caches(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    result = run_cli(capsys, "env", "--json")
    assert result.exit_code == 0, result.stderr
    described = json.loads(result.stdout)
    import torch
    import transformers

    import attnviz

    assert described["versions"]["torch"] == torch.__version__
    assert described["versions"]["transformers"] == transformers.__version__
    assert described["versions"]["attnviz"] == attnviz.__version__
    assert described["python"] == sys.version.split()[0]
    assert described["device"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert described["caches"]["attnviz"] == str(tmp_path / "cache")
    assert described["kernel"]["state"] in ("loaded", "built", "not built", "disabled", "unavailable")
    text = run_cli(capsys, "env").stdout
    assert f"torch: {torch.__version__}" in text and "fused kernel: " in text


def _dead_pid() -> int:
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(finished.stdout)


def _lock(directory: Path, owner_pid: int, age_seconds: float = 0.0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    lock = directory / "lock"
    lock.write_text("")
    (directory / OWNER_FILE).write_text(json.dumps({"pid": owner_pid, "host": socket.gethostname(), "time": 0}))
    if age_seconds:
        when = time.time() - age_seconds
        os.utime(lock, (when, when))
    return lock


def test_a_lock_whose_builder_is_gone_is_removed_at_once(tmp_path):
    lock = _lock(tmp_path, _dead_pid())
    start = time.perf_counter()
    check = clear_stale_lock(tmp_path)
    assert check.removed and check.why == "its build process is gone" and not lock.exists()
    assert time.perf_counter() - start < 1.0


def test_a_lock_older_than_any_build_is_removed_even_if_its_owner_lives(tmp_path):
    lock = _lock(tmp_path, os.getpid(), age_seconds=STALE_AFTER_SECONDS + 60)
    check = clear_stale_lock(tmp_path)
    assert check.removed and "minutes old" in check.why and not lock.exists()


def test_a_live_build_is_waited_for_until_it_releases_the_lock(tmp_path):
    lock = _lock(tmp_path, os.getpid())
    threading.Timer(0.3, lock.unlink).start()  # the other build finishes
    start = time.perf_counter()
    check = clear_stale_lock(tmp_path, poll_seconds=0.05)
    assert not check.removed and 0.25 <= time.perf_counter() - start < 5


def test_prepare_kernel_clears_a_stale_lock_before_torch_would_wait_on_it(monkeypatch, tmp_path):
    """torch's builder waits forever on a leftover lock; prepare_kernel removes it first and says so."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(kernel, "_state", "unloaded")
    monkeypatch.setattr(kernel, "_module", None)
    monkeypatch.delenv(kernel.KERNEL_VARIABLE, raising=False)
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in kernel.VECTOR_CAPABILITIES:
        pytest.skip(f"the kernel does not run on {capability}")
    monkeypatch.setattr("attnviz.core.kernel.missing_tools", lambda: None)  # whatever this machine has
    directory = kernel.build_directory(kernel.kernel_name(capability))
    lock = _lock(directory, _dead_pid())
    seen = []

    def build(**kwargs):
        seen.append(lock.exists())
        raise RuntimeError("stop here")

    monkeypatch.setattr(cpp_extension, "load_inline", build)
    with pytest.warns(UserWarning) as warned:
        kernel.prepare_kernel()
    assert seen == [False]  # gone before torch's builder looked
    assert any("removed a stale build lock" in str(item.message) for item in warned)


def test_the_build_notice_is_printed_once(monkeypatch, tmp_path, capsys):
    """On the command line's reporter (stderr no terminal) the build says so in one line, not a notice and a status."""
    from torch.utils import cpp_extension

    from attnviz.cli.console import ConsoleReporter
    from attnviz.common.progress import use_reporter

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(kernel, "_state", "unloaded")
    monkeypatch.setattr(kernel, "_module", None)
    monkeypatch.delenv(kernel.KERNEL_VARIABLE, raising=False)
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in kernel.VECTOR_CAPABILITIES:
        pytest.skip(f"the kernel does not run on {capability}")
    monkeypatch.setattr("attnviz.core.kernel.missing_tools", lambda: None)
    monkeypatch.setattr(cpp_extension, "load_inline", lambda **kwargs: object())  # a build that succeeds at once
    with use_reporter(ConsoleReporter()):
        assert kernel.prepare_kernel()
    stderr = capsys.readouterr().err
    assert " ".join(stderr.split()).count("building attnviz's fused attention kernel") == 1, stderr
