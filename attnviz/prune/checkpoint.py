"""Where a pruned checkpoint may be written: checked before any model loads.

The checkpoint itself is written by the model (:meth:`attnviz.models.base.LoadedModel.save_pruned`):
Hugging Face models in the format of :mod:`attnviz.models.pruned_format`, toy models as toy checkpoints.
"""

from __future__ import annotations

import os
from pathlib import Path

from attnviz.common.errors import OutputParameterError
from attnviz.models.base import LoadedModel
from attnviz.outputs.files import check_output_parent


def model_source_paths(spec: str, loaded: LoadedModel | None = None) -> list[Path]:
    """Files and directories a model was read from (the pruned output must never touch them)."""
    paths = []
    spec_path = Path(spec).expanduser()
    if spec_path.exists():
        paths.append(spec_path.resolve())
    if loaded is not None:
        paths.extend(loaded.source_paths())
    return paths


def check_output_dir(out: str | os.PathLike, *, force: bool, inputs: list[Path] = ()) -> Path:
    """Validate ``out`` before any work: a new or empty directory, or ``force``; never an input.

    Raises :class:`OutputError`.
    """
    out = Path(out).expanduser()
    resolved = out.resolve()
    for source in inputs:
        source_dir = source if source.is_dir() else source.parent
        if resolved == source or resolved == source_dir or source_dir in resolved.parents or resolved in source.parents:
            raise OutputParameterError(
                "out", f"{{out}} {out} would overwrite the input model at {source}: choose another directory", out
            )
    if out.exists() and not out.is_dir():
        raise OutputParameterError("out", f"{{out}} {out} is a file, not a directory: choose a directory path", out)
    if out.is_dir() and any(out.iterdir()) and not force:
        raise OutputParameterError(
            "out", f"{{out}} {out} exists and is not empty: choose a new directory or add {{force}} to replace it", out
        )
    check_output_parent(resolved)
    return out
