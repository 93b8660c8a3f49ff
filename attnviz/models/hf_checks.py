"""What attnviz refuses when loading a Hugging Face model, where transformers would only warn or ask."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from attnviz.common.errors import AttnvizError, ModelSpecError, UnsupportedModelError


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


#: what a model class reads first (``main_input_name``) when it reads sound: spectrogram frames (Whisper,
#: Speech2Text) or the waveform itself (wav2vec 2.0, HuBERT)
_AUDIO_INPUTS = ("input_features", "input_values")
#: the audio families attnviz reads (attnviz.models.audio)
_READ_AUDIO = ("whisper",)


#: text families whose attention attnviz cannot show as a pattern over tokens, with the reason
_REFUSED_FAMILIES = {
    "t5gemma2": "its decoder takes one softmax over its own tokens and the encoder's together (merged attention), "
    "so neither its self-attention nor its cross-attention is a pattern of its own",
    "pegasus_x": "its encoder attends within blocks and to learned global tokens, which are not tokens of the "
    "input, so its weights do not form a pattern over the input's tokens",
}


#: the vision families attnviz reads (attnviz.models.vision_families maps them), as messages name them
VISION_FAMILY_NAMES = (
    "ViT (also ViT-MSN, I-JEPA), DeiT, DINOv2 (with or without registers), CLIP and SigLIP vision towers"
)


def refuse_unreadable_family(config, model_class, source: str) -> None:
    """Refuse, naming the reason, a model whose attention attnviz cannot show over text tokens: one that reads
    audio (but Whisper), an image model of a family attnviz does not read, or LongT5 with transient-global attention (its keys include summaries of blocks, not only tokens)."""
    model_type = getattr(config, "model_type", type(config).__name__)
    reads = getattr(model_class, "main_input_name", "input_ids")
    if reads in _AUDIO_INPUTS and model_type not in _READ_AUDIO:
        raise UnsupportedModelError(
            f"model {source!r} is a {model_type} model, which reads audio ({reads}): attnviz shows the attention "
            "of text and image models, and of Whisper among audio models"
        )
    if reads == "pixel_values":  # an image model of a family attnviz does not read (those it reads never get here)
        raise UnsupportedModelError(
            f"model {source!r} is a {model_type} model, which reads images ({reads}) through an architecture "
            f"attnviz does not map onto the picture: attnviz reads {VISION_FAMILY_NAMES}"
        )
    if model_type in _REFUSED_FAMILIES:
        raise UnsupportedModelError(f"model {source!r} is a {model_type} model: {_REFUSED_FAMILIES[model_type]}")
    if model_type == "longt5" and getattr(config, "encoder_attention_type", "local") == "transient-global":
        raise UnsupportedModelError(
            f"model {source!r} is a LongT5 model with transient-global attention: its encoder attends to summaries "
            "of blocks of tokens besides the tokens themselves, so its weights do not form a pattern over the "
            "input's tokens (LongT5 with local attention is supported)"
        )


@contextlib.contextmanager
def running_on_text(model_type: str, source: str) -> Iterator[None]:
    """Turn an error inside transformers during the probe pass on a short text into one line that says so: a model
    that needs more than a text to run (X-MOD without a default language, an audio model that reads text too)."""
    try:
        yield
    except (AttnvizError, KeyboardInterrupt):
        raise
    except Exception as exc:  # the family's own code refused the input: its message says why
        raise UnsupportedModelError(
            f"model {source!r} ({model_type}) does not run on a text alone, as attnviz runs it{_why_text(model_type)}: "
            f"its code stops with {type(exc).__name__}: {first_line(exc)}"
        ) from exc


def _why_text(model_type: str) -> str:
    """Why attnviz ran a text alone: a vision-language family whose picture it does not map is read as the language
    model it holds (the families it maps read their pictures as well)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    if model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return ""
    from attnviz.models.vlm_families import SUPPORTED_VLM_NAMES

    return (
        f" (it is a vision-language model; attnviz maps the pictures of {SUPPORTED_VLM_NAMES}, and reads other such models as "
        "the language model they hold, which this one does not run as)"
    )


