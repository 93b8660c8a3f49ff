"""Toy checkpoints: a directory with ``model.safetensors`` and the JSON file ``attnviz-toy.json``.

The JSON file marks the directory as a toy checkpoint (``attnviz.models.specs.load_model``
recognises it) and holds everything but the weights::

    {
      "format": "attnviz-toy", "version": 1,
      "config":    {...ToyConfig fields...},
      "tokenizer": {"symbols": ["0", "1", ...]},
      "task":      {"task": "reverse", "min_length": 3, "max_length": 8, "num_symbols": 10},
      "weights_sha256": "…",          # of model.safetensors: a damaged file is detected on load
      "step": 3000,                   # training step of these weights (null when unknown)
      "metadata": {"training": {...}, "held_out": {...}, "pruned": {...}},
      "series": [{"step": 500, "path": "steps/step-000500"}, ...]   # attnviz train --checkpoint-every
    }

Each entry of ``series`` is itself a complete toy checkpoint directory.
Directories are written next to their destination and renamed into place, so
a half-written checkpoint never replaces a good one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from attnviz.common import resources
from attnviz.common.errors import AttnvizError, ModelSpecError, OutputError
from attnviz.models.pruning_records import RecordError
from attnviz.outputs import files
from attnviz.toy.config import BYTES_PER_PARAMETER, ToyConfig
from attnviz.toy.files import FORMAT_NAME, FORMAT_VERSION, MARKER, WEIGHTS, sha256_of, write_checkpoint_files
from attnviz.toy.loaded import ToyModel
from attnviz.toy.model import ToyTransformer
from attnviz.toy.tasks import TaskSettings, get_task
from attnviz.toy.tokenizer import ToyTokenizer

# -- writing ---------------------------------------------------------------------------------------


def check_checkpoint_output(path: str | os.PathLike) -> Path:
    """Validate a checkpoint destination before any expensive work.

    It may be new, an empty directory, or an existing toy checkpoint (replaced);
    anything else raises :class:`OutputError`.
    """
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise OutputError(f"{path} is a file: give a directory name for the checkpoint")
    if path.is_dir() and any(path.iterdir()) and not (path / MARKER).is_file():
        raise OutputError(f"{path} exists and is not an attnviz toy checkpoint: choose a new or empty directory")
    files.check_output_parent(path)
    return path


@contextlib.contextmanager
def staged_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh directory that replaces the checked checkpoint destination ``path`` on success."""
    with files.staged_directory(check_checkpoint_output(path)) as stage:
        yield stage


def save_toy_model(loaded: ToyModel, path: str | os.PathLike, *, step: int | None = None) -> Path:
    """Save ``loaded`` as a toy checkpoint directory that ``attnviz.models.specs.load_model(path)`` reads back.

    Refuses to overwrite the checkpoint ``loaded`` was read from (inputs are never overwritten).
    """
    path = Path(path).expanduser()
    if loaded.source_path is not None:
        if path.resolve() == Path(loaded.source_path).resolve():
            raise OutputError(f"{path} is the checkpoint this model was loaded from: save to another directory")
        files.check_outputs([path], [loaded.source_path])
    with staged_directory(path) as stage:
        write_checkpoint_files(loaded, stage, step=step)
    return path


# -- reading ---------------------------------------------------------------------------------------------


def read_checkpoint_document(path: str | os.PathLike) -> dict[str, Any]:
    """The parsed ``attnviz-toy.json`` of a checkpoint directory (damage raises :class:`ModelSpecError`)."""
    path = Path(path).expanduser()
    marker = path / MARKER
    if not marker.is_file():
        raise ModelSpecError(
            f"{path} is not an attnviz toy checkpoint: it has no {MARKER} (write one with attnviz train)"
        )
    try:
        document = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _damaged(path, f"{MARKER} is not readable JSON ({exc})") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT_NAME:
        raise _damaged(path, f'{MARKER} does not say "format": "{FORMAT_NAME}"')
    if document.get("version") != FORMAT_VERSION:
        raise ModelSpecError(
            f"{path} is a toy checkpoint of format version {document.get('version')!r}; this attnviz reads "
            f"version {FORMAT_VERSION}: retrain it with attnviz train"
        )
    return document


