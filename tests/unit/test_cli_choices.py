"""The command line spells out its closed sets (so it starts without importing torch); they match the library's."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from cli_helpers import assert_clean_error, run_cli

from attnviz.captures.choices import CAPTURE_BITS
from attnviz.cli.align_cmd import RowChoice
from attnviz.cli.capture_cmd import Bits
from attnviz.cli.heads_cmd import ScoreName
from attnviz.cli.heatmap_cmd import ColourScale
from attnviz.cli.options import DEVICE_FORMS, StackChoice, choice_parser, parse_device, parse_dtype
from attnviz.cli.prune_cmd import ImportanceMethod, Scope
from attnviz.cli.stats_options import Preset, Statistic
from attnviz.cli.train_cmd import Architecture, AttentionVariant, TaskName
from attnviz.common.errors import InputError, ParameterError
from attnviz.core.stacks import STACKS
from attnviz.heads.choices import ALIGNMENT_ROWS
from attnviz.heads.labels import SCORE_NAMES
from attnviz.models.choices import DTYPE_ALIASES, DTYPE_NAMES
from attnviz.models.specs import DTYPES, resolve_device, resolve_dtype
from attnviz.prune.choices import METHODS, SCOPES
from attnviz.render.choices import SCALES
from attnviz.stats.definitions import STATISTIC_NAMES
from attnviz.stats.thresholds import PRESETS
from attnviz.toy.config import ARCHITECTURES, VARIANT_NAMES
from attnviz.toy.tasks import IMAGE_TASKS, TASKS


def _values(choices) -> tuple:
    return tuple(choice.value for choice in choices)


def test_cli_choices_are_the_library_sets():
    """Each closed set has one owner in the library; the command line builds its choices from it."""
    assert _values(TaskName) == tuple(TASKS) + IMAGE_TASKS
    assert _values(Architecture) == tuple(ARCHITECTURES)
    assert _values(AttentionVariant) == tuple(VARIANT_NAMES)
    assert _values(ImportanceMethod) == tuple(METHODS)
    assert _values(Scope) == tuple(SCOPES)
    assert _values(Statistic) == STATISTIC_NAMES
    assert _values(Preset) == tuple(PRESETS)
    assert _values(ScoreName) == SCORE_NAMES
    assert _values(ColourScale) == SCALES
    assert _values(StackChoice) == tuple(STACKS)
    assert tuple(int(bits) for bits in _values(Bits)) == CAPTURE_BITS
    assert _values(RowChoice) == ALIGNMENT_ROWS


def test_dtype_names_and_aliases_are_the_librarys():
    """Every --dtype the CLI takes (names and aliases) is one the library resolves, to the same precision."""
    assert set(DTYPE_NAMES) | set(DTYPE_ALIASES) == {"auto"} | set(DTYPES)
    for given in [*DTYPE_NAMES, *DTYPE_ALIASES, "BF16", "Float16"]:
        assert resolve_dtype(parse_dtype(given)) == resolve_dtype(given)
    assert parse_dtype("fp16") == "float16" and parse_dtype("auto") == "auto"
    with pytest.raises(Exception, match="unknown dtype 'int8'"):
        parse_dtype("int8")


def test_device_forms_are_the_librarys():
    """The CLI's --device forms resolve in the library (CUDA ones fail only for want of a GPU); others fail in both."""
    import torch

    assert DEVICE_FORMS == ("auto", "cpu", "cuda", "cuda:N")
    for given in ["auto", "cpu", "CPU", "cuda", "cuda:0", "Cuda:1"]:
        device = parse_device(given)
        assert device == given.lower()
        if device.startswith("cuda") and not torch.cuda.is_available():
            with pytest.raises(ParameterError, match="no CUDA GPU"):
                resolve_device(device)
        else:
            assert resolve_device(device).type in ("cpu", "cuda")
    for refused in ["tpu", "mps", "gpu", "cuda:x", "cuda:"]:
        with pytest.raises(Exception, match="unknown device"):
            parse_device(refused)
    for refused in ["tpu", "mps", "gpu"]:
        with pytest.raises(InputError, match="unknown device"):
            resolve_device(refused)


