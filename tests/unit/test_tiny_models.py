"""The sharp tiny models of ``tiny_models.py`` are what they claim to be."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TEXTS, main_output


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_tiny_model_matches_eager_attention(tiny_dirs, tiny_models, family):
    """attnviz's core on the tiny model gives transformers' eager-attention outputs."""
    import transformers

    loaded = tiny_models[family]
    cls = type(loaded.model)
    eager = cls.from_pretrained(str(tiny_dirs[family]), attn_implementation="eager").eval()
    batch = loaded.encode(TEXTS[:3])
    ours = main_output(loaded, batch)
    with torch.no_grad():
        reference = eager(**batch.inputs)
    reference = reference.logits if hasattr(reference, "logits") else reference.last_hidden_state
    valid = batch.inputs["attention_mask"].bool()
    assert torch.allclose(ours[valid], reference[valid].double(), atol=1e-5)
    assert isinstance(eager, transformers.PreTrainedModel)


def test_tiny_llama_uses_grouped_query_attention(tiny_models):
    loaded = tiny_models["llama"]
    attention = loaded.model.model.layers[0].self_attn
    assert attention.q_proj.out_features == 8 * 8
    assert attention.k_proj.out_features == 2 * 8
    assert set(loaded.layout().values()) == {8}
