"""Loading a vision-language model directory (the :mod:`attnviz.models.specs` loader of its format).

The family decides the class: :class:`~attnviz.models.vlm.VisionLanguageModel` for a picture read as tokens of the
text, :class:`~attnviz.models.vlm_cross.CrossAttentionVisionLanguageModel` for one read through cross-attention
layers (Mllama).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from attnviz.common.errors import ModelSpecError
from attnviz.common.progress import quiet_third_party
from attnviz.models.placement import LoaderOptions, Loading
from attnviz.models.vlm import VisionLanguageModel
from attnviz.models.vlm_cross import CrossAttentionVisionLanguageModel
from attnviz.models.vlm_families import vision_language_family
from attnviz.models.vlm_processor import load_processor

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11


@quiet_third_party()  # transformers' loading bars off for this call only
def load_vision_language_model(source: str | os.PathLike, **options: Unpack[LoaderOptions]) -> VisionLanguageModel:
    """Load a vision-language model directory and its processor onto the attention core (see the module docstring),
    put in place as ``options`` say (:class:`~attnviz.models.placement.Loading`).

    The loader of :mod:`attnviz.models.specs` for a ``config.json`` of a family of
    :data:`~attnviz.models.vlm_families.VLM_FAMILIES`."""
    import transformers

    from attnviz.models.hf_checks import check_loading_info, first_line, quiet_image_processors, refuse_custom_code
    from attnviz.models.hf_loading import model_class_for
    from attnviz.models.vision_families import load_weights_on_core

    loading, source = Loading(**options), str(source)
    refuse_custom_code(source)
    try:
        config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=False, local_files_only=True)
    except Exception as exc:
        raise ModelSpecError(f"cannot load model {source!r}: {first_line(exc)}") from exc
    family = vision_language_family(config, source)
    try:
        with quiet_image_processors():
            processor = load_processor(source, config)
    except Exception as exc:
        raise ModelSpecError(
            f"cannot load the processor of vision-language model {source!r}: {first_line(exc)} (save it into the "
            "model directory with processor.save_pretrained(directory))"
        ) from exc
    if getattr(processor, "image_processor", None) is None or getattr(processor, "tokenizer", None) is None:
        raise ModelSpecError(
            f"the processor of vision-language model {source!r} has no image processor or no tokenizer: save the "
            "model's own processor (tokenizer and image processor) with processor.save_pretrained(directory)"
        )
    model, info = load_weights_on_core(
        model_class_for(config), source, dtype=loading.dtype, device_map=loading.device_map
    )
    check_loading_info(info, source, buffers=(buffer for buffer, _ in model.named_buffers()))
    kind = CrossAttentionVisionLanguageModel if family.cross_attention else VisionLanguageModel
    loaded = kind(loading.place(model), processor, family, name=loading.name or source)
    loaded.check_weights()
    loaded.check_layout()
    return loaded
