"""Activation patching, ablation and direct logit attribution against an independent computation.

The reference is plain transformers (eager attention) with forward pre-hooks on the attention output
projection (LLaMA's ``o_proj``, GPT-2's ``c_proj``): its input is ``[b, q, heads × head_dim]``, head ``h`` in
columns ``h·d … h·d+d−1``. One reference run per head, unbatched; attnviz batches its runs through the core.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from attnviz.common.errors import InputError, ParameterError, UnsupportedModelError
from attnviz.patching import patch_heads

CLEAN = "when mary and john went to the store, john gave a drink to"
CORRUPT = "when mary and john went to the store, mary gave a drink to"
ANSWER, WRONG = " mary", " john"
OUTPUT_NAME = {"llama": "o_proj", "gpt2": "c_proj"}


def reference_model(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    return model, tokenizer


def attention_modules(model, family):
    layers = model.model.layers if family == "llama" else model.transformer.h
    return [layer.self_attn if family == "llama" else layer.attn for layer in layers]


def merged_inputs(model, family, ids):
    """Every layer's input of the output projection, ``[q, h·d]``, and the logits ``[q, vocab]``."""
    seen = {}
    handles = [
        getattr(module, OUTPUT_NAME[family]).register_forward_pre_hook(
            lambda m, args, layer=layer: seen.__setitem__(layer, args[0][0].clone())
        )
        for layer, module in enumerate(attention_modules(model, family))
    ]
    with torch.no_grad():
        logits = model(ids).logits[0]
    for handle in handles:
        handle.remove()
    return seen, logits


def patched_logits(model, family, ids, layer, head, head_dim, values, positions):
    """Logits ``[q, vocab]`` with head ``head`` of ``layer`` given ``values`` ``[q, d]`` at ``positions``."""

    def replace(module, args):
        merged = args[0].clone()
        columns = slice(head * head_dim, (head + 1) * head_dim)
        merged[0, positions, columns] = values[positions]
        return (merged,)

    module = getattr(attention_modules(model, family)[layer], OUTPUT_NAME[family])
    handle = module.register_forward_pre_hook(replace)
    with torch.no_grad():
        logits = model(ids).logits[0]
    handle.remove()
    return logits


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_patched_logit_differences_equal_forward_hooks_on_the_output_projection(
    tiny_dirs, tiny_models, family, direction
):
    loaded = tiny_models[family]
    result = patch_heads(
        loaded, clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, direction=direction, batch_size=5
    )
    model, tokenizer = reference_model(tiny_dirs[family])
    clean_ids = tokenizer(CLEAN, return_tensors="pt")["input_ids"]
    corrupt_ids = tokenizer(CORRUPT, return_tensors="pt")["input_ids"]
    answer, wrong = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (ANSWER, WRONG))
    clean_heads, clean_logits = merged_inputs(model, family, clean_ids)
    corrupt_heads, corrupt_logits = merged_inputs(model, family, corrupt_ids)
    last = clean_ids.shape[1] - 1
    clean_diff = float(clean_logits[last, answer] - clean_logits[last, wrong])
    corrupt_diff = float(corrupt_logits[last, answer] - corrupt_logits[last, wrong])
    assert result.clean_logit_diff == pytest.approx(clean_diff, abs=1e-5)
    assert result.corrupt_logit_diff == pytest.approx(corrupt_diff, abs=1e-5)

    heads = model.config.num_attention_heads
    head_dim = clean_heads[0].shape[1] // heads
    base_ids, source = (corrupt_ids, clean_heads) if direction == "denoising" else (clean_ids, corrupt_heads)
    reference = corrupt_diff if direction == "denoising" else clean_diff
    assert [(h.layer, h.head) for h in result.heads] == [(l, h) for l in range(2) for h in range(heads)]
    everywhere = list(range(clean_ids.shape[1]))
    for effect in result.heads:
        values = source[effect.layer][:, effect.head * head_dim : (effect.head + 1) * head_dim]
        logits = patched_logits(model, family, base_ids, effect.layer, effect.head, head_dim, values, everywhere)
        expected = float(logits[last, answer] - logits[last, wrong])
        assert effect.patched_logit_diff == pytest.approx(expected, abs=1e-5)
        assert effect.normalized_effect == pytest.approx((expected - reference) / (clean_diff - corrupt_diff), abs=1e-4)
    # the patches are not all alike: some heads move the answer, so the comparison above is not vacuous
    assert max(abs(h.patched_logit_diff - reference) for h in result.heads) > 1e-3


