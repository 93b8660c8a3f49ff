"""What activation patching and direct logit attribution need from a Hugging Face model.

Where each head's output enters the residual stream is its output projection, found for every family by
:mod:`attnviz.models.head_outputs` (LLaMA's ``o_proj``, GPT-2's ``c_proj``, BERT's ``attention.output.dense``,
T5's ``o``, …); the final normalisation and unembedding are found by name and
checked on a probe input (:mod:`attnviz.models.readout`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnviz.common.errors import InputError, UnsupportedModelError
from attnviz.common.tokens import token_strings
from attnviz.core import AttentionSite
from attnviz.models.base import EncodedBatch
from attnviz.models.objective import has_lm_head
from attnviz.models.readout import FINAL_NORM_NAMES, Readout, readout_of

if TYPE_CHECKING:
    from attnviz.models.hf import HFModel


def check_hf_patching(loaded: HFModel) -> None:
    """Refuse what attnviz cannot patch (see :meth:`attnviz.models.base.LoadedModel.check_patching`)."""
    repeated = loaded.repeated_stacks()
    if repeated:
        raise UnsupportedModelError(
            f"{loaded.name} runs attention several times per layer in a forward pass (a shared or looped layer "
            f"as in ALBERT, or two attention modules in one layer; stack {', '.join(sorted(repeated))}): attnviz "
            "cannot patch one application's heads; capture and statistics show each application as a layer of "
            "its own"
        )
    if not has_lm_head(loaded):
        raise UnsupportedModelError(
            f"{loaded.name} has no language-model head, so it gives no logits for an answer: use a causal LM "
            "such as smollm2, an encoder checkpoint with its masked-language-model head, or an encoder-decoder "
            "model with its language-model head"
        )
    loaded.output_projections()  # UnsupportedModelError where the heads' outputs cannot be split per head


def hf_vocabulary_tokens(loaded: HFModel, text: str) -> tuple[list[int], list[str]]:
    ids = list(loaded.tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids, token_strings(loaded.tokenizer, ids)  # byte-level pieces decoded, as in every capture


def hf_answer_position(loaded: HFModel, batch: EncodedBatch, index: int) -> int:
    """The last token (causal LMs), the last decoder token (encoder-decoders) or the one mask token (encoders)
    of example ``index``."""
    length = batch.lengths[index]
    if loaded.encoder_decoder:
        return int(batch.inputs["decoder_attention_mask"][index].sum()) - 1
    if loaded.causal:
        return length - 1
    mask_id = loaded.tokenizer.mask_token_id
    if mask_id is None:
        raise InputError(f"{loaded.name}'s tokenizer has no mask token: attnviz cannot tell where its answer is read")
    ids = batch.inputs["input_ids"][index, :length].tolist()
    found = [position for position, token in enumerate(ids) if token == mask_id]
    mask_token = loaded.tokenizer.mask_token
    if len(found) != 1:
        raise InputError(
            f"an encoder reads the answer at its mask token: write {mask_token} exactly once in each prompt "
            f"(found {len(found)})"
        )
    return found[0]


def hf_head_output_weights(loaded: HFModel) -> dict[AttentionSite, tuple[Tensor, Tensor | None]]:
    """``W`` ``[width, h·dv]`` and bias of every site's output projection (:mod:`attnviz.models.head_outputs`)."""
    return {site: (found.matrix(), found.bias()) for site, found in loaded.output_projections().items()}


def hf_readout(loaded: HFModel, base: Any = None) -> Readout | None:
    """The final norm and unembedding when the logits are exactly ``W_U · norm(residual)`` (checked on a probe);
    ``base``: the module holding the final norm (default the base model; a vision-language model's language model)."""
    base = loaded.model.base_model if base is None else base
    unembedding = loaded.model.get_output_embeddings()
    for name in FINAL_NORM_NAMES:
        readout = readout_of(getattr(base, name, None), unembedding)
        if readout is None:
            continue
        batch = loaded.probe_batch()
        with torch.no_grad(), readout.recording() as record:
            logits = loaded.forward(batch, logits=True).logits  # [1, q, vocab]
        if record.residual is None:
            continue
        rebuilt = readout.norm(record.residual) @ readout.unembedding.t()  # [1, q, vocab]
        if readout.unembedding_bias is not None:
            rebuilt = rebuilt + readout.unembedding_bias
        scale = float(logits.abs().max()) or 1.0
        if rebuilt.shape == logits.shape and float((rebuilt - logits).abs().max()) <= 1e-4 * scale:
            return readout
    return None
