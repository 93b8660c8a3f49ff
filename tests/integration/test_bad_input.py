"""Bad input and faults across every command: one ``error:`` line, exit ≠ 0, no traceback,
no pre-existing file changed (content and mode), nothing new left behind, no foreign code run.

Every case runs the real entry point in-process inside one shared workspace of damaged
inputs (see ``bad_input_helpers.build_workspace``), which is snapshotted before and after.
"""

from __future__ import annotations

import os
import shlex

import pytest
from bad_input_helpers import MARKER_NAME, build_workspace, changes, fill_disk, snapshot
from cli_helpers import run_cli

NOT_UTF8 = os.fsdecode(b"caf\xe9 \xff")  # argv bytes that are not UTF-8, as Python hands them over

# (id, arguments, fragments the message must contain). Paths are relative to the workspace.
HEATMAP = [
    ("max-length-0", ["heatmap", "x", "--max-length", "0"], ["--max-length"]),
    ("misspelt-option", ["heatmap", "x", "--ouT", "a.png"], ["--out"]),
    ("no-text", ["heatmap"], ["no text"]),
    ("blank-text", ["heatmap", "   "], ["empty"]),
    ("bad-suffix", ["heatmap", "x", "--out", "h.txt"], [".png"]),
    ("missing-dir", ["heatmap", "x", "--out", "nowhere/h.png"], ["does not exist"]),
    ("out-is-dir", ["heatmap", "x", "--out", "dir.png"], ["directory"]),
    ("model-missing", ["heatmap", "x", "--model", "no/such/model"], ["does not exist"]),
    ("truncated-weights", ["heatmap", "The cat", "--model", "m_trunc"], ["m_trunc"]),
    ("damaged-header", ["heatmap", "The cat", "--model", "m_header"], ["m_header"]),
    ("empty-weights", ["heatmap", "The cat", "--model", "m_empty"], ["m_empty"]),
    ("foreign-weights", ["heatmap", "The cat", "--model", "m_foreign"], ["103", "random"]),
    ("missing-layer", ["heatmap", "The cat", "--model", "m_nolayer5"], ["16", "layer.5"]),
    ("unexpected-weights", ["heatmap", "The cat", "--model", "m_extra"], ["extra.weight"]),
    ("remote-code", ["heatmap", "The cat", "--model", "m_remote"], ["does not run code"]),
    ("malicious-pickle", ["heatmap", "The cat", "--model", "m_pickle"], ["refuses to unpickle"]),
    ("damaged-tokenizer", ["heatmap", "The cat", "--model", "m_tok"], ["m_tok"]),
    ("damaged-config", ["heatmap", "The cat", "--model", "m_cfg"], ["m_cfg"]),
    ("capture-3-tokens", ["heatmap", "--from-capture", "c_tokens3.safetensors"], ["damaged"]),
    ("capture-tokens-string", ["heatmap", "--from-capture", "c_tokstr.safetensors"], ["tokens"]),
    ("capture-1d", ["heatmap", "--from-capture", "c_1d.safetensors"], ["shape"]),
    ("capture-nan", ["heatmap", "--from-capture", "c_nan.safetensors"], ["NaN"]),
    ("capture-layer-gap", ["heatmap", "--from-capture", "c_gap.safetensors"], ["numbered"]),
    ("capture-foreign-tensor", ["heatmap", "--from-capture", "c_name.safetensors"], ["sideways.0"]),
    ("capture-causal-type", ["heatmap", "--from-capture", "c_causal.safetensors"], ["causal"]),
    ("capture-word-ids", ["heatmap", "--from-capture", "c_words.safetensors"], ["word_ids"]),
    ("capture-not-json", ["heatmap", "--from-capture", "c_notjson.safetensors"], ["JSON"]),
    ("capture-no-tokens", ["heatmap", "--from-capture", "c_notokens.safetensors"], ["tokens"]),
    ("capture-version", ["heatmap", "--from-capture", "c_version.safetensors"], ["version"]),
    ("capture-format", ["heatmap", "--from-capture", "c_format.safetensors"], ["not an attnviz capture"]),
    ("capture-garbage", ["heatmap", "--from-capture", "c_garbage.safetensors"], ["safetensors"]),
    ("capture-missing", ["heatmap", "--from-capture", "none.safetensors"], ["does not exist"]),
    ("capture-and-text", ["heatmap", "x", "--from-capture", "good.safetensors"], ["not both"]),
    ("capture-bad-layer", ["heatmap", "--from-capture", "good.safetensors", "--layer", "7"], ["layer"]),
    ("capture-bad-head", ["heatmap", "--from-capture", "good.safetensors", "--head", "x"], ["head"]),
    ("text-not-utf8", ["heatmap", NOT_UTF8], ["UTF-8"]),
    ("out-inside-model", ["heatmap", "a b c", "--model", "toy", "--out", "toy/h.png"], ["toy"]),
    ("out-through-symlink", ["heatmap", "a b c", "--model", "toy", "--out", "toylink/h.png"], ["toy"]),
    ("out-in-cache", ["heatmap", "x", "--out", "cache/h.png"], ["cache"]),
    ("bad-stack", ["heatmap", "x", "--stack", "sideways"], ["stack"]),
    ("bad-device", ["heatmap", "x", "--device", "tpu"], ["device"]),
    ("bad-dtype", ["heatmap", "x", "--dtype", "int3"], ["dtype"]),
    # inputs that must agree: config vs weights, weights holding NaN, a tokenizer past the embedding table
    ("config-more-layers", ["heatmap", "The cat", "--model", "m_layers"], ["num_hidden_layers", "disagree"]),
    ("weights-nan", ["heatmap", "The cat", "--model", "m_nan"], ["NaN"]),
    ("tokenizer-past-embeddings", ["heatmap", "The cat", "--model", "m_vocab"], ["embedding table"]),
    ("tokenizer-id-past-embeddings", ["heatmap", "the cat", "--model", "m_sparse_ids"], ["500,000", "embedding"]),
    ("toy-marker-huge-width", ["heatmap", "a b", "--model", "t_width", "--out", "h.png"], ["width", "memory"]),
    ("toy-marker-other-width", ["heatmap", "a b", "--model", "t_wider", "--out", "h.png"], ["do not fit the config"]),
    ("toy-marker-task-too-long", ["heatmap", "a b", "--model", "t_task", "--out", "h.png"], ["max_positions"]),
    # every input path validated alike
    ("layer-empty-entry", ["heatmap", "--from-capture", "good.safetensors", "--layer", "0,,1"], ["empty entry"]),
    ("out-trailing-slash", ["heatmap", "x", "--out", "h.png/"], ["slash"]),
    ("temperature-tiny", ["heatmap", "x", "--generate", "2", "--sample", "--temperature", "1e-300"], ["--temperature"]),
    ("temperature-zero", ["heatmap", "x", "--generate", "2", "--sample", "--temperature", "0"], ["--temperature"]),
]
CAPTURE = [
    ("over-model-weights", ["capture", "The cat", "--model", "mini", "--out", "mini/model.safetensors"], ["mini"]),
    ("over-toy-weights", ["capture", "a b", "--model", "toy", "--out", "toy/model.safetensors"], ["toy"]),
    ("suffix", ["capture", "x", "--out", "c.png"], [".safetensors"]),
    ("no-out", ["capture", "x"], ["--out"]),
    ("negative-length", ["capture", "x", "--out", "c.safetensors", "--max-length", "-1"], ["--max-length"]),
    ("foreign-weights", ["capture", "x", "--out", "c.safetensors", "--model", "m_foreign"], ["random"]),
]
STATS = [
    ("over-config", ["stats", "mini", "--json", "mini/config.json"], ["mini"]),
    ("batch-size-0", ["stats", "--batch-size", "0"], ["--batch-size"]),
    ("same-output-twice", ["stats", "toy", "--json", "a.json", "--csv", "a.json"], ["a.json"]),
    ("data-missing", ["stats", "toy", "--data", "none.txt"], ["does not exist"]),
    ("data-empty", ["stats", "toy", "--data", "empty.txt"], ["empty"]),
    ("data-jsonl-no-text", ["stats", "toy", "--data", "bad.jsonl"], ["text"]),
    ("data-is-dir", ["stats", "toy", "--data", "adir"], ["directory"]),
    ("data-not-utf8", ["stats", "toy", "--data", "latin1.txt"], ["UTF-8"]),
    ("data-is-device", ["stats", "toy", "--data", "/dev/zero"], ["regular file"]),
    ("json-over-data", ["stats", "toy", "--data", "data.txt", "--json", "data.txt"], ["data.txt"]),
    ("plot-over-data", ["stats", "toy", "--data", "data.jsonl", "--plot", "data.jsonl"], ["data.jsonl"]),
    ("bad-preset", ["stats", "toy", "--preset", "bogus"], ["bogus"]),
    ("bad-sort", ["stats", "toy", "--sort", "bogus"], ["bogus"]),
    ("threshold-nan", ["stats", "toy", "--collapsed-max-weight", "nan"], ["finite"]),
    ("threshold-inf", ["stats", "toy", "--collapsed-entropy", "inf"], ["finite"]),
    ("threshold-range", ["stats", "toy", "--collapsed-max-weight", "2"], ["collapsed"]),
    ("json-symlink-into-model", ["stats", "toy", "--json", "toylink/attnviz-toy.json"], ["toy"]),
    ("text-not-utf8", ["stats", "toy", "--text", NOT_UTF8], ["UTF-8"]),
    ("checkpoint-missing", ["stats", "toy", "nothing-here"], ["nothing-here"]),
    ("plot-suffix", ["stats", "toy", "--plot", "p.txt"], [".png"]),
    # bounded resources: sizes no machine holds are refused before allocating, naming the option
    ("toy-examples-unbounded", ["stats", "toy", "--toy-examples", "1000000000000"], ["--toy-examples", "memory"]),
    ("json-trailing-slash", ["stats", "toy", "--json", "s.json/"], ["slash"]),
    ("data-jsonl-lone-surrogate", ["stats", "mini", "--data", "surrogate.jsonl"], ["surrogate.jsonl:1", "UTF-8"]),
]
PRUNE = [
    ("json-over-toy", ["prune", "toy", "--count", "1", "--out", "p", "--json", "toy/attnviz-toy.json"], ["toy"]),
    ("json-over-data", ["prune", "minilm", "--data", "data.jsonl", "--json", "data.jsonl", "--out", "p"], ["data"]),
    ("ratio-text", ["prune", "toy", "--ratio", "abc", "--out", "p"], ["--ratio"]),
    ("ratio-nan", ["prune", "toy", "--ratio", "nan", "--out", "p"], ["finite"]),
    ("ratio-too-big", ["prune", "toy", "--ratio", "1.5", "--out", "p"], ["ratio"]),
    ("batch-size-0", ["prune", "toy", "--batch-size", "0", "--out", "p"], ["--batch-size"]),
    ("no-out", ["prune", "toy", "--ratio", "0.5"], ["--out"]),
    ("out-contains-model", ["prune", "toy", "--out", ".", "--force", "--count", "1"], ["would overwrite"]),
    ("out-is-model", ["prune", "toy", "--out", "toy", "--force", "--count", "1"], ["toy"]),
    ("out-not-empty", ["prune", "toy", "--out", "adir", "--count", "1"], ["--force"]),
    ("bad-importance", ["prune", "toy", "--importance", "bogus", "--out", "p", "--count", "1"], ["bogus"]),
    ("foreign-weights", ["prune", "m_foreign", "--count", "1", "--out", "p"], ["random"]),
    ("no-arguments", ["prune"], ["needs arguments"]),
    ("toy-examples-unbounded", ["prune", "toy", "--count", "1", "--out", "p", "--toy-examples", "1000000000000"], []),
]
TRAIN = [
    ("unknown-task", ["train", "bogus"], ["bogus"]),
    ("lr-nan", ["train", "copy", "--lr", "nan"], ["--lr"]),
    ("lr-inf", ["train", "copy", "--lr", "inf"], ["--lr"]),
    ("bad-lengths", ["train", "copy", "--lengths", "x:y"], ["--lengths"]),
    ("heads-not-dividing", ["train", "copy", "--width", "16", "--heads", "3", "--steps", "1"], ["16"]),
    ("out-is-file", ["train", "copy", "--out", "data.txt", "--steps", "1"], ["data.txt"]),
    ("out-not-toy-dir", ["train", "copy", "--out", "adir", "--steps", "1"], ["adir"]),
    ("batch-size-0", ["train", "copy", "--batch-size", "0", "--steps", "1"], ["batch"]),
    ("steps-text", ["train", "copy", "--steps", "many"], ["--steps"]),
    ("width-unbounded", ["train", "copy", "--width", "1000000000000", "--heads", "1"], ["--width", "memory"]),
    ("layers-unbounded", ["train", "copy", "--layers", "1000000000000"], ["--layers", "memory"]),
    ("symbols-unbounded", ["train", "copy", "--symbols", "1000000000000"], ["--symbols", "memory"]),
    ("batch-unbounded", ["train", "copy", "--batch-size", "1000000000000", "--steps", "1"], ["--batch-size"]),
    ("lengths-unbounded", ["train", "copy", "--lengths", "1000000000000"], ["--lengths", "memory"]),
    ("heads-not-dividing-huge", ["train", "copy", "--width", "1000000000000", "--heads", "7"], ["memory"]),
]
REPORT = [
    ("out-inside-model", ["report", "toy", "--out", "toy/r.html"], ["toy"]),
    ("out-through-symlink", ["report", "toy", "--out", "toylink/r.html"], ["toy"]),
    ("out-suffix", ["report", "toy", "--out", "r.txt"], [".html"]),
    ("out-is-dir", ["report", "toy", "--out", "adir"], ["adir"]),
    ("prune-report-missing", ["report", "toy", "--prune-report", "none.json", "--out", "r.html"], ["none.json"]),
    ("prune-report-not-json", ["report", "toy", "--prune-report", "data.txt", "--out", "r.html"], ["data.txt"]),
    ("data-empty", ["report", "toy", "--data", "empty.txt", "--out", "r.html"], ["empty"]),
    ("examples-too-many", ["report", "toy", "--examples", "99", "--out", "r.html"], ["--examples"]),
    ("foreign-weights", ["report", "m_foreign", "--out", "r.html"], ["random"]),
    ("text-not-utf8", ["report", "toy", "--text", NOT_UTF8, "--out", "r.html"], ["UTF-8"]),
    # a prune report must name this model, fit its heads and hold finite numbers
    (
        "prune-report-other-model",
        ["report", "toy", "--prune-report", "pr_other.json", "--out", "r.html"],
        ["written for"],
    ),
    ("prune-report-nan", ["report", "toy", "--prune-report", "pr_nan.json", "--out", "r.html"], ["nan"]),
    ("prune-report-text-score", ["report", "toy", "--prune-report", "pr_text.json", "--out", "r.html"], ["score"]),
    ("prune-report-layer-range", ["report", "toy", "--prune-report", "pr_range.json", "--out", "r.html"], ["layer 9"]),
]
HEADS = [
    ("json-over-model", ["heads", "toy", "--json", "toy/attnviz-toy.json"], ["toy"]),
    ("csv-over-data", ["heads", "toy", "--data", "data.txt", "--csv", "data.txt"], ["data.txt"]),
    ("threshold-nan", ["heads", "toy", "--induction-min", "nan"], ["--induction-min"]),
    ("length-1", ["heads", "toy", "--length", "1"], ["--length"]),
    ("foreign-weights", ["heads", "m_foreign"], ["random"]),
    ("plot-suffix", ["heads", "toy", "--plot", "p.txt"], [".png"]),
    ("sequences-unbounded", ["heads", "toy", "--sequences", "1000000000000"], ["--sequences", "memory"]),
]
ROOT = [
    ("unknown-command", ["hetmap"], ["heatmap"]),
    ("unknown-root-option", ["--bogus"], ["--bogus"]),
]
CASES = [
    pytest.param(args, fragments, id=f"{group}-{name}")
    for group, cases in (
        ("heatmap", HEATMAP),
        ("capture", CAPTURE),
        ("stats", STATS),
        ("prune", PRUNE),
        ("train", TRAIN),
        ("report", REPORT),
        ("heads", HEADS),
        ("root", ROOT),
    )
    for name, args, fragments in cases
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("bad-input")
    build_workspace(root, minilm_dir)
    return root


@pytest.fixture
def in_workspace(workspace, monkeypatch):
    """Run from inside the workspace, with attnviz's cache in it; check it is left exactly as found."""
    monkeypatch.chdir(workspace)
    monkeypatch.setenv("ATTNVIZ_CACHE", str(workspace / "cache"))
    before = snapshot(workspace)
    yield workspace
    assert changes(before, snapshot(workspace)) == []
    assert not (workspace / MARKER_NAME).exists(), "code from a model folder or a pickle ran"


def assert_one_error_line(result, fragments=()) -> None:
    assert result.exit_code != 0, result
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment.lower() in errors[0].lower(), errors[0]


@pytest.mark.parametrize(("args", "fragments"), CASES)
def test_bad_input_is_one_error_line_and_changes_nothing(in_workspace, capsys, args, fragments):
    result = run_cli(capsys, *args)
    assert_one_error_line(result, fragments)


def test_usage_errors_exit_2_and_keep_suggestions(in_workspace, capsys):
    result = run_cli(capsys, "heatmap", "x", "--annotat")
    assert result.exit_code == 2
    assert_one_error_line(result, ["--annotate"])
    result = run_cli(capsys, "stats", "--sort-by", "x")
    assert result.exit_code == 2 and "--sort" in result.stderr


# -- faults: a full disk --------------------------------------------------------------------------------

FULL_DISK = [
    pytest.param(["heatmap", "a b c", "--model", "toy", "--out", "h.png"], id="heatmap-png"),
    pytest.param(["heatmap", "a b c", "--model", "toy", "--out", "h.svg"], id="heatmap-svg"),
    pytest.param(["capture", "a b c", "--model", "toy", "--out", "c.safetensors"], id="capture"),
    pytest.param(["stats", "toy", "--json", "s.json", "--plot", "s.png", "--toy-examples", "8"], id="stats-json-plot"),
    pytest.param(["stats", "toy", "--json", "old.json", "--toy-examples", "8"], id="stats-replacing-old"),
    pytest.param(["stats", "toy", "--csv", "s.csv", "--toy-examples", "8"], id="stats-csv"),
    pytest.param(["report", "toy", "--out", "r.html", "--examples", "1"], id="report"),
    pytest.param(["heads", "toy", "--json", "h.json", "--plot", "h.png", "--sequences", "2"], id="heads-json-plot"),
    pytest.param(
        shlex.split(
            "train copy --out t --steps 2 --width 8 --heads 2 --layers 1 --batch-size 4 --eval-examples 4 "
            "--checkpoint-every 1"
        ),
        id="train",
    ),
    pytest.param(
        shlex.split(
            "prune toy --count 1 --out p --json p.json --toy-examples 8 --latency-tokens 8 --latency-repeats 1 "
            "--importance entropy"
        ),
        id="prune",
    ),
]


@pytest.mark.parametrize("args", FULL_DISK)
def test_full_disk_is_one_line_and_leaves_nothing(in_workspace, capsys, monkeypatch, args):
    fill_disk(monkeypatch, in_workspace)
    result = run_cli(capsys, *args)
    assert_one_error_line(result, ["no space left on device writing"])


def test_stdin_is_never_asked(workspace, tmp_path, capsys):
    """A remote-code model with 'y' waiting on stdin: refused, no prompt, no code run."""
    before = snapshot(workspace)
    result = run_cli(
        capsys,
        "heatmap",
        "The cat",
        "--model",
        "m_remote",
        "--out",
        tmp_path / "h.png",
        subprocess=True,
        stdin="y\ny\n",
        cwd=workspace,
        timeout=300,
    )
    assert result.exit_code == 2, result.stderr
    assert result.error_lines(), result.stderr
    assert "does not run code" in result.stderr and "Traceback" not in result.stderr
    assert not (workspace / MARKER_NAME).exists()
    assert changes(before, snapshot(workspace)) == [] and list(tmp_path.iterdir()) == []
