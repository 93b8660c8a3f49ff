"""Fuzzing: any option value and any damaged file gives success or one ``error:`` line, never a traceback
and never ``unexpected internal error``.

Hypothesis draws option values (numbers at the edges, odd text) and damages input files (capture
headers and metadata, toy checkpoint markers, prune reports, data files). Derandomised and kept to a
few dozen examples per property so the suite stays fast; ``ATTNVIZ_FUZZ_EXAMPLES=500`` searches harder.
Every class these found has a case in ``test_bad_input.py``.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from bad_input_helpers import TOY
from cli_helpers import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("ATTNVIZ_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: whole numbers where bugs live: around 0, one, the int64 edge, and sizes no machine holds
EDGE_INTS = st.one_of(
    st.sampled_from([-(2**63), -1, 0, 1, 2, 3, 7, 2**31, 2**62, 2**63, 10**12, 10**30]),
    st.integers(-5, 40),
)
EDGE_FLOATS = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "1e-300", "1e300", "-0", "0", "1", "0.5", "-1", "1e-45"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
ODD_TEXT = st.one_of(
    st.sampled_from(["", " ", ",", "0,,1", "-", "--", "all", "mean", "-1", "1e3", "0x10", "٣", "\x00", "a/", "/"]),
    st.text(max_size=12),
)
VALUE = st.one_of(EDGE_INTS.map(str), EDGE_FLOATS, ODD_TEXT)


def assert_handled(result) -> None:
    """Success, or exactly one ``error:`` line; never a traceback or the internal-error fallback."""
    output = result.stderr + result.stdout
    assert "Traceback" not in output, result.stderr
    assert "unexpected internal error" not in output, result.stderr
    if result.exit_code != 0:
        assert len(result.error_lines()) == 1, result.stderr


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    from attnviz.captures.attention_capture import capture
    from attnviz.models.specs import load_model

    root = tmp_path_factory.mktemp("fuzz")
    capture(load_model(str(TOY), device="cpu"), "a b c d").save(root / "good.safetensors")
    shutil.copytree(TOY, root / "toy")
    return root


@pytest.fixture
def in_fuzz_dir(fuzz_dir, monkeypatch):
    monkeypatch.chdir(fuzz_dir)
    monkeypatch.setenv("ATTNVIZ_CACHE", str(fuzz_dir / "cache"))
    return fuzz_dir


HEATMAP_OPTIONS = ["--layer", "--head", "--scale", "--vmax", "--cmap", "--dpi", "--view", "--stack"]


@FUZZ
@given(options=st.lists(st.tuples(st.sampled_from(HEATMAP_OPTIONS), VALUE), max_size=3))
def test_heatmap_options(in_fuzz_dir, capsys, options):
    args = [item for pair in options for item in pair]
    result = run_cli(capsys, "heatmap", "--from-capture", "good.safetensors", "--out", "h.png", *args)
    assert_handled(result)
    (in_fuzz_dir / "h.png").unlink(missing_ok=True)


STATS_OPTIONS = ["-w", "--toy-examples", "--limit", "--sort", "--seed", "--collapsed-max-weight", "--max-length"]


@FUZZ
@given(options=st.lists(st.tuples(st.sampled_from(STATS_OPTIONS), VALUE), min_size=1, max_size=3))
def test_stats_options(in_fuzz_dir, capsys, options):
    args = [item for pair in options for item in pair]
    if "--toy-examples" not in args:
        args += ["--toy-examples", "4"]
    assert_handled(run_cli(capsys, "stats", "toy", "--no-table", *args))


HEADS_OPTIONS = ["--length", "--sequences", "--seed", "--similarity-examples", "--similarity-tokens", "--induction-min"]


@FUZZ
@given(options=st.lists(st.tuples(st.sampled_from(HEADS_OPTIONS), VALUE), min_size=1, max_size=2))
def test_heads_options(in_fuzz_dir, capsys, options):
    args = [item for pair in options for item in pair]
    if "--sequences" not in args:
        args += ["--sequences", "2"]
    assert_handled(run_cli(capsys, "heads", "toy", "--no-table", *args))


TRAIN_OPTIONS = ["--symbols", "--width", "--heads", "--layers", "--mlp-width", "--lengths", "--window", "--lr"]


@FUZZ
@given(options=st.lists(st.tuples(st.sampled_from(TRAIN_OPTIONS), VALUE), min_size=1, max_size=2))
def test_train_options_before_training(in_fuzz_dir, capsys, monkeypatch, options):
    """Sizes and values of ``train`` (only the checks: the training loop itself is stubbed out)."""
    from attnviz.toy import run as toy_run

    monkeypatch.setattr(toy_run, "train_to_directory", _no_training)
    args = [item for pair in options for item in pair]
    assert_handled(run_cli(capsys, "train", "copy", "--out", "t", "--steps", "1", *args))


def _no_training(*args, **kwargs):
    from attnviz.common.errors import InputError

    raise InputError("stopped before training (fuzz test)")


@FUZZ
@given(text=st.text(min_size=0, max_size=30))
def test_heatmap_text(in_fuzz_dir, capsys, text):
    assert_handled(run_cli(capsys, "heatmap", text, "--model", "toy", "--out", "h.png"))
    (in_fuzz_dir / "h.png").unlink(missing_ok=True)


# -- damaged files ------------------------------------------------------------------------------------

JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(), st.text(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6,
)


@FUZZ
@given(position=st.integers(0, 400), data=st.binary(min_size=1, max_size=8))
def test_damaged_capture_bytes(in_fuzz_dir, capsys, tmp_path_factory, position, data):
    """Bytes overwritten in a capture's header and metadata (the first few hundred bytes)."""
    content = bytearray((in_fuzz_dir / "good.safetensors").read_bytes())
    content[position : position + len(data)] = data
    damaged = tmp_path_factory.mktemp("capture") / "c.safetensors"
    damaged.write_bytes(bytes(content))
    assert_handled(run_cli(capsys, "heatmap", "--from-capture", damaged, "--out", damaged.with_suffix(".png")))


