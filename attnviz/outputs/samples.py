"""The sample files shipped with attnviz, copied where a user can name them.

The package carries a few small inputs (``attnviz/sample_data``): the default corpus, short text
and JSON Lines files, sentence pairs with gold word alignments and the trained toy checkpoints.
:func:`copy_samples` copies them into a folder of the user's, so that every documented example
can name its input by a plain relative path (``sample_data/notes.txt``) after ``attnviz samples``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from attnviz.common.errors import OutputError
from attnviz.common.texts import sample_data_path
from attnviz.outputs import staging
from attnviz.outputs.files import check_output_parent, staged_directory

#: the folder ``attnviz samples`` writes when given none (the same name a source checkout has)
DEFAULT_SAMPLES_FOLDER = "sample_data"


def shipped_samples() -> Path:
    """The folder of sample files inside the installed package."""
    return sample_data_path()


def copy_samples(destination: str | os.PathLike = DEFAULT_SAMPLES_FOLDER) -> tuple[Path, bool]:
    """Copy the shipped sample files into ``destination`` (a new or empty folder).

    Returns the folder and whether anything was copied: a ``destination`` that already is the
    shipped folder (the ``sample_data`` link of a source checkout) is returned as it is.
    Raises :class:`OutputError` when ``destination`` holds anything else, so nothing of the
    user's is ever replaced.
    """
    destination = Path(destination).expanduser()
    source = shipped_samples()
    if destination.exists() and (
        staging.resolved(destination) == staging.resolved(source) or _same_files(destination, source)
    ):
        return destination, False
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        raise OutputError(
            f"{destination} already exists and is not an empty folder: remove it or name another folder "
            "(attnviz samples FOLDER)"
        )
    check_output_parent(destination)
    with staged_directory(destination) as stage:
        # the toy checkpoints, the corpus and the small inputs; no Python package files
        shutil.copytree(source, stage, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    return destination, True


def _files(folder: Path) -> dict[str, int]:
    """Relative path -> size of every sample file under ``folder``."""
    return {
        str(path.relative_to(folder)): path.stat().st_size
        for path in folder.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".py"
    }


def _same_files(destination: Path, source: Path) -> bool:
    """Whether ``destination`` is an earlier copy of the samples (same files, same sizes)."""
    return destination.is_dir() and _files(destination) == _files(source)