def test_one_position_and_ablation_equal_forward_hooks(tiny_dirs, tiny_models):
    family = "llama"
    loaded = tiny_models[family]
    result = patch_heads(loaded, clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, positions=3, ablate="zero")
    model, tokenizer = reference_model(tiny_dirs[family])
    clean_ids = tokenizer(CLEAN, return_tensors="pt")["input_ids"]
    corrupt_ids = tokenizer(CORRUPT, return_tensors="pt")["input_ids"]
    answer, wrong = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (ANSWER, WRONG))
    clean_heads, _ = merged_inputs(model, family, clean_ids)
    last = clean_ids.shape[1] - 1
    head_dim = model.config.head_dim
    for effect in result.heads:
        columns = slice(effect.head * head_dim, (effect.head + 1) * head_dim)
        logits = patched_logits(
            model, family, corrupt_ids, effect.layer, effect.head, head_dim, clean_heads[effect.layer][:, columns], [3]
        )
        assert effect.patched_logit_diff == pytest.approx(float(logits[last, answer] - logits[last, wrong]), abs=1e-5)
        zeros = torch.zeros(clean_ids.shape[1], head_dim)
        ablated = patched_logits(
            model, family, clean_ids, effect.layer, effect.head, head_dim, zeros, list(range(clean_ids.shape[1]))
        )
        expected = float(ablated[last, answer] - ablated[last, wrong]) - result.clean_logit_diff
        assert effect.ablation_effect == pytest.approx(expected, abs=1e-5)


def frozen_norm(model, family, parts, residual):
    """The final norm with the clean run's scale held fixed, without its bias (hand-written per family)."""
    if family == "llama":
        rms = torch.sqrt(residual.pow(2).mean() + model.model.norm.variance_epsilon)
        return model.model.norm.weight * parts / rms
    norm = model.transformer.ln_f
    centred = residual - residual.mean()
    std = torch.sqrt(centred.pow(2).mean() + norm.eps)
    return norm.weight * (parts - parts.mean(-1, keepdim=True)) / std


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_attributions_of_every_head_and_component_add_up_to_the_clean_logit_difference(tiny_dirs, tiny_models, family):
    result = patch_heads(tiny_models[family], clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG)
    model, tokenizer = reference_model(tiny_dirs[family])
    model.double()
    ids = tokenizer(CLEAN, return_tensors="pt")["input_ids"]
    answer, wrong = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (ANSWER, WRONG))
    last = ids.shape[1] - 1
    seen: dict = {"attention": [], "mlp": [], "merged": []}
    modules = attention_modules(model, family)
    layers = model.model.layers if family == "llama" else model.transformer.h
    hooks = []
    for layer, module in enumerate(modules):
        projection = getattr(module, OUTPUT_NAME[family])
        hooks.append(projection.register_forward_pre_hook(lambda m, a: seen["merged"].append(a[0][0, last])))
        hooks.append(projection.register_forward_hook(lambda m, a, out: seen["attention"].append(out[0, last])))
        hooks.append(layers[layer].mlp.register_forward_hook(lambda m, a, out: seen["mlp"].append(out[0, last])))
    with torch.no_grad():
        outputs = model(ids, output_hidden_states=True)
    for hook in hooks:
        hook.remove()
    embeddings = outputs.hidden_states[0][0, last]
    residual = embeddings + sum(seen["attention"]) + sum(seen["mlp"])
    unembedding = model.get_output_embeddings().weight
    toward = unembedding[answer] - unembedding[wrong]

    def attribution(part):
        with torch.no_grad():
            return float(toward @ frozen_norm(model, family, part, residual))

    heads = model.config.num_attention_heads
    head_dim = seen["merged"][0].shape[0] // heads
    other = attribution(embeddings) + sum(attribution(mlp) for mlp in seen["mlp"])
    for layer, module in enumerate(modules):
        projection = getattr(module, OUTPUT_NAME[family])
        weight = projection.weight.t() if family == "gpt2" else projection.weight  # [width, h·d]
        if projection.bias is not None:
            other += attribution(projection.bias)
        for head in range(heads):
            columns = slice(head * head_dim, (head + 1) * head_dim)
            expected = attribution(weight[:, columns] @ seen["merged"][layer][columns])
            found = result.heads[layer * heads + head].direct_logit_attribution
            assert found == pytest.approx(expected, abs=1e-5)
    if family == "gpt2":
        other += float(toward @ model.transformer.ln_f.bias)
    total = sum(h.direct_logit_attribution for h in result.heads) + other
    assert total == pytest.approx(result.clean_logit_diff, abs=1e-4)
    assert float(outputs.logits[0, last, answer] - outputs.logits[0, last, wrong]) == pytest.approx(total, abs=1e-6)