def load_toy_model(
    path: str | os.PathLike,
    *,
    name: str | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> ToyModel:
    """Load a toy checkpoint directory; a missing, damaged or inconsistent one raises :class:`ModelSpecError`."""
    from safetensors.torch import load_file

    from attnviz.outputs.files import protect_inputs

    path = Path(path).expanduser()
    protect_inputs([path], "toy checkpoint")
    document = read_checkpoint_document(path)
    try:
        config = ToyConfig.from_dict(document["config"], check_memory=False)  # checked below, once consistent
        tokenizer = ToyTokenizer.from_dict(document["tokenizer"])
        settings = TaskSettings.from_dict(document["task"])
    except KeyError as exc:
        raise _damaged(path, f"{MARKER} lacks the field {exc}") from exc
    except (AttnvizError, TypeError, ValueError, AttributeError) as exc:
        raise _damaged(path, f"{MARKER} is inconsistent ({exc})") from exc
    if config.vocab_size != len(tokenizer):
        raise _damaged(path, f"the config's vocab_size {config.vocab_size} does not match the {len(tokenizer)} tokens")
    longest = get_task(settings.task).sequence_lengths(settings, config.architecture)
    if longest > config.max_positions:
        raise _damaged(
            path,
            f"its task makes sequences of {longest} tokens but the config's max_positions is {config.max_positions}",
        )
    weights = path / WEIGHTS
    if not weights.is_file():
        raise _damaged(path, f"{WEIGHTS} is missing")
    expected = document.get("weights_sha256")
    if expected is not None and sha256_of(weights) != expected:
        raise _damaged(path, f"{WEIGHTS} does not match its checksum (the file was changed or cut short)")
    _check_memory(path, config)
    try:
        state = load_file(str(weights))
    except Exception as exc:  # SafetensorError, OSError, ValueError, an unknown dtype, …
        raise _damaged(path, f"{WEIGHTS} is not a readable safetensors file ({exc})") from exc
    _check_weights_fit(path, config, state)
    model = ToyTransformer(config)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        summary = str(exc).splitlines()[0] + " " + " ".join(str(exc).split()[-12:])
        raise _damaged(path, f"the weights do not fit the config ({summary.strip()})") from exc
    model.to(device=device, dtype=dtype)
    model.eval()
    metadata = dict(document.get("metadata") or {})
    metadata["step"] = document.get("step")
    try:
        loaded = ToyModel(model, tokenizer, settings, name=name or str(path), metadata=metadata)
    except RecordError as exc:
        raise ModelSpecError(
            f"{path / MARKER}'s pruning record (metadata.pruned) does not describe the weights beside it: {exc}; "
            "prune the model again"
        ) from exc
    loaded.source_path = path
    loaded.check_weights()
    return loaded


def _check_weights_fit(path: Path, config: ToyConfig, state: dict[str, torch.Tensor]) -> None:
    """Refuse weights whose names or shapes differ from what ``config`` builds, before building it
    (the model is laid out on the meta device: no memory is allocated for it)."""
    with torch.device("meta"):
        expected = {name: tuple(tensor.shape) for name, tensor in ToyTransformer(config).state_dict().items()}
    found = {name: tuple(tensor.shape) for name, tensor in state.items()}
    if expected == found:
        return
    missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    reshaped = sorted(name for name in set(expected) & set(found) if expected[name] != found[name])
    if reshaped:
        name = reshaped[0]
        detail = f"{name} is {list(found[name])} but the config makes it {list(expected[name])}"
    elif missing:
        detail = f"the weights lack {len(missing)} tensor(s) the config makes ({missing[0]}, …)"
    else:
        detail = f"the weights hold {len(extra)} tensor(s) the config does not make ({extra[0]}, …)"
    raise _damaged(path, f"the weights do not fit the config ({detail})")


def checkpoint_series(path: str | os.PathLike) -> list[tuple[int, Path]]:
    """The ``(step, directory)`` checkpoints saved during training by ``--checkpoint-every``, by step.

    The final checkpoint itself is not in the list (its step is in ``metadata["step"]`` once loaded).
    Every entry must name a directory inside the checkpoint (symlinks followed): an absolute path or
    one that climbs out with ``..`` raises :class:`ModelSpecError`.
    """
    path = Path(path).expanduser()
    document = read_checkpoint_document(path)
    root = path.resolve()
    entries = document.get("series") or []
    if not isinstance(entries, list):
        raise _damaged(path, '"series" is not a list')
    series = []
    for entry in entries:
        try:
            step, relative = int(entry["step"]), entry["path"]
            if not isinstance(relative, str) or not relative:
                raise TypeError("path is not a string")
        except (KeyError, TypeError, ValueError) as exc:
            raise _damaged(path, f"a series entry is malformed ({entry!r})") from exc
        directory = (path / relative).resolve()
        if Path(relative).is_absolute() or root not in directory.parents:
            raise _damaged(path, f"the series entry {relative!r} points outside the checkpoint")
        series.append((step, path / relative))
    return sorted(series)


def _check_memory(path: Path, config: ToyConfig) -> None:
    """Refuse a checkpoint whose weights cannot fit in the free memory (trained on a larger machine, say).

    Its sizes are no option of the command loading it, so the message names none (the toy's
    ``require_weights_memory`` names the size to lower when ``attnviz train`` builds one).
    """
    needed = config.parameter_estimate() * BYTES_PER_PARAMETER
    available = resources.available_memory()
    if available is not None and needed > available:
        raise ModelSpecError(
            f"{path}: this toy model's weights need about {resources.format_bytes(needed)} of memory, more than the "
            f"{resources.format_bytes(available)} available: load it on a machine with more free memory"
        )


def _damaged(path: Path, what: str) -> ModelSpecError:
    return ModelSpecError(f"{path} is a damaged attnviz toy checkpoint: {what}; train it again with attnviz train")
