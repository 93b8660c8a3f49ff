"""Output guarantees: modes, all-or-nothing sessions, stale temporaries, inputs never overwritten,
checkpoint series kept inside their checkpoint, signals, and the --debug escape hatch."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from bad_input_helpers import TOY
from cli_helpers import run_cli

from attnviz.common.errors import ModelSpecError, OutputError
from attnviz.outputs import files, staging


@pytest.fixture
def umask():
    """Set the process umask for one test (restored afterwards)."""
    previous = os.umask(0o022)
    os.umask(previous)
    yield lambda value: os.umask(value)
    os.umask(previous)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.fixture(scope="module")
def toy_capture(tmp_path_factory):
    from attnviz.captures.attention_capture import capture
    from attnviz.models.specs import load_model

    path = tmp_path_factory.mktemp("capture") / "toy.safetensors"
    capture(load_model(str(TOY), device="cpu"), "a b c d").save(path)
    return path


def test_new_outputs_follow_the_umask_and_replaced_ones_keep_their_mode(tmp_path, capsys, umask, toy_capture):
    def render(name: str) -> int:
        return run_cli(capsys, "heatmap", "--from-capture", str(toy_capture), "--out", str(tmp_path / name)).exit_code

    umask(0o027)
    assert render("a.png") == 0
    assert mode(tmp_path / "a.png") == 0o640
    umask(0o077)
    assert render("b.png") == 0
    assert mode(tmp_path / "b.png") == 0o600
    (tmp_path / "a.png").chmod(0o644)  # an earlier output, replaced under a stricter umask: keeps 0644
    assert render("a.png") == 0
    assert mode(tmp_path / "a.png") == 0o644
    umask(0o022)
    with files.staged_directory(tmp_path / "d") as stage:
        (stage / "f.txt").write_text("x")
    assert mode(tmp_path / "d") == 0o755 and mode(tmp_path / "d" / "f.txt") == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png", "d"]


def test_a_session_writes_all_outputs_or_none(tmp_path):
    (tmp_path / "a.json").write_text("old")
    with pytest.raises(OutputError, match="no space left on device writing .*b.txt"), files.output_session():
        files.write_text_atomic(tmp_path / "a.json", "new")
        with files.atomic_path(tmp_path / "b.txt") as tmp:
            tmp.write_text("partial")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"] and (tmp_path / "a.json").read_text() == "old"
    with files.output_session():
        files.write_text_atomic(tmp_path / "a.json", "new")
        files.write_text_atomic(tmp_path / "b.txt", "b")
        assert (tmp_path / "a.json").read_text() == "old"  # nothing moves before the session ends
    assert (tmp_path / "a.json").read_text() == "new" and (tmp_path / "b.txt").read_text() == "b"


def test_a_failed_rename_rolls_back_the_earlier_ones(tmp_path, monkeypatch):
    (tmp_path / "a.json").write_text("old a")
    (tmp_path / "z.json").write_text("old z")
    real_replace = os.replace

    def replace(source, destination):
        staged_output = staging.TEMP_PREFIX in Path(source).name and not Path(source).name.endswith(".old")
        if Path(destination).name == "z.json" and staged_output:  # the disk fails on the second output
            raise OSError(errno.EIO, "Input/output error")
        return real_replace(source, destination)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OutputError, match="input/output error writing .*z.json"), files.output_session():
        files.write_text_atomic(tmp_path / "a.json", "new a")
        files.write_text_atomic(tmp_path / "z.json", "new z")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "z.json"]
    assert (tmp_path / "a.json").read_text() == "old a" and (tmp_path / "z.json").read_text() == "old z"


def test_stale_temporaries_of_dead_processes_are_removed_live_ones_kept(tmp_path):
    dead = tmp_path / f"{staging.TEMP_PREFIX}999999999_1-abc-h.png"
    dead.write_text("left by a killed run")
    dead_dir = tmp_path / f"{staging.TEMP_PREFIX}999999999_1-def-ckpt"
    dead_dir.mkdir()
    (dead_dir / "model.safetensors").write_text("x")
    live = tmp_path / f"{staging.temp_prefix()}ghi-other.png"  # this process: still writing
    live.write_text("in progress")
    files.write_text_atomic(tmp_path / "out.txt", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "out.txt"])


def test_gguf_conversion_cache_loses_stale_temporaries(tmp_path, monkeypatch):
    from attnviz.models.gguf import converted_gguf_dir

    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    gguf_cache = tmp_path / "cache" / "gguf"
    gguf_cache.mkdir(parents=True)
    (gguf_cache / f"{staging.TEMP_PREFIX}999999999_1-abc-model").mkdir()
    (gguf_cache / ".convert-legacy").mkdir()  # an older attnviz's, abandoned two hours ago
    os.utime(gguf_cache / ".convert-legacy", (time.time() - 7200, time.time() - 7200))
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF but not really")  # the right magic bytes, then garbage: conversion starts and fails
    with pytest.raises(ModelSpecError, match="cannot read GGUF file"):
        converted_gguf_dir(fake)
    assert list(gguf_cache.iterdir()) == []


def test_outputs_that_touch_inputs_are_refused(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(model / "config.json")
    for output in (model / "config.json", model / "new.png", tmp_path / "link.json", tmp_path):
        with pytest.raises(OutputError, match="would overwrite"):
            files.check_outputs([output], [model])
    files.check_outputs([tmp_path / "elsewhere.png"], [model])
    with pytest.raises(OutputError, match="overlap"):
        files.check_outputs([tmp_path / "x", tmp_path / "x" / "y.json"])
    with files.output_session():
        files.protect_inputs([model])
        with pytest.raises(OutputError, match="would overwrite"):
            files.write_text_atomic(tmp_path / "link.json", "x")  # caught at write time too
    assert (model / "config.json").read_text() == "{}"


def test_an_image_read_is_never_written_over(tmp_path, capsys):
    """``--image FILE`` is an input like a model or a data file (a string option, for '-'): an output named like
    it is refused before anything runs, and the picture keeps its bytes; the same for each of ``stats --image``."""
    from PIL import Image

    picture = tmp_path / "odd.png"
    Image.new("RGB", (32, 32), (200, 30, 30)).save(picture)
    before = picture.read_bytes()
    result = run_cli(capsys, "heatmap", "--model", "toy-odd-patch", "--image", picture, "--out", picture)
    assert result.exit_code != 0 and "would overwrite the input" in result.stderr and "--image" in result.stderr
    other = tmp_path / "other.png"
    Image.new("RGB", (32, 32), (30, 30, 200)).save(other)
    result = run_cli(capsys, "stats", "toy-odd-patch", "--image", other, "--image", picture, "--plot", picture)
    assert result.exit_code != 0 and "would overwrite the input" in result.stderr
    assert picture.read_bytes() == before


def test_checkpoint_series_stays_inside_the_checkpoint(tmp_path):
    from attnviz.toy import checkpoint_series

    checkpoint = tmp_path / "toy"
    shutil.copytree(TOY, checkpoint)
    (checkpoint / "steps" / "step-1").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (checkpoint / "escape").symlink_to(tmp_path / "outside")
    marker = checkpoint / "attnviz-toy.json"
    document = json.loads(marker.read_text())
    document.pop("weights_sha256", None)

    def with_series(entries):
        marker.write_text(json.dumps({**document, "series": entries}))

    with_series([{"step": 1, "path": "steps/step-1"}])
    assert checkpoint_series(checkpoint) == [(1, checkpoint / "steps" / "step-1")]
    for bad in ("../../etc", "/etc/passwd", "escape", "steps/../../outside", "."):
        with_series([{"step": 1, "path": bad}])
        with pytest.raises(ModelSpecError, match="outside the checkpoint"):
            checkpoint_series(checkpoint)
    with_series([{"step": "x", "path": 3}])
    with pytest.raises(ModelSpecError, match="malformed"):
        checkpoint_series(checkpoint)


def test_internal_errors_are_one_line_unless_debug(tmp_path, capsys, monkeypatch, toy_capture):
    from attnviz.render import capture_view

    def broken(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(capture_view, "capture_heatmap", broken)
    result = run_cli(capsys, "heatmap", "--from-capture", str(toy_capture), "--out", str(tmp_path / "h.png"))
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: unexpected internal error (RuntimeError: boom); rerun with --debug to see the traceback"
    ]
    result = run_cli(capsys, "--debug", "heatmap", "--from-capture", str(toy_capture), "--out", str(tmp_path / "h.png"))
    assert result.exit_code == 1 and "Traceback" in result.stderr and "RuntimeError: boom" in result.stderr
    assert list(tmp_path.iterdir()) == []


# -- signals (a real process) --------------------------------------------------------------------------


def _train_until(directory: Path, capsys, stop: Callable[[subprocess.Popen], None]):
    """A long ``attnviz train`` writing step checkpoints into a staged directory, stopped by ``stop(process)``."""

    def once_training(process: subprocess.Popen) -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # wait until it is training (the staged directory exists)
            staged = [p for p in directory.iterdir() if p.name.startswith(staging.TEMP_PREFIX)]
            if staged and any((staged[0] / "steps").glob("step-*")):
                return stop(process)
            assert process.poll() is None, process.communicate()
            time.sleep(0.2)
        raise AssertionError("training did not start")

    return run_cli(
        capsys,
        "train", "copy", "--out", "run", "--steps", "1000000", "--checkpoint-every", "2",
        "--width", "16", "--heads", "2", "--layers", "1",
        subprocess=True, cwd=directory, while_running=once_training, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_signals_remove_temporaries_and_exit_128_plus_signal(tmp_path, capsys, signum):
    result = _train_until(tmp_path, capsys, lambda process: process.send_signal(signum))
    assert result.exit_code == 128 + signum, result.stderr
    assert result.error_lines() == [f"error: interrupted by {signum.name}: unfinished outputs were discarded"]
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_killed_run_leaves_temporaries_the_next_run_removes(tmp_path, capsys, toy_capture):
    killed = _train_until(tmp_path, capsys, lambda process: process.kill())  # SIGKILL: nothing can clean up
    assert killed.exit_code == -signal.SIGKILL
    assert [p for p in tmp_path.iterdir() if p.name.startswith(staging.TEMP_PREFIX)]
    result = run_cli(capsys, "heatmap", "--from-capture", str(toy_capture), "--out", str(tmp_path / "h.png"))
    assert result.exit_code == 0, result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["h.png"]
