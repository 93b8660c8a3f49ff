"""Patching and norm weighting at the input of each head's real output projection, on families of every layout.

References are computed here, independently of attnviz: the output projection of each family is named by hand,
a plain forward pre-hook on it replaces one head's slice with the clean run's (patching), and norm maps are
``α_ij · ‖v_j W_O^h‖`` from transformers' eager weights and the value vectors hooked out of each family's own
value projection (fused layouts cut by hand). Tiny seeded models with peaked weights (initializer range 0.2).
"""

from __future__ import annotations

import pytest
import torch

CLEAN = "when mary and john went to the store, john gave a drink to"
CORRUPT = "when mary and john went to the store, mary gave a drink to"
ANSWER, WRONG = " mary", " john"
MASKED = (
    "mary and john went out. john gave a drink to [MASK].",
    "mary and john went out. mary gave a drink to [MASK].",
)

#: family -> (model class name, config keyword arguments, output projection of each stack, "{layer}" filled in)
FAMILIES = {
    "gpt_neo": (
        "GPTNeoForCausalLM",
        {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "attention_types": [[["global", "local"], 1]],
         "max_position_embeddings": 64, "window_size": 4},
        {"self": "transformer.h.{layer}.attn.attention.out_proj"},
    ),
    "bloom": ("BloomForCausalLM", {"hidden_size": 32, "n_layer": 2, "n_head": 4},
              {"self": "transformer.h.{layer}.self_attention.dense"}),
    "gpt_neox": ("GPTNeoXForCausalLM", {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                                         "intermediate_size": 64}, {"self": "gpt_neox.layers.{layer}.attention.dense"}),
    "phi3": ("Phi3ForCausalLM", {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "intermediate_size": 64, "pad_token_id": 0},
             {"self": "model.layers.{layer}.self_attn.o_proj"}),
    "opt": ("OPTForCausalLM", {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 64,
                               "word_embed_proj_dim": 32}, {"self": "model.decoder.layers.{layer}.self_attn.out_proj"}),
    "distilbert": ("DistilBertForMaskedLM", {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64},
                   {"self": "distilbert.transformer.layer.{layer}.attention.out_lin"}),
    "t5": ("T5ForConditionalGeneration", {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
                                           "decoder_start_token_id": 0, "pad_token_id": 0},
           {"encoder": "encoder.block.{layer}.layer.0.SelfAttention.o",
            "decoder": "decoder.block.{layer}.layer.0.SelfAttention.o",
            "cross": "decoder.block.{layer}.layer.1.EncDecAttention.o"}),
    # a sigmoid gate per head between the attention and o_proj
    "qwen3_next": ("Qwen3NextForCausalLM", {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                                             "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 64,
                                             "layer_types": ["full_attention", "full_attention"], "num_experts": 2,
                                             "num_experts_per_tok": 1, "moe_intermediate_size": 16,
                                             "shared_expert_intermediate_size": 16, "pad_token_id": 0},
                   {"self": "model.layers.{layer}.self_attn.o_proj"}),
    # a sub-norm over the heads' outputs between the attention and o_proj
    "bitnet": ("BitNetForCausalLM", {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                                     "num_key_value_heads": 2, "intermediate_size": 64, "pad_token_id": 0},
               {"self": "model.layers.{layer}.self_attn.o_proj"}),
}  # fmt: skip
INITIALIZER = {"t5": "initializer_factor", "opt": "init_std"}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    import transformers

    from attnviz.models.specs import minilm_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_path()))
    built = {}
    for family, (class_name, settings, _) in FAMILIES.items():
        model_class = getattr(transformers, class_name)
        config = model_class.config_class(vocab_size=30522, **settings)
        field = INITIALIZER.get(family, "initializer_range")
        if family != "t5":  # T5's own initialisation is already peaked (×10 saturates every softmax)
            setattr(config, field, getattr(config, field) * 10)  # peaked weights: heads focus
        torch.manual_seed(0)
        model = model_class._from_config(config, attn_implementation="eager")
        path = tmp_path_factory.mktemp(family)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        built[family] = path
    return built


def _eager(directory, family):
    import transformers

    return (
        getattr(transformers, FAMILIES[family][0]).from_pretrained(str(directory), attn_implementation="eager").eval()
    )


def _prompts(loaded):
    return (CLEAN, CORRUPT, ANSWER, WRONG) if loaded.causal or loaded.encoder_decoder else (*MASKED, "mary", "john")


