"""The lowest versions ``pyproject.toml`` allows really work: installed in a fresh venv, ``--help`` and a command run.

``uv pip install --resolution lowest-direct`` installs the lowest release of every direct dependency
that the project allows (their own dependencies as new as those allow). torch is the one exception:
it stays at the version this environment runs (a multi-GB download otherwise), pinned by an override.
Needs the package index (as installing attnviz does); skipped where uv is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, command))}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def test_the_declared_minimum_versions_work(tmp_path):
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(uv).exists():
        pytest.skip("uv is not installed (pip install uv)")
    venv = tmp_path / "lowest"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    torch_version = torch.__version__.split("+")[0]
    # torch as this environment has it (pip knows where this machine keeps its build)
    _run([str(python), "-m", "pip", "install", "--quiet", f"torch=={torch_version}"])
    overrides = tmp_path / "overrides.txt"
    overrides.write_text(f"torch=={torch_version}\n")
    _run(
        [uv, "pip", "install", "--python", str(python), "--resolution", "lowest-direct"]
        + ["--override", str(overrides), str(REPO)],
        env={**os.environ, "UV_NO_PROGRESS": "1"},
    )
    listed = json.loads(_run([uv, "pip", "list", "--python", str(python), "--format", "json"]).stdout)
    installed = {item["name"].lower(): item["version"] for item in listed}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ATTNVIZ_KERNEL": "0"}
    env.pop("PYTHONPATH", None)
    attnviz = venv / "bin" / "attnviz"
    help_text = _run([str(attnviz), "--help"], env=env, cwd=tmp_path).stdout
    assert "heatmap" in help_text and "stats" in help_text
    out = tmp_path / "stats.json"
    _run(
        [str(attnviz), "stats", "toy-copy", "--toy-examples", "4", "--no-table", "--json", str(out)],
        env=env,
        cwd=tmp_path,
    )
    record = json.loads(out.read_text())
    assert record["num_examples"] == 4 and len(record["heads"]) == 8, installed
    png = tmp_path / "heatmap.png"
    _run([str(attnviz), "heatmap", "The cat sat.", "--out", str(png)], env=env, cwd=tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