#: a layer's index in a weight name: ``encoder.layer.3.…``, ``model.layers.3.…``, ``h.3.…``, ``block.3.…``
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d+)\.")
#: config fields that count the layers the model builds
_LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers")
#: layer counts up to this build in seconds: a config asking for fewer is left to transformers, whose report of the
#: missing tensors names them, and a looped or shared-layer model (ALBERT, a block applied several times) that counts
#: its applications rather than its weights loads as it should
_BUILDABLE_LAYERS = 4096


def weight_names(source: str) -> list[str]:
    """Names of the tensors in a local model directory's safetensors weights (their headers only); [] if unknown."""
    folder = Path(source).expanduser()
    index = folder / "model.safetensors.index.json"
    try:
        if index.is_file():
            return list(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}))
        if (folder / "model.safetensors").is_file():
            from safetensors import safe_open

            with safe_open(str(folder / "model.safetensors"), "pt") as handle:
                return list(handle.keys())
    except Exception:  # noqa: BLE001 (damaged weights: from_pretrained says what is wrong with them)
        return []
    return []


def check_config_against_weights(config, source: str) -> None:
    """Refuse a config that asks for far more layers than the weights hold, before the model is built (building
    a hundred million layers takes hours before transformers would notice the weights are missing). A count that
    builds quickly is left to transformers' report of the missing tensors, which names them: looped models count
    more layer applications than their weights hold layers."""
    indices = {int(match.group(1)) for name in weight_names(source) if (match := _LAYER_INDEX.search(name))}
    if not indices:
        return
    held = max(indices) + 1
    for field in _LAYER_COUNTS:
        declared = getattr(config, field, None)
        if isinstance(declared, int) and not isinstance(declared, bool) and declared > max(2 * held, _BUILDABLE_LAYERS):
            raise ModelSpecError(
                f"config.json of model {source!r} says {field} = {declared}, but its weights hold {held} layers: "
                "the config and the weights disagree; give the config that came with these weights"
            )


def check_loading_info(info: dict, source: str, buffers: Iterable[str] = ()) -> None:
    """Refuse weights that leave parameters at random values, or that hold tensors the model does not have.

    transformers only logs these (``info`` is ``from_pretrained(..., output_loading_info=True)[1]``);
    tied weights it fills itself are not listed as missing. ``buffers``: the model's buffer names
    (``model.named_buffers()``); a stored copy of one (older checkpoints keep BERT's
    ``embeddings.position_ids``, which some transformers releases list as unexpected) is no foreign weight.
    """
    buffer_names = set(buffers)

    def is_buffer(key: str) -> bool:
        return any(name == key or name.endswith("." + key) or key.endswith("." + name) for name in buffer_names)

    info = {**info, "unexpected_keys": [key for key in info.get("unexpected_keys") or () if not is_buffer(str(key))]}
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


#: a weight of a pooler (``pooler.dense.weight``, ``encoder.pooler.dense.bias``): the dense layer on the class token
#: that ViT-style models add for their ``pooler_output``, read by no attention
_POOLER_WEIGHT = re.compile(r"^(?P<owner>(?:.*\.)?)pooler\.")


def drop_missing_poolers(model, info: dict) -> list[str]:
    """Build ``model`` as its checkpoint was saved when the checkpoint has no pooler weights.

    Vision checkpoints are often published without the pooler (DINO v1, ``ViTModel(config,
    add_pooling_layer=False)``); transformers then builds it with random weights and lists them as
    missing. The pooler only maps the final class token to ``pooler_output``, after every attention,
    so the module is removed (``pooler = None``, as ``add_pooling_layer=False`` builds it) and its
    weights taken off ``info["missing_keys"]``. Returns the names taken off. Missing weights anywhere
    else stay in ``info`` (and are refused by :func:`check_loading_info`).
    """
    missing = [str(key[0] if isinstance(key, tuple) else key) for key in info.get("missing_keys") or ()]
    pooler = [key for key in missing if _POOLER_WEIGHT.match(key)]
    owners = {match.group("owner").rstrip(".") for key in pooler if (match := _POOLER_WEIGHT.match(key))}
    removable = set()
    for owner_name in owners:
        try:
            owner = model.get_submodule(owner_name) if owner_name else model
        except AttributeError:
            continue
        if getattr(owner, "pooler", None) is not None:
            owner.pooler = None  # the module's forward skips a pooler that is None
            removable.add(owner_name)
    dropped = [key for key in pooler if key.rpartition("pooler.")[0].rstrip(".") in removable]
    info["missing_keys"] = [key for key in missing if key not in dropped]
    return dropped
