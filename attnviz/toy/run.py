"""A whole training run of a toy model: train, save every step checkpoint and the final model atomically.

This is what ``attnviz train`` does, as one library call: the step checkpoints are staged in the
output's temporary directory as training goes, and the directory appears only when the run has
finished (a failed or interrupted run leaves nothing behind).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from attnviz.core import AttentionSite
from attnviz.toy.checkpoint import check_checkpoint_output, staged_directory, write_checkpoint_files
from attnviz.toy.loaded import ToyModel
from attnviz.toy.solutions import solution_scores
from attnviz.toy.training import TrainingResult, TrainingSettings, train_toy_model


@dataclass
class SolutionHead:
    """The head that best matches the task's known attention solution."""

    site: AttentionSite
    head: int
    score: float  # mean weight on the keys the known solution attends to


@dataclass
class TrainingRun:
    out: Path
    result: TrainingResult
    series: list[dict] = field(default_factory=list)  # {"step": int, "path": "steps/step-000100"}
    best_head: SolutionHead | None = None


def best_solution_head(loaded: ToyModel, num_examples: int = 100) -> SolutionHead | None:
    """The head whose attention is closest to the task's known solution (None if the task has none)."""
    scores = solution_scores(loaded, num_examples=num_examples)
    candidates = [(site, head, float(value)) for site, row in scores.items() for head, value in enumerate(row)]
    if not candidates:
        return None
    return SolutionHead(*max(candidates, key=lambda candidate: candidate[2]))


def train_to_directory(
    loaded: ToyModel, settings: TrainingSettings, out: str | os.PathLike, *, description: str | None = None
) -> TrainingRun:
    """Train ``loaded`` with ``settings`` and write it to ``out`` with its step checkpoints under ``out/steps``."""
    out = check_checkpoint_output(out)
    loaded.name = str(out)
    series: list[dict] = []
    with staged_directory(out) as stage:

        def save_step(step: int, model: ToyModel) -> None:
            relative = Path("steps") / f"step-{step:06d}"
            (stage / relative).mkdir(parents=True)
            write_checkpoint_files(model, stage / relative, step=step)
            series.append({"step": step, "path": relative.as_posix()})

        result = train_toy_model(loaded, settings, on_checkpoint=save_step, description=description)
        write_checkpoint_files(loaded, stage, step=settings.steps, series=series)
    return TrainingRun(out=out, result=result, series=series, best_head=best_solution_head(loaded))