def _reference_patching(model, family, pair, answer_ids, position, positions, heads, head_dim):
    """(stack, layer, head) -> logit difference of the corrupt run with that head's projection input set to the
    clean run's at ``positions`` (decoder-side stacks: every decoder position), by plain pre-hooks."""
    projections = {
        (stack, layer): model.get_submodule(name.format(layer=layer))
        for stack, name in FAMILIES[family][2].items()
        for layer in range(2)
    }
    clean_inputs = {key: value[:1] for key, value in pair.inputs.items()}
    corrupt_inputs = {key: value[1:] for key, value in pair.inputs.items()}
    recorded = {}
    hooks = [
        module.register_forward_pre_hook(lambda m, args, key=key: recorded.__setitem__(key, args[0].clone()))
        for key, module in projections.items()
    ]
    with torch.no_grad():
        model(**clean_inputs)
    for hook in hooks:
        hook.remove()
    diffs = {}
    for (stack, layer), module in projections.items():
        where = positions if stack in ("self", "encoder") else list(range(recorded[stack, layer].shape[1]))
        for head in range(heads):
            columns = slice(head * head_dim, (head + 1) * head_dim)

            def patch(m, args, key=(stack, layer), columns=columns, where=where):
                x = args[0].clone()  # [1, q, h·dv]
                x[:, where, columns] = recorded[key][:, where, columns]
                return (x,)

            hook = module.register_forward_pre_hook(patch)
            with torch.no_grad():
                logits = model(**corrupt_inputs).logits[0, position]
            hook.remove()
            diffs[stack, layer, head] = float(logits[answer_ids[0]] - logits[answer_ids[1]])
    return diffs


@pytest.mark.parametrize(
    "family", ["gpt_neo", "bloom", "gpt_neox", "phi3", "opt", "distilbert", "t5", "qwen3_next", "bitnet"]
)
def test_patched_heads_equal_a_pre_hook_on_the_output_projection(family_dirs, family):
    import attnviz

    loaded = attnviz.load_model(str(family_dirs[family]))
    clean, corrupt, answer, wrong = _prompts(loaded)
    result = attnviz.patch_heads(loaded, clean=clean, corrupt=corrupt, answer=answer, wrong=wrong)
    pair = loaded.encode([clean, corrupt])
    ids = (loaded.vocabulary_tokens(answer)[0][0], loaded.vocabulary_tokens(wrong)[0][0])
    reference = _reference_patching(
        _eager(family_dirs[family], family), family, pair, ids, result.position, result.positions, 4, 8
    )
    ours = {(effect.stack, effect.layer, effect.head): effect.patched_logit_diff for effect in result.heads}
    assert set(ours) == set(reference)
    assert max(abs(ours[key] - reference[key]) for key in ours) <= 1e-4, family
    spread = max(reference.values()) - min(reference.values())
    assert spread > 1e-3, family  # the heads differ: the comparison is not vacuous


def _values(model, family, batch):
    """(stack, layer) -> ``[b, k, h, d]`` value vectors from each family's own value projection, and the eager
    weights ``[b, h, q, k]`` by the same key."""
    hooked = {}
    if family == "gpt_neo":
        modules = {("self", n): (layer.attn.attention.v_proj, None) for n, layer in enumerate(model.transformer.h)}
    elif family == "bloom":  # fused [h, 3, d]: query, key, value per head
        modules = {("self", n): (layer.self_attention.query_key_value, "bloom")
                   for n, layer in enumerate(model.transformer.h)}  # fmt: skip
    elif family == "opt":
        modules = {("self", n): (layer.self_attn.v_proj, None) for n, layer in enumerate(model.model.decoder.layers)}
    else:  # t5
        modules = {
            ("encoder", n): (block.layer[0].SelfAttention.v, None) for n, block in enumerate(model.encoder.block)
        }
        modules.update({("decoder", n): (b.layer[0].SelfAttention.v, None) for n, b in enumerate(model.decoder.block)})
        modules.update({("cross", n): (b.layer[1].EncDecAttention.v, None) for n, b in enumerate(model.decoder.block)})
    hooks = [
        module.register_forward_hook(lambda m, i, out, key=key: hooked.__setitem__(key, out))
        for key, (module, _) in modules.items()
    ]
    with torch.no_grad():
        outputs = model(**batch.inputs, output_attentions=True)
    for hook in hooks:
        hook.remove()
    values = {}
    for key, (_, layout) in modules.items():
        out = hooked[key]
        b, k, _ = out.shape
        values[key] = out.view(b, k, 4, 3, 8)[..., 2, :] if layout == "bloom" else out.view(b, k, 4, 8)
    if family == "t5":
        weights = {("encoder", n): a for n, a in enumerate(outputs.encoder_attentions)}
        weights.update({("decoder", n): a for n, a in enumerate(outputs.decoder_attentions)})
        weights.update({("cross", n): a for n, a in enumerate(outputs.cross_attentions)})
    else:
        weights = {("self", n): a for n, a in enumerate(outputs.attentions)}
    return values, weights


