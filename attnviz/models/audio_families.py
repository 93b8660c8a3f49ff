"""Which audio families attnviz reads (Whisper), known from a model folder's ``config.json`` alone.

Nothing here imports torch or transformers: :mod:`attnviz.models.specs` asks it which loader a folder needs.
"""

from __future__ import annotations

from pathlib import Path

from attnviz.models.vlm_families import json_object

#: audio families attnviz reads, by model_type
AUDIO_FAMILIES = ("whisper",)


def reads_audio(model_type: str) -> bool:
    """Whether ``model_type`` is an audio family attnviz reads (Whisper)."""
    return model_type in AUDIO_FAMILIES


def is_audio_folder(path: Path) -> bool:
    """Whether the model directory ``path`` holds an audio family attnviz reads (read from its ``config.json``)."""
    return path.is_dir() and reads_audio(json_object(path / "config.json").get("model_type", ""))
