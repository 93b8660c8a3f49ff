"""What attnviz refuses when loading a Hugging Face model, where transformers would only warn or ask."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from attnviz.common.errors import ModelSpecError


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (its type when it has none)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def refuse_custom_code(source: str) -> None:
    """Refuse a local model directory whose config or tokenizer config points at Python code it ships."""
    folder = Path(source).expanduser()
    if not folder.is_dir():
        return
    for name in ("config.json", "tokenizer_config.json"):
        try:
            document = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # missing or damaged: transformers reports it below
        if isinstance(document, dict) and document.get("auto_map"):
            raise ModelSpecError(
                f"model {source!r} needs custom code shipped with it ('auto_map' in {name}): attnviz does not run "
                "code from a model folder; use a model that transformers supports natively"
            )


def check_loading_info(info: dict, source: str) -> None:
    """Refuse weights that leave parameters at random values, or that hold tensors the model does not have.

    transformers only logs these (``info`` is ``from_pretrained(..., output_loading_info=True)[1]``);
    tied weights it fills itself are not listed as missing.
    """
    for key, what, advice in (
        ("missing_keys", "lack {n} tensor(s) the model needs", "those would be random"),
        ("unexpected_keys", "hold {n} tensor(s) the model does not have", "they are not this model's weights"),
        ("mismatched_keys", "have {n} tensor(s) of the wrong shape", "they do not fit its config"),
    ):
        names = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get(key) or ())
        if names:
            shown = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
            raise ModelSpecError(
                f"the weights of model {source!r} {what.format(n=len(names))} ({shown}): {advice}; "
                "give a complete checkpoint"
            )
    errors = info.get("error_msgs") or []
    if errors:
        raise ModelSpecError(f"the weights of model {source!r} do not load: {first_line(Exception(errors[0]))}")


def quiet_transformers() -> None:
    """transformers' own progress bars and info logs would clutter attnviz's stderr."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


@contextlib.contextmanager
def quiet_image_processors() -> Iterator[None]:
    """Silence transformers' "requires torchvision … falling back to the Pil processor" notice (the Pillow
    processors are what attnviz uses), restoring the logger afterwards."""
    from transformers.utils import logging

    previous = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(previous)