@pytest.mark.parametrize("family", ["gpt_neo", "bloom", "opt", "t5"])
def test_norm_maps_equal_weights_times_the_norm_of_each_value_through_its_head_slice(family_dirs, family):
    from attnviz.captures.attention_capture import capture_batch

    loaded = attnviz_load(family_dirs[family])
    texts = ["the cat sat on the mat."]
    targets = ["a cat sat"] if loaded.encoder_decoder else None
    capture = capture_batch(loaded, texts, weighting="norm", targets=targets)[0]
    model = _eager(family_dirs[family], family)
    values, weights = _values(model, family, loaded.encode(texts, targets=targets))
    for (stack, layer), value in values.items():
        name = FAMILIES[family][2][stack].format(layer=layer)
        w_o = model.get_submodule(name).weight.detach()  # [hidden, h·d]
        slices = w_o.t().reshape(4, 8, -1)  # [h, d, hidden]
        norms = torch.einsum("bkhd,hdw->bhkw", value, slices).norm(dim=-1)  # [b, h, k]
        expected = weights[stack, layer][0] * norms[0][:, None, :]  # [h, q, k]
        ours = capture.layer(layer, stack)  # [h, q, k]
        scale = float(expected.abs().max())
        assert torch.allclose(ours, expected, rtol=1e-5, atol=1e-5 * scale), (family, stack, layer)


def attnviz_load(directory):
    import attnviz

    return attnviz.load_model(str(directory))


def test_norm_weighting_refuses_a_gated_model_by_name_and_pattern_patching_an_eager_only_one(family_dirs):
    import attnviz
    from attnviz.captures.attention_capture import capture_batch
    from attnviz.common.errors import UnsupportedModelError

    gated = attnviz_load(family_dirs["qwen3_next"])
    with pytest.raises(UnsupportedModelError, match=r"o_proj\) sits a query-dependent change.*norm-based weighting"):
        capture_batch(gated, ["the cat sat."], weighting="norm")
    with pytest.raises(
        UnsupportedModelError, match=r"sits something that changes each head's output \(.*attn_sub_norm"
    ):
        capture_batch(attnviz_load(family_dirs["bitnet"]), ["the cat sat."], weighting="norm")
    eager_only = attnviz_load(family_dirs["gpt_neo"])
    with pytest.raises(UnsupportedModelError, match="eager code.*cannot replace its patterns") as refused:
        attnviz.patch_heads(eager_only, clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, patched="pattern")
    assert "physically prune" not in str(refused.value)


#: vision family -> (value projection, output projection) of layer {layer}; SigLIP runs on eager attention
VISION = {
    "vit": ("vit.layers.{layer}.attention.v_proj", "vit.layers.{layer}.attention.o_proj"),
    "clip": ("encoder.layers.{layer}.self_attn.v_proj", "encoder.layers.{layer}.self_attn.out_proj"),
    "siglip": ("encoder.layers.{layer}.self_attn.v_proj", "encoder.layers.{layer}.self_attn.out_proj"),
}


@pytest.mark.parametrize("family", sorted(VISION))
def test_norm_maps_of_a_vision_tower_equal_the_hand_computation(tmp_path, family):
    import transformers
    from tiny_vision import build_tiny_vision_model, sample_images

    from attnviz.captures.attention_capture import capture_encoded

    directory = build_tiny_vision_model(family, tmp_path / family)
    loaded = attnviz_load(directory)
    batch = loaded.encode_images(sample_images(1))
    capture = capture_encoded(loaded, batch, weighting="norm")[0]
    model = transformers.AutoModel.from_pretrained(str(directory), attn_implementation="eager").eval()
    if family == "vit":
        model = transformers.ViTForImageClassification.from_pretrained(str(directory), attn_implementation="eager")
    hooked = {}
    value_name, output_name = VISION[family]
    hooks = [
        model.get_submodule(value_name.format(layer=layer)).register_forward_hook(
            lambda m, i, out, layer=layer: hooked.__setitem__(layer, out)  # [1, k, h·d]
        )
        for layer in range(2)
    ]
    with torch.no_grad():
        attentions = model(pixel_values=batch.inputs["pixel_values"], output_attentions=True).attentions
    for hook in hooks:
        hook.remove()
    for layer in range(2):
        value = hooked[layer].view(1, -1, 4, 8)  # [1, k, h, d]
        slices = model.get_submodule(output_name.format(layer=layer)).weight.detach().t().reshape(4, 8, -1)
        norms = torch.einsum("bkhd,hdw->bhkw", value, slices).norm(dim=-1)[0]  # [h, k]
        expected = attentions[layer][0] * norms[:, None, :]  # [h, q, k]
        scale = float(expected.abs().max())
        assert torch.allclose(capture.layer(layer), expected, rtol=1e-5, atol=1e-5 * scale), (family, layer)