def test_choice_parser_ignores_case_and_dashes_and_names_the_choices():
    parse = choice_parser(Statistic, "statistic")
    assert parse("Normalized-Entropy") is Statistic.normalized_entropy
    assert parse(Statistic.max_weight) is Statistic.max_weight
    assert choice_parser(Scope, "strategy")("PER_LAYER") is Scope("per-layer")
    with pytest.raises(Exception, match="unknown statistic 'bogus': use one of entropy, normalized_entropy"):
        parse("bogus")


#: (command line, option, choices its --help must list)
HELP_CHOICES = [
    (["heatmap"], "--device", DEVICE_FORMS),
    (["heatmap"], "--dtype", DTYPE_NAMES),
    (["heatmap"], "--view", ("heads", "rollout", "flow")),
    (["heatmap"], "--scale", SCALES),
    (["heatmap"], "--stack", tuple(STACKS)),
    (["capture"], "--bits", tuple(str(bits) for bits in CAPTURE_BITS)),
    (["stats"], "--preset", tuple(PRESETS)),
    (["stats"], "--sort", STATISTIC_NAMES),
    (["stats"], "--color-by", STATISTIC_NAMES),
    (["stats"], "--dtype", DTYPE_NAMES),
    (["heads"], "--sort", SCORE_NAMES),
    (["heads"], "--device", DEVICE_FORMS),
    (["prune"], "--importance", tuple(METHODS)),
    (["prune"], "--strategy", tuple(SCOPES)),
    (["prune"], "--dtype", DTYPE_NAMES),
    (["report"], "--dtype", DTYPE_NAMES),
    (["align"], "--rows", ALIGNMENT_ROWS),
    (["train"], "--attention", VARIANT_NAMES),
    (["train"], "--architecture", ARCHITECTURES),
    (["train"], "--device", DEVICE_FORMS),
]


@pytest.mark.parametrize(("command", "option", "choices"), HELP_CHOICES, ids=lambda v: str(v)[:30])
def test_help_lists_the_choices(capsys, monkeypatch, command, option, choices):
    monkeypatch.setenv("COLUMNS", "1000")  # wide enough that rich wraps no metavar
    result = run_cli(capsys, *command, "--help")
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if re.match(rf"│\s*{option}\s", line)]
    assert lines, f"{' '.join(command)} --help has no {option}"
    # as the metavar (<a|b|c>), or in the help text where a long list would squeeze the help column
    row = lines[0].split(option, 1)[1]
    missing = [choice for choice in choices if not re.search(rf"(?<![\w-]){re.escape(choice)}(?![\w-])", row)]
    assert missing == [], f"{' '.join(command)} --help does not list {missing} for {option}"


@pytest.mark.parametrize(
    ("args", "option", "fragment"),
    [
        (["stats", "--sort", "bogus"], "--sort", "unknown statistic 'bogus'"),
        (["stats", "--color-by", "bogus"], "--color-by", "unknown statistic 'bogus'"),
        (
            ["stats", "--preset", "strict"],
            "--preset",
            "unknown threshold preset 'strict': use one of normalized, absolute",
        ),
        (["heatmap", "x", "--dtype", "int3"], "--dtype", "unknown dtype 'int3'"),
        (["heatmap", "x", "--device", "tpu"], "--device", "unknown device 'tpu'"),
        (["prune", "toy-copy", "--device", "mps", "--count", "1", "--out", "p"], "--device", "unknown device 'mps'"),
    ],
)
def test_a_bad_choice_is_one_error_line_naming_the_option(capsys, args, option, fragment):
    """Refused while parsing, before any model loads: exit 2 and one line."""
    result = run_cli(capsys, *args)
    assert_clean_error(result, option, fragment)
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1


def test_starting_the_cli_does_not_import_torch():
    """The command line and every module holding a closed set start without torch (lazy package imports)."""
    light = [
        "attnviz.cli.app",
        "attnviz.captures.choices",
        "attnviz.heads.choices",
        "attnviz.heads.labels",
        "attnviz.models.choices",
        "attnviz.prune.choices",
        "attnviz.render.choices",
        "attnviz.stats.definitions",
        "attnviz.stats.thresholds",
        "attnviz.toy.config",
        "attnviz.toy.tasks",
        "attnviz.core.stacks",
    ]
    code = f"import sys, importlib; [importlib.import_module(m) for m in {light!r}]; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
