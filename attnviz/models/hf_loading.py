"""Reading a Hugging Face model's weights onto attnviz's attention core (:func:`load_hf_weights`), and the
transformers class a config names (:func:`model_class_for`); :func:`attnviz.models.hf.load_hf_model` builds on them."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from attnviz.common.errors import ModelSpecError
from attnviz.core import ATTENTION_NAME
from attnviz.models.hf_checks import first_line


def model_class_for(config):
    """The transformers class named by the config's ``architectures`` (so LM heads load too)."""
    import transformers

    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    if getattr(config, "is_encoder_decoder", False):
        return transformers.AutoModelForSeq2SeqLM
    return transformers.AutoModel


def load_hf_weights(cls: Any, source: str, *, dtype: torch.dtype, extra: dict[str, Any], placement: dict) -> tuple:
    """``(model, loading info, fallback)``: ``cls.from_pretrained`` on attnviz's attention core, or, for a family with
    its own attention classes that rejects the name, on ``eager`` attention (``fallback`` True). ``extra`` and
    ``placement``: more ``from_pretrained`` arguments. Any failure is one :class:`ModelSpecError` naming ``source``."""
    fallback = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns on foreign pickles; the error below says what matters
        try:
            try:
                model, info = cls.from_pretrained(
                    source,
                    attn_implementation=ATTENTION_NAME,
                    dtype=dtype,
                    output_loading_info=True,
                    **extra,
                    **placement,
                )
            except (ValueError, KeyError) as exc:
                # Families with their own attention classes (gpt_neo, bloom, falcon, …) reject the name.
                if isinstance(exc, ValueError) and "attention" not in str(exc).lower():
                    raise
                fallback = True
                model, info = cls.from_pretrained(
                    source, attn_implementation="eager", dtype=dtype, output_loading_info=True, **extra, **placement
                )
        except Exception as exc:  # safetensors header damage, a refused pickle, a truncated file, …
            if "Weights only load failed" in str(exc):
                raise ModelSpecError(
                    f"the pickled weights of model {source!r} hold objects other than tensors, which attnviz refuses "
                    "to unpickle (they could run code): convert the checkpoint to safetensors"
                ) from exc
            if "ignore_mismatched_sizes" in str(exc):  # transformers points at a report it only logs
                raise ModelSpecError(
                    f"the weights of model {source!r} do not fit its config.json: tensors have other shapes than the "
                    "config describes; give the config that came with these weights"
                ) from exc
            raise ModelSpecError(f"cannot load the weights of model {source!r}: {first_line(exc)}") from exc
    return model, info, fallback


def switch_to_eager(model: Any) -> None:
    """Eager attention for a family that accepted attnviz's name but does not call the interface. Some (BLOOM)
    ignore ``set_attn_implementation``; their configs must still say eager, or their masks would be built by
    attnviz's mask function, which leaves the plain causal triangle to the core."""
    model.set_attn_implementation("eager")
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "_attn_implementation", "eager") != "eager":
            config._attn_implementation = "eager"  # type: ignore[union-attr]
