"""The files of a toy checkpoint, and writing them (the format is described in :mod:`attnviz.toy.checkpoint`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from attnviz.models.base import TOY_MARKER

if TYPE_CHECKING:  # ToyModel saves itself through this module
    from attnviz.toy.loaded import ToyModel

MARKER = TOY_MARKER
WEIGHTS = "model.safetensors"
FORMAT_NAME = "attnviz-toy"
FORMAT_VERSION = 1


def write_checkpoint_files(
    loaded: ToyModel, directory: Path, *, step: int | None = None, series: list[dict] | None = None
) -> None:
    """Write weights and JSON of ``loaded`` into an existing ``directory``.

    Not atomic by itself: :func:`attnviz.toy.checkpoint.save_toy_model`, training and pruning call it on a staged directory.
    """
    from safetensors.torch import save_file

    state = {name: tensor.detach().to("cpu").contiguous() for name, tensor in loaded.model.state_dict().items()}
    weights = directory / WEIGHTS
    save_file(state, str(weights), metadata={"format": FORMAT_NAME})
    document = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "config": loaded.config.to_dict(),
        "tokenizer": loaded.tokenizer.to_dict(),
        "task": loaded.task_settings.to_dict(),
        "weights_sha256": sha256_of(weights),
        "step": step if step is not None else loaded.metadata.get("step"),
        "metadata": {k: v for k, v in loaded.metadata.items() if k != "step"},
        "series": series or [],
    }
    (directory / MARKER).write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file (the weights' checksum in the marker)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()
