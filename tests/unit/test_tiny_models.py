"""The tiny models of the one factory (``tiny_models.py``) are what they claim to be."""

from __future__ import annotations

import pytest
import torch
from tiny_models import FAMILIES, INITIALIZER_FIELD, SHARPENING, TEXTS, main_output, tiny_config


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


@pytest.mark.parametrize("family", FAMILIES)
def test_sharp_variant_differs_only_in_the_spread_of_initial_weights(family):
    (plain_class, plain), (sharp_class, sharp) = tiny_config(family), tiny_config(family, sharp=True)
    assert plain_class is sharp_class
    plain, sharp = plain.to_dict(), sharp.to_dict()
    field = INITIALIZER_FIELD.get(family, "initializer_range")
    assert {key for key in plain.keys() | sharp.keys() if plain.get(key) != sharp.get(key)} == {field}
    assert sharp[field] == pytest.approx(SHARPENING * plain[field])


def test_sharp_heads_focus_where_plain_ones_spread_evenly(tiny_model_dirs, tiny_models):
    """The plain BERT's heads weigh the ~15 tokens of a text almost evenly (max ≈ 1/15); the sharp one's do not."""
    from attnviz.models.specs import load_model
    from attnviz.stats import compute_statistics

    plain = load_model(str(tiny_model_dirs["bert"]), device="cpu")
    plain_max = compute_statistics(plain, TEXTS, progress=False).matrix("max_weight")  # [layer, head]
    sharp_max = compute_statistics(tiny_models["bert"], TEXTS, progress=False).matrix("max_weight")
    assert float(plain_max.max()) < 0.07 and float(sharp_max.min()) > 0.15
