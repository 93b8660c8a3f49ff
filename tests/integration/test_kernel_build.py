"""The fused kernel's build as users meet it: a folder per environment, every build said, an OS lock, failures remembered.

Each test gives the processes an extension cache of their own (``TORCH_EXTENSIONS_DIR``) where the
kernel's state is known, and runs real ``attnviz`` processes.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli

from attnviz.core import kernel

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
    assert "statistics on cpu: " in text  # which kernel each device's statistics pass runs


def test_env_says_how_a_gpu_multiplies_float32(monkeypatch, tmp_path):
    """On a machine with CUDA, the GPU's line names the Triton kernel, the arithmetic of its float32 products and
    where its launches come from; the file that keeps the timed ones is among the caches."""
    pytest.importorskip("triton", reason="Triton is not installed")
    from attnviz.core import triton_rows
    from attnviz.models.environment import _kernels_per_device, describe_environment

    monkeypatch.delenv("ATTNVIZ_KERNEL", raising=False)
    expected = {"tf32x3": "three TF32 products", "ieee": "full precision"}[triton_rows.float32_precision()]
    monkeypatch.delenv("ATTNVIZ_GPU_TUNING", raising=False)
    assert _kernels_per_device("loaded", "", cuda=True)["cuda"] == (
        f"Triton tile kernel (float32 products: {expected}; launches timed on the GPU on first use)"
    )
    monkeypatch.setenv("ATTNVIZ_GPU_TUNING", "0")
    assert _kernels_per_device("loaded", "", cuda=True)["cuda"].endswith("; launches from attnviz's table)")
    assert "cuda" not in _kernels_per_device("loaded", "", cuda=False)
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    described = describe_environment()
    assert described.caches["GPU kernel launches"] == str(tmp_path / "cache" / "gpu-launches.json")


@pytest.fixture
def fresh_kernel(monkeypatch, tmp_path):
    """prepare_kernel as in a new process, over an extension cache of its own, with a stand-in for the compiler
    run (``builds``: the folders it built in) that writes the binary where torch's builder would."""
    from torch.utils import cpp_extension

    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in kernel.VECTOR_CAPABILITIES:
        pytest.skip(f"the kernel does not run on {capability}")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.delenv(kernel.KERNEL_VARIABLE, raising=False)
    monkeypatch.setattr("attnviz.core.kernel.missing_tools", lambda: None)  # whatever this machine has
    builds: list[Path] = []

    def load_inline(*, name, build_directory, **kwargs):
        library = Path(build_directory) / f"{name}.so"
        if not library.exists():
            builds.append(Path(build_directory))
            library.write_bytes(b"binary")
        return object()

    monkeypatch.setattr(cpp_extension, "load_inline", load_inline)
    # as in a new process: a kernel an earlier test loaded here is not this folder's
    monkeypatch.setattr(kernel, "_state", "unloaded")
    monkeypatch.setattr(kernel, "_module", None)

    def prepare() -> list[str]:
        """One process's prepare_kernel: the notices it gave."""
        monkeypatch.setattr(kernel, "_state", "unloaded")
        monkeypatch.setattr(kernel, "_module", None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert kernel.prepare_kernel()
        return [str(item.message) for item in caught]

    return prepare, builds, capability


def _environment(monkeypatch, *, compiler: str, torch_at: str) -> None:
    """Make this process look like another virtual environment: another compiler, torch installed elsewhere."""
    monkeypatch.setattr("attnviz.core.kernel_build.compiler_identity", lambda: compiler)
    monkeypatch.setattr(torch, "__file__", f"{torch_at}/torch/__init__.py")


def test_each_environment_builds_in_a_folder_of_its_own_announces_every_build_and_reuses_it(monkeypatch, fresh_kernel):
    prepare, builds, capability = fresh_kernel
    environments = [
        {"compiler": "/usr/bin/g++-12: g++ (Debian 12.2.0-14) 12.2.0", "torch_at": "/venvs/one/site-packages"},
        {"compiler": "/usr/bin/g++-12: g++ (Debian 12.2.0-14) 12.2.0", "torch_at": "/venvs/two/site-packages"},
        {"compiler": "/usr/bin/g++-13: g++ (Debian 13.1.0-1) 13.1.0", "torch_at": "/venvs/one/site-packages"},
    ]
    folders = []
    for environment in environments:
        _environment(monkeypatch, **environment)
        folders.append(kernel.build_directory(kernel.kernel_name(capability)))
        notices = prepare()
        assert builds[-1] == folders[-1]
        assert [message for message in notices if "building attnviz's fused attention kernel" in message] == [
            kernel.build_notice(folders[-1])
        ]  # every build says so, the third as the first
    assert len(set(folders)) == 3 and len(builds) == 3
    for environment, folder in zip(environments, folders):  # switching back and forth rebuilds nothing
        _environment(monkeypatch, **environment)
        assert kernel.build_directory(kernel.kernel_name(capability)) == folder
        monkeypatch.setattr(kernel, "_state", "unloaded")
        assert kernel.describe_kernel() == ("built", f"{capability} lanes", folder)
        assert prepare() == []
    assert len(builds) == 3
    # the other inputs of the binary name folders of their own too
    from attnviz.core import kernel_build

    inputs = kernel_build.build_inputs("source", ["-O3"])
    for field, other in [("source", "another source"), ("flags", "-O2"), ("python", "cpython-312")]:
        changed = dict(inputs, **{field: other})
        assert kernel_build.inputs_hash(changed) != kernel_build.inputs_hash(inputs), field
    assert kernel_build.build_inputs("source", ["-O3"]) == inputs


def test_env_names_the_folder_and_says_built_or_building(monkeypatch, fresh_kernel, tmp_path):
    prepare, _, capability = fresh_kernel
    folder = kernel.build_directory(kernel.kernel_name(capability))
    assert kernel.describe_kernel()[:1] + kernel.describe_kernel()[2:] == ("not built", folder)
    prepare()
    monkeypatch.setattr(kernel, "_state", "unloaded")
    assert kernel.describe_kernel()[0] == "built" and kernel.describe_kernel()[2] == folder
    with _lock_held_by_another_process(folder) as holder:
        state, why, where = kernel.describe_kernel()
        assert state == "building" and str(holder.pid) in why and where == folder


HOLD_LOCK = """
import sys, time
from pathlib import Path
from attnviz.core.kernel_build import build_lock
folder = Path(sys.argv[1])
with build_lock(folder):
    (folder / "lock").write_text("")  # torch's own lock file, as its builder makes it
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    (folder / "lock").unlink()  # torch's builder removes it when done
"""


@contextlib.contextmanager
def _lock_held_by_another_process(folder: Path, seconds: float = 60.0):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(folder), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_a_build_held_by_a_live_process_is_waited_for_and_its_lock_left_alone(fresh_kernel):
    """The other process's torch lock file exists all the time it builds: it is never removed as stale."""
    prepare, builds, capability = fresh_kernel
    folder = kernel.build_directory(kernel.kernel_name(capability))
    folder.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(folder), "1.5"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        start = time.perf_counter()
        notices = prepare()  # waits until the holder is done
        waited = time.perf_counter() - start
        assert holder.wait(timeout=30) == 0  # it removed its own lock file: nobody took it away
    finally:
        holder.kill()
    assert waited >= 1.0
    assert not any("stale" in message for message in notices)
    assert builds == [folder]


def test_a_lock_file_left_by_a_killed_build_is_removed_at_once(fresh_kernel):
    prepare, builds, capability = fresh_kernel
    folder = kernel.build_directory(kernel.kernel_name(capability))
    folder.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(folder), "60"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    holder.kill()  # killed mid-build: the OS releases its lock, torch's lock file stays
    holder.wait()
    assert (folder / "lock").exists()
    start = time.perf_counter()
    notices = prepare()
    assert time.perf_counter() - start < 5
    assert any("removed a stale build lock" in message for message in notices)
    assert not (folder / "lock").exists() and builds == [folder]


def test_waiting_gives_up_after_the_limit_without_touching_the_lock(tmp_path):
    from attnviz.core.kernel_build import BuildLockTimeout, build_lock

    with _lock_held_by_another_process(tmp_path) as holder:
        with (
            pytest.raises(BuildLockTimeout, match=str(holder.pid)),
            build_lock(tmp_path, poll_seconds=0.05, wait_limit=0.3),
        ):
            pass
        assert (tmp_path / "lock").exists()


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
