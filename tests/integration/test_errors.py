"""Library errors name library parameters; the command line names its flags for the same error."""

from __future__ import annotations

import pytest
from cli_helpers import run_cli

from attnviz.cli.errors import error_message, flag_for
from attnviz.common.errors import InputError, ParameterError
from attnviz.prune.pipeline import PruneConfig
from attnviz.stats.thresholds import Thresholds
from attnviz.toy.training import TrainingSettings


def test_parameter_error_words_every_placeholder_per_caller():
    exc = ParameterError("ratio", "say how much to prune: {ratio} 0.3, {count} 20, or {min_score} 0.9")
    assert isinstance(exc, InputError)
    assert str(exc) == "say how much to prune: ratio 0.3, count 20, or min_score 0.9"
    assert error_message(exc) == "say how much to prune: --ratio 0.3, --count 20, or --min-score 0.9"
    assert flag_for("learning_rate") == "--lr" and flag_for("batch_size") == "--batch-size"


@pytest.mark.parametrize(
    ("build", "parameter", "library_text"),
    [
        (lambda: TrainingSettings(learning_rate=-1.0).validate(), "learning_rate", "learning_rate must be positive"),
        (lambda: PruneConfig(ratio=0.3, count=2).validate(), "count", "give either ratio or count"),
        (lambda: Thresholds(collapsed_max_weight=2.0), "collapsed_max_weight", "threshold collapsed_max_weight"),
    ],
)
def test_library_messages_never_name_flags(build, parameter, library_text):
    with pytest.raises(ParameterError) as info:
        build()
    assert info.value.parameter == parameter
    assert library_text in str(info.value) and "--" not in str(info.value)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["train", "copy", "--lr", "-1", "--out", "{tmp}/t"], "error: --lr must be positive (got -1.0)"),
        (
            ["prune", "toy-copy", "--ratio", "0.3", "--count", "2", "--out", "{tmp}/p"],
            "error: give either --ratio or --count, not both",
        ),
        (
            ["stats", "--collapsed-max-weight", "2"],
            "error: threshold --collapsed-max-weight must be between 0 and 1, got 2.0",
        ),
    ],
)
def test_cli_names_the_flag(capsys, tmp_path, args, line):
    result = run_cli(capsys, *[arg.format(tmp=tmp_path) for arg in args])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [line]
    assert list(tmp_path.iterdir()) == []
