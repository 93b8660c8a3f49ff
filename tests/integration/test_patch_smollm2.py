"""The indirect-object example of docs/patch.md on SmolLM2, against forward hooks on ``o_proj`` (sdpa attention).

The reference puts the clean run's columns ``h·64 … h·64+63`` of the ``o_proj`` input into the corrupt run
with a forward pre-hook, one plain transformers forward per head, and computes direct logit attribution by
hand through the final RMSNorm with the clean run's root mean square held fixed.
"""

from __future__ import annotations

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli

from attnviz.models.specs import load_model
from attnviz.patching import patch_heads

pytestmark = pytest.mark.slow

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"


def test_indirect_object_heads_match_forward_hooks_on_o_proj():
    loaded = load_model("smollm2", device="cpu")
    result = patch_heads(loaded, clean=CLEAN, corrupt=CORRUPT, answer=" Mary", wrong=" John")
    assert [h.label for h in result.top_heads(2)] == ["L23 H3", "L29 H1"]

    model, tokenizer = loaded.model, loaded.tokenizer
    own = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        clean_ids = tokenizer(CLEAN, return_tensors="pt")["input_ids"]
        corrupt_ids = tokenizer(CORRUPT, return_tensors="pt")["input_ids"]
        mary, john = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (" Mary", " John"))
        layers = model.model.layers
        seen: dict[int, torch.Tensor] = {}
        hooks = [
            layer.self_attn.o_proj.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0][0].clone()))
            for i, layer in enumerate(layers)
        ]
        residual = {}
        hooks.append(model.model.norm.register_forward_pre_hook(lambda m, a: residual.__setitem__("x", a[0][0, -1])))
        with torch.no_grad():
            clean_logits = model(clean_ids).logits[0, -1]
        for hook in hooks:
            hook.remove()
        with torch.no_grad():
            corrupt_logits = model(corrupt_ids).logits[0, -1]
        clean_diff = float(clean_logits[mary] - clean_logits[john])
        corrupt_diff = float(corrupt_logits[mary] - corrupt_logits[john])
        assert result.clean_logit_diff == pytest.approx(clean_diff, abs=1e-3)
        assert result.corrupt_logit_diff == pytest.approx(corrupt_diff, abs=1e-3)
        assert clean_diff == pytest.approx(6.12, abs=0.01) and corrupt_diff == pytest.approx(-5.49, abs=0.01)

        # direct logit attribution of every head, by hand
        torch.set_grad_enabled(False)  # restored in the finally clause below
        x = residual["x"].double()
        rms = torch.sqrt(x.pow(2).mean() + model.model.norm.variance_epsilon)
        gain = model.model.norm.weight.double()
        toward = (model.lm_head.weight[mary] - model.lm_head.weight[john]).double()
        for effect in result.heads:
            columns = slice(effect.head * 64, (effect.head + 1) * 64)
            weight = layers[effect.layer].self_attn.o_proj.weight[:, columns].double()
            contribution = weight @ seen[effect.layer][-1, columns].double()
            expected = float(toward @ (gain * contribution / rms))
            assert effect.direct_logit_attribution == pytest.approx(expected, abs=1e-3)

        # patching: the top five heads, one hooked forward each
        for effect in result.top_heads(5):
            columns = slice(effect.head * 64, (effect.head + 1) * 64)

            def put_clean(module, args, layer=effect.layer, columns=columns):
                merged = args[0].clone()
                merged[0, :, columns] = seen[layer][:, columns]
                return (merged,)

            hook = layers[effect.layer].self_attn.o_proj.register_forward_pre_hook(put_clean)
            with torch.no_grad():
                logits = model(corrupt_ids).logits[0, -1]
            hook.remove()
            assert effect.patched_logit_diff == pytest.approx(float(logits[mary] - logits[john]), abs=1e-3)
    finally:
        torch.set_grad_enabled(True)
        model.set_attn_implementation(own)


def test_an_answer_of_two_byte_level_tokens_is_named_in_text(capsys):
    # SmolLM2 splits " bière" into byte-level pieces "Ġbi" + "Ã¨re": the error shows them as text
    result = run_cli(capsys, "patch", "smollm2", "--clean", "Il boit une", "--corrupt", "Il mange une",
                     "--answer", " bière", "--wrong", " eau")  # fmt: skip
    assert_clean_error(result, "--answer must be one token; ' bière' is 2 tokens: '␣bi' + 'ère'")
