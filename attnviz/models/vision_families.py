"""Which vision families attnviz reads (or refuses, by name), and loading what every image model needs besides its
class: the image processor, the weights on attnviz's attention core, and the toy image task a checkpoint records.

Shared by :mod:`attnviz.models.vision` (vision transformers), :mod:`attnviz.models.caption` (captioners) and
:mod:`attnviz.models.pruned` (their pruned checkpoints).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from attnviz.common.errors import ModelSpecError, UnsupportedModelError
from attnviz.models.hf_checks import VISION_FAMILY_NAMES, quiet_image_processors
from attnviz.models.placement import Placement

#: model_type -> the kinds of the extra tokens before the patches (read from the config)
VISION_FAMILIES: dict[str, Callable[[Any], tuple[str, ...]]] = {
    "vit": lambda config: ("cls",),
    "deit": lambda config: ("cls", "distillation"),
    "dinov2": lambda config: ("cls",),
    "vit_msn": lambda config: ("cls",),  # ViT weights trained by masked siamese networks
    "ijepa": lambda config: (),  # I-JEPA's ViT has no class token
    "dinov2_with_registers": lambda config: ("cls",) + ("register",) * int(config.num_register_tokens),
    "clip_vision_model": lambda config: ("cls",),
    "siglip_vision_model": lambda config: (),
    "clip": lambda config: ("cls",),  # a whole CLIP checkpoint: its vision tower is read
    "siglip": lambda config: (),
}
#: whole image-text checkpoints whose vision tower attnviz reads: model_type -> (class name, weight prefix)
VISION_TOWERS = {"clip": ("CLIPVisionModel", "vision_model."), "siglip": ("SiglipVisionModel", "vision_model.")}
#: vision families attnviz refuses, by model_type, with the reason
REFUSED_VISION = {
    "swin": "Swin attends within shifted windows, so its patterns are per window, not over the image",
    "swinv2": "Swin V2 attends within shifted windows, so its patterns are per window, not over the image",
    "donut-swin": "Donut's Swin encoder attends within shifted windows, not over the whole image",
    "maskformer-swin": "MaskFormer's Swin backbone attends within shifted windows, not over the whole image",
    "swin2sr": "Swin2SR attends within shifted windows, not over the whole image",
    "vitdet": "ViTDet attends within windows in most layers, not over the whole image",
    "hiera": "Hiera attends within mask units, not over the whole image",
    "vit_mae": "ViT-MAE drops a random three quarters of the patches before attention",
    "beit": "BEiT adds a relative position bias that attnviz's core does not receive",
    "data2vec-vision": "Data2Vec-Vision adds a relative position bias that attnviz's core does not receive",
}


def is_vision_type(model_type: str) -> bool:
    """Whether ``model_type`` is a vision family attnviz reads or refuses by name."""
    return model_type in VISION_FAMILIES or model_type in REFUSED_VISION


def check_vision_family(model_type: str, source: str) -> None:
    """Refuse, by name, a vision family whose attention attnviz cannot show (before anything is loaded)."""
    reason = REFUSED_VISION.get(model_type)
    if reason is not None:
        raise UnsupportedModelError(
            f"model {source!r} is a {model_type} model, which attnviz cannot show: {reason}. "
            f"attnviz reads {VISION_FAMILY_NAMES}"
        )


def load_image_processor(source: str):
    """The model's image processor, from its ``preprocessor_config.json``; a clear error without one."""
    import transformers

    folder = Path(source).expanduser()
    if folder.is_dir() and not (folder / "preprocessor_config.json").is_file():
        raise ModelSpecError(
            f"vision model {source!r} has no preprocessor_config.json (its image processor), so attnviz cannot tell "
            "how to resize and normalise images for it: save it with image_processor.save_pretrained(directory)"
        )
    try:
        with quiet_image_processors():
            return transformers.AutoImageProcessor.from_pretrained(
                source, trust_remote_code=False, local_files_only=True
            )
    except Exception as exc:
        raise ModelSpecError(f"cannot load the image processor of model {source!r}: {exc}") from exc


def load_weights_on_core(
    cls: Any, source: str, *, dtype: torch.dtype, device_map: Placement | None = None, **extra: Any
) -> tuple[Any, dict]:
    """``(model, loading info)``: ``cls.from_pretrained`` with attnviz's attention, never running shipped code;
    ``extra``: more ``from_pretrained`` arguments. Any failure is one :class:`ModelSpecError` naming ``source``."""
    import warnings

    from attnviz.core import ATTENTION_NAME, register_attention
    from attnviz.models.hf_checks import first_line

    register_attention()
    placement = device_map.from_pretrained_arguments() if device_map else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return cls.from_pretrained(
                source,
                attn_implementation=ATTENTION_NAME,
                dtype=dtype,
                output_loading_info=True,
                trust_remote_code=False,
                **extra,
                **placement,
            )
        except Exception as exc:  # damaged weights, a refused pickle, a config the class rejects, …
            raise ModelSpecError(f"cannot load the weights of model {source!r}: {first_line(exc)}") from exc


#: toy image task -> ``"module:function"`` drawing ``count`` examples of it with a seed (``own_images``)
IMAGE_TASK_EXAMPLES = {
    "odd-patch": "attnviz.toy.odd_patch:task_images",
    "caption": "attnviz.toy.caption:task_images",
}


def image_task_of(source: str) -> str | None:
    """The toy image task recorded in a checkpoint directory (see :mod:`attnviz.toy.odd_patch`), if any."""
    import json

    from attnviz.models.base import IMAGE_TASK_FILE

    try:
        document = json.loads((Path(source).expanduser() / IMAGE_TASK_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    task = document.get("task") if isinstance(document, dict) else None
    return task if isinstance(task, str) and task in IMAGE_TASK_EXAMPLES else None
