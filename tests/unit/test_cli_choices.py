"""The command line spells out its closed sets (so it starts without importing torch); they match the library's."""

from __future__ import annotations

import subprocess
import sys

from attnviz.cli.prune_cmd import ImportanceMethod, Scope
from attnviz.cli.train_cmd import ARCHITECTURE_NAMES, ATTENTION_VARIANTS, TASK_NAMES
from attnviz.prune.importance import METHODS
from attnviz.prune.strategy import SCOPES
from attnviz.toy.config import ARCHITECTURES, VARIANT_NAMES
from attnviz.toy.tasks import TASKS


def test_cli_choices_equal_the_library_sets():
    assert TASK_NAMES == tuple(TASKS)
    assert ARCHITECTURE_NAMES == tuple(ARCHITECTURES)
    assert ATTENTION_VARIANTS == tuple(VARIANT_NAMES)
    assert tuple(method.value for method in ImportanceMethod) == tuple(METHODS)
    assert tuple(scope.value for scope in Scope) == tuple(SCOPES)


def test_starting_the_cli_does_not_import_torch():
    code = "import sys, attnviz.cli.app; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