def test_pattern_patching_equals_a_reference_attention_with_the_clean_pattern(tiny_dirs, tiny_models):
    """Pattern patching on GQA LLaMA against transformers' eager attention with one head's rows replaced."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import repeat_kv

    loaded = tiny_models["llama"]
    result = patch_heads(loaded, clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, patched="pattern")
    model, tokenizer = reference_model(tiny_dirs["llama"])
    clean_ids = tokenizer(CLEAN, return_tensors="pt")["input_ids"]
    corrupt_ids = tokenizer(CORRUPT, return_tensors="pt")["input_ids"]
    answer, wrong = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (ANSWER, WRONG))
    with torch.no_grad():
        clean_patterns = model(clean_ids, output_attentions=True).attentions  # per layer [1, h, q, k]
    target = {}

    def attention(module, query, key, value, mask, scaling=None, dropout=0.0, **kwargs):
        key = repeat_kv(key, query.shape[1] // key.shape[1])
        value = repeat_kv(value, query.shape[1] // value.shape[1])
        scores = query @ key.transpose(2, 3) * scaling + mask[:, :, :, : key.shape[-2]]
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        if module.layer_idx == target["layer"]:
            weights = weights.clone()
            weights[:, target["head"]] = clean_patterns[target["layer"]][:, target["head"]]
        return (weights @ value).transpose(1, 2).contiguous(), weights

    AttentionInterface.register("patch_reference", attention)
    transformers.AttentionMaskInterface.register("patch_reference", transformers.masking_utils.eager_mask)
    model.set_attn_implementation("patch_reference")
    last = clean_ids.shape[1] - 1
    for effect in result.heads:
        target.update(layer=effect.layer, head=effect.head)
        with torch.no_grad():
            logits = model(corrupt_ids).logits[0]
        assert effect.patched_logit_diff == pytest.approx(float(logits[last, answer] - logits[last, wrong]), abs=1e-5)


def test_bad_inputs_raise_one_typed_error(tiny_models, tiny_model_dirs):
    loaded = tiny_models["llama"]
    with pytest.raises(ParameterError, match=r"'marygold' is 3 tokens: 'mary' \+ '##go' \+ '##ld'|is \d+ tokens"):
        patch_heads(loaded, clean=CLEAN, corrupt=CORRUPT, answer=" marygold", wrong=WRONG)
    with pytest.raises(InputError, match="has 16 tokens and the corrupt prompt 17"):
        patch_heads(loaded, clean=CLEAN, corrupt=CORRUPT.replace("mary gave", "mary then gave"), answer=ANSWER,
                    wrong=WRONG)  # fmt: skip
    with pytest.raises(InputError, match="same logit difference"):
        patch_heads(loaded, clean=CLEAN, corrupt=CLEAN, answer=ANSWER, wrong=WRONG)
    with pytest.raises(ParameterError, match="outside the prompt"):
        patch_heads(loaded, clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, positions=99)
    with pytest.raises(ParameterError, match="mean ablation needs a corpus"):
        patch_heads(loaded, clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, ablate="mean")
    with pytest.raises(UnsupportedModelError, match="no language-model head"):
        patch_heads(tiny_models["bert"], clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG)


def test_mean_ablation_replaces_each_head_by_its_mean_output_over_the_corpus(tiny_dirs, tiny_models):
    texts = ["the cat sat on the mat.", "a dog ran through the park and barked."]
    family = "gpt2"
    result = patch_heads(
        tiny_models[family], clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, ablate="mean", texts=texts
    )
    model, tokenizer = reference_model(tiny_dirs[family])
    merged = [merged_inputs(model, family, tokenizer(text, return_tensors="pt")["input_ids"])[0] for text in texts]
    count = sum(m[0].shape[0] for m in merged)
    assert f"mean output over {count} positions of 2 texts" in result.ablation_source
    clean_ids = tokenizer(CLEAN, return_tensors="pt")["input_ids"]
    answer, wrong = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (ANSWER, WRONG))
    last, head_dim = clean_ids.shape[1] - 1, 8
    everywhere = list(range(clean_ids.shape[1]))
    for effect in result.heads:
        columns = slice(effect.head * head_dim, (effect.head + 1) * head_dim)
        mean = torch.cat([m[effect.layer][:, columns] for m in merged]).mean(0)  # [d]
        values = mean.expand(clean_ids.shape[1], head_dim)
        logits = patched_logits(model, family, clean_ids, effect.layer, effect.head, head_dim, values, everywhere)
        expected = float(logits[last, answer] - logits[last, wrong]) - result.clean_logit_diff
        assert effect.ablation_effect == pytest.approx(expected, abs=1e-5)


def test_an_encoder_reads_the_answer_at_its_mask_token(tmp_path):
    """BERT with its masked-LM head: patched logit differences at [MASK] equal hooks on ``attention.output.dense``."""
    from tiny_models import tiny_config

    from attnviz.models.specs import load_model, minilm_path

    _, config = tiny_config("bert", sharp=True)
    torch.manual_seed(0)
    transformers.BertForMaskedLM._from_config(config, attn_implementation="eager").save_pretrained(tmp_path)
    transformers.AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(tmp_path)
    clean, corrupt = (
        "mary and john went out. john gave a drink to [MASK].",
        "mary and john went out. mary gave a drink to [MASK].",
    )
    result = patch_heads(load_model(str(tmp_path)), clean=clean, corrupt=corrupt, answer="mary", wrong="john")
    assert result.tokens[result.position] == "[MASK]"
    assert all(h.direct_logit_attribution is None for h in result.heads)  # post-norm: no linear readout

    model = transformers.BertForMaskedLM.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    clean_ids, corrupt_ids = (tokenizer(t, return_tensors="pt")["input_ids"] for t in (clean, corrupt))
    mary, john = tokenizer.convert_tokens_to_ids(["mary", "john"])
    dense = [layer.attention.output.dense for layer in model.bert.encoder.layer]
    seen = {}
    hooks = [
        d.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0].clone())) for i, d in enumerate(dense)
    ]
    with torch.no_grad():
        model(clean_ids)
    for hook in hooks:
        hook.remove()
    for effect in result.heads:
        columns = slice(effect.head * 8, (effect.head + 1) * 8)

        def put_clean(module, args, layer=effect.layer, columns=columns):
            merged = args[0].clone()
            merged[..., columns] = seen[layer][..., columns]
            return (merged,)

        hook = dense[effect.layer].register_forward_pre_hook(put_clean)
        with torch.no_grad():
            logits = model(corrupt_ids).logits[0, result.position]
        hook.remove()
        assert effect.patched_logit_diff == pytest.approx(float(logits[mary] - logits[john]), abs=1e-5)


def test_patching_some_layers_gives_the_same_numbers_for_them(tiny_models):
    loaded = tiny_models["gpt2"]
    full = patch_heads(loaded, clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, batch_size=3)
    some = patch_heads(loaded, clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, layers=[1])
    assert [(h.layer, h.head) for h in some.heads] == [(1, h) for h in range(4)]
    for effect, reference in zip(some.heads, full.heads[4:]):
        assert effect.patched_logit_diff == pytest.approx(reference.patched_logit_diff, abs=1e-5)
        assert effect.direct_logit_attribution == pytest.approx(reference.direct_logit_attribution, abs=1e-9)
    with pytest.raises(ParameterError, match="the model has no layer 5"):
        patch_heads(loaded, clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, layers=[5])


def test_odd_arguments_get_one_typed_error_or_the_same_numbers(tiny_models, tiny_dirs):
    loaded = tiny_models["gpt2"]
    pair = {"clean": CLEAN, "corrupt": CORRUPT, "answer": ANSWER, "wrong": WRONG}
    full = patch_heads(loaded, **pair, ablate="zero")
    # one layer with zero ablation: the same numbers as that layer's heads in the full run
    first = patch_heads(loaded, **pair, layers=[0], ablate="zero")
    assert [(h.layer, h.head) for h in first.heads] == [(h.layer, h.head) for h in full.heads if h.layer == 0]
    for mine, theirs in zip(first.heads, [h for h in full.heads if h.layer == 0]):
        assert mine.ablation_effect == pytest.approx(theirs.ablation_effect, abs=1e-6)
    # a generator as the corpus of mean ablation: read once, the same numbers as a list
    texts = ["the cat sat on the mat.", "a dog ran through the park and barked."]
    listed = patch_heads(loaded, **pair, ablate="mean", texts=texts, layers=[1])
    generated = patch_heads(loaded, **pair, ablate="mean", texts=(text for text in texts), layers=[1])
    assert [h.ablation_effect for h in generated.heads] == pytest.approx([h.ablation_effect for h in listed.heads])
    # ranking by a short name, and a clear error for an unknown one
    assert full.top_heads(3, by="ablation") == full.top_heads(3, by="ablation_effect")
    with pytest.raises(ValueError, match="by must be one of ablation_effect, direct_logit_attribution"):
        full.top_heads(3, by="size")
    with pytest.raises(ParameterError, match="layers is empty: give at least one layer"):
        patch_heads(loaded, **pair, layers=[])
    with pytest.raises(ParameterError, match="batch_size must be a whole number, got 2.5"):
        patch_heads(loaded, **pair, batch_size=2.5)
    with pytest.raises(TypeError, match="clean must be a string, got int 12345"):
        patch_heads(loaded, **{**pair, "clean": 12345})
    with pytest.raises(TypeError, match="texts must be a list of strings, not one string"):
        patch_heads(loaded, **pair, ablate="mean", texts="the cat sat.")


def test_non_finite_logits_are_named(tiny_dirs):
    from attnviz.models.specs import load_model

    broken = load_model(str(tiny_dirs["gpt2"]), device="cpu")
    with torch.no_grad():
        broken.model.lm_head.weight.fill_(float("nan"))
    with pytest.raises(InputError, match="the clean and corrupt runs gave 2 logit differences that are not finite"):
        patch_heads(broken, clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG)
