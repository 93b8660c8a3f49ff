"""A vision-language model's processor, also where transformers cannot build its video part.

Qwen2-VL, Qwen2.5-VL, SmolVLM and other families declare a *video processor* beside their image processor and
tokenizer. transformers' video processors need torchvision; without it ``AutoProcessor`` fails for the whole
processor, pictures included. attnviz reads pictures, never videos, so where torchvision is missing it builds the
family's own processor class without the video part (:func:`pictures_only`): the text and the pictures still go
through transformers' own code (placeholder expansion, resizing, the model's image tokens), bit for bit as with the
full processor. A video given to such a processor fails inside transformers, which attnviz never asks for.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

_VIDEO = "video_processor"


def load_processor(source: str | os.PathLike, config: Any) -> Any:
    """The processor saved in the model directory ``source`` (of a model whose config is ``config``): transformers'
    ``AutoProcessor``, or the family's processor without its video part where that part cannot be built."""
    import transformers

    processor_class = _processor_class(config)
    if processor_class is not None and _VIDEO in processor_class.get_attributes() and not _video_processors_work():
        return pictures_only(processor_class).from_pretrained(source, trust_remote_code=False, local_files_only=True)
    return transformers.AutoProcessor.from_pretrained(source, trust_remote_code=False, local_files_only=True)


def _processor_class(config: Any) -> Any:
    """transformers' processor class of ``config``'s family (None where its auto mapping names none)."""
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    name = PROCESSOR_MAPPING_NAMES.get(getattr(config, "model_type", ""))
    return getattr(transformers, name, None) if isinstance(name, str) else None


def _video_processors_work() -> bool:
    """Whether transformers can build video processors here (they need torchvision)."""
    from transformers.utils import is_torchvision_available

    return is_torchvision_available()


@cache
def pictures_only(processor_class: Any) -> Any:
    """``processor_class`` (a transformers ``ProcessorMixin``) without its video processor: loaded, built, saved
    and called on texts and pictures as the class itself is, with ``video_processor=None``. The subclass keeps
    the class's name, so a processor saved from it loads as the family's own."""

    class PicturesOnly(processor_class):
        video_processor = None
        #: while set, transformers' loading and saving see no video processor among the sub-processors
        _video_hidden = False

        @classmethod
        def get_attributes(cls) -> list[str]:
            names = processor_class.get_attributes()
            return [name for name in names if name != _VIDEO] if cls._video_hidden else names

        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == _VIDEO and argument is None:  # the one sub-processor left out
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

        @classmethod
        def _get_arguments_from_pretrained(cls, path, processor_dict=None, **kwargs) -> list[Any]:
            # the saved sub-processors in the order of the class's constructor, None where the video processor goes
            with _video_hidden(cls):
                loaded = iter(super()._get_arguments_from_pretrained(path, processor_dict, **kwargs))
            return [None if name == _VIDEO else next(loaded) for name in cls.get_attributes()]

        def to_dict(self) -> dict[str, Any]:
            with _video_hidden(type(self)):
                return super().to_dict()

        def save_pretrained(self, *args, **kwargs):
            with _video_hidden(type(self)):
                return super().save_pretrained(*args, **kwargs)

    PicturesOnly.__name__ = PicturesOnly.__qualname__ = processor_class.__name__
    PicturesOnly.__module__ = processor_class.__module__
    PicturesOnly.__doc__ = f"{processor_class.__name__} for texts and pictures, without its video processor."
    return PicturesOnly


@contextmanager
def _video_hidden(processor_class: Any) -> Iterator[None]:
    """Within it, ``processor_class`` (a :func:`pictures_only` class) lists no video processor."""
    processor_class._video_hidden = True
    try:
        yield
    finally:
        processor_class._video_hidden = False