@FUZZ
@given(path=st.lists(st.sampled_from(["config", "task", "tokenizer", "width", "num_heads", "max_length"]), max_size=2),
       value=JSON_VALUE)  # fmt: skip
def test_damaged_toy_marker(in_fuzz_dir, capsys, tmp_path_factory, path, value):
    """A value anywhere in a toy checkpoint's marker replaced by any JSON value."""
    folder = tmp_path_factory.mktemp("toy") / "toy"
    shutil.copytree(TOY, folder)
    marker = folder / "attnviz-toy.json"
    document = json.loads(marker.read_text())
    document.pop("weights_sha256", None)
    target = document
    for key in path[:-1]:
        target = target.get(key) if isinstance(target, dict) else None
    if isinstance(target, dict) and path:
        target[path[-1]] = value
    else:
        document["config"] = value
    marker.write_text(json.dumps(document))
    assert_handled(run_cli(capsys, "stats", folder, "--toy-examples", "4", "--no-table"))


@FUZZ
@given(field=st.sampled_from(["model", "output", "importance", "stack", "layer", "head", "score"]), value=JSON_VALUE)
def test_damaged_prune_report(in_fuzz_dir, capsys, tmp_path_factory, field, value):
    importance = [{"stack": "self", "layer": 0, "head": h, "score": 0.1 * h} for h in range(4)]
    report = {"format": "attnviz-prune-report", "version": 1, "model": "toy", "importance": importance}
    if field in ("model", "output", "importance"):
        report[field] = value
    else:
        importance[1][field] = value
    path = tmp_path_factory.mktemp("report") / "r.json"
    path.write_text(json.dumps(report))
    result = run_cli(
        capsys, "report", "toy", "--prune-report", path, "--examples", "0", "--out", path.with_suffix(".html")
    )
    assert_handled(result)


@settings(FUZZ, max_examples=min(EXAMPLES, 10))
@given(texts=st.lists(st.text(max_size=20), min_size=1, max_size=3), escaped=st.booleans())
def test_damaged_data_file(in_fuzz_dir, capsys, tmp_path_factory, texts, escaped):
    """JSON Lines data whose texts are anything JSON can spell (lone surrogates included) or plain lines."""
    lines = [json.dumps({"text": text}, ensure_ascii=escaped) for text in texts]
    path = tmp_path_factory.mktemp("data") / "d.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    assert_handled(run_cli(capsys, "stats", "minilm", "--data", path, "--max-length", "8", "--no-table"))
