"""Full, human-readable model names for titles (``minilm`` -> ``all-MiniLM-L6-v2``)."""

from __future__ import annotations

from pathlib import Path

#: The shipped short names and the models they stand for.
KNOWN_MODELS = {"minilm": "all-MiniLM-L6-v2", "smollm2": "SmolLM2-135M-Instruct"}


def full_model_name(spec: str) -> str:
    """The model's own name for a spec: the known short names' full names, else the folder or file name."""
    spec = spec.strip()
    if spec.lower() in KNOWN_MODELS:
        return KNOWN_MODELS[spec.lower()]
    path = Path(spec.rstrip("/\\"))
    name = path.stem if path.suffix.lower() == ".gguf" else path.name
    if len(path.parts) > 1 and path.parts[-2] == "toy":  # attnviz's shipped toy checkpoints
        return f"toy {name}"
    return name or spec
