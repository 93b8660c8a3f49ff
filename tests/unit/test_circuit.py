"""Attribution over nodes and edges, path patching and faithfulness against independent computations.

The references are plain transformers (eager attention) with hooks: node attributions from autograd with forward
pre-hooks on the output projection's input (``o_proj``/``c_proj``: head ``h`` in columns ``h·d … h·d+d−1``) and
forward hooks on each MLP; path patching of one edge by re-computing that receiver's projection from the corrupt
run's residual stream plus the sender's clean-minus-corrupt output, in a forward hook on the projection.
"""

from __future__ import annotations

import collections

import pytest
import torch
import transformers

from attnviz.circuit import find_circuit

CLEAN = "when mary and john went to the store, john gave a drink to"
CORRUPT = "when mary and john went to the store, mary gave a drink to"
ANSWER, WRONG = " mary", " john"
NAMES = {  # layers, attention, output projection, input norm, MLP
    "llama": (lambda m: m.model.layers, "self_attn", "o_proj", "input_layernorm", "mlp"),
    "gpt2": (lambda m: m.transformer.h, "attn", "c_proj", "ln_1", "mlp"),
}


def reference(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    ids = [tokenizer(text, return_tensors="pt")["input_ids"] for text in (CLEAN, CORRUPT)]
    answer, wrong = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (ANSWER, WRONG))
    return model, ids, (answer, wrong)


def hooked_run(model, family, ids, tokens, *, grad=False, change=None):
    """Logit difference, and per layer the output projection's input ``[q, h·d]``, the MLP output and the layer's
    input (with their gradients when ``grad``). ``change(layer, module, output)`` may rewrite a module's output."""
    layers_of, attention, output, _, mlp = NAMES[family]
    seen = collections.defaultdict(dict)
    handles = []
    for index, layer in enumerate(layers_of(model)):
        projection = getattr(getattr(layer, attention), output)
        handles.append(projection.register_forward_pre_hook(lambda m, a, i=index: seen["z"].__setitem__(i, a[0])))
        handles.append(
            getattr(layer, mlp).register_forward_hook(lambda m, a, o, i=index: seen["mlp"].__setitem__(i, o))
        )
        handles.append(
            layer.register_forward_pre_hook(lambda m, a, k, i=index: seen["in"].__setitem__(i, a[0] if a else k["hidden_states"]), with_kwargs=True)
        )  # fmt: skip
    if change is not None:
        handles.extend(change(model))
    try:
        with torch.set_grad_enabled(grad):
            logits = model(ids).logits[0, -1]
            diff = logits[tokens[0]] - logits[tokens[1]]
            grads = None
            if grad:
                inputs = [seen["z"][i] for i in sorted(seen["z"])] + [seen["mlp"][i] for i in sorted(seen["mlp"])]
                found = torch.autograd.grad(diff, inputs)
                count = len(seen["z"])
                grads = {"z": dict(enumerate(found[:count])), "mlp": dict(enumerate(found[count:]))}
    finally:
        for handle in handles:
            handle.remove()
    values = {kind: {i: v.detach()[0] for i, v in found_.items()} for kind, found_ in seen.items()}
    return float(diff), values, grads


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_node_attributions_equal_autograd_through_hooks_and_edges_add_up_to_them(tiny_dirs, tiny_models, family):
    torch_model = tiny_models[family].model
    hooks = [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in torch_model.modules()]
    result = find_circuit(tiny_models[family], clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, method="eap")
    # the model is left as it was: no gradients kept, no hook left behind
    assert all(parameter.grad is None for parameter in torch_model.parameters())
    assert [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in torch_model.modules()] == hooks
    model, (clean_ids, corrupt_ids), tokens = reference(tiny_dirs[family])
    clean_diff, clean, _ = hooked_run(model, family, clean_ids, tokens)
    corrupt_diff, corrupt, grads = hooked_run(model, family, corrupt_ids, tokens, grad=True)
    assert result.clean_logit_diff == pytest.approx(clean_diff, abs=1e-4)
    assert result.corrupt_logit_diff == pytest.approx(corrupt_diff, abs=1e-4)
    heads = model.config.num_attention_heads
    expected = {}
    for layer in clean["z"]:
        per_column = (clean["z"][layer] - corrupt["z"][layer]) * grads["z"][layer][0]  # [q, h·d]
        for head, value in enumerate(per_column.view(per_column.shape[0], heads, -1).sum((0, 2)).tolist()):
            expected[("head", layer, head)] = value
        expected[("mlp", layer, None)] = float(
            ((clean["mlp"][layer] - corrupt["mlp"][layer]) * grads["mlp"][layer][0]).sum()
        )
    found = {(n.kind, n.layer, n.head): n.attribution for n in result.nodes if n.kind != "embed"}
    assert set(found) == set(expected)
    scale = max(abs(v) for v in expected.values())
    for key, value in expected.items():
        assert found[key] == pytest.approx(value, abs=1e-5 * scale + 1e-7), key

    # the residual stream is a sum: each sender's outgoing edges add up to its node attribution
    sums: dict = collections.defaultdict(float)
    for edge in result.edges:
        sums[edge.sender] += edge.score
    for node in result.nodes:
        assert sums[(node.kind, node.layer, node.head)] == pytest.approx(node.attribution, abs=1e-5 * scale + 1e-7)
    receivers = {edge.receiver for edge in result.edges}
    kv_heads = getattr(model.config, "num_key_value_heads", heads)
    assert {(r[3], r[2]) for r in receivers if r[0] == "head" and r[1] == 1} == (
        {("q", h) for h in range(heads)} | {(i, h) for i in "kv" for h in range(kv_heads)}
    )
    assert ("logits", None, None, None) in receivers and ("mlp", 0, None, None) in receivers


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_faithfulness_runs_from_the_empty_circuit_to_the_whole_graph(tiny_models, family):
    result = find_circuit(
        tiny_models[family], clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, method="eap-ig", steps=3
    )
    (first, empty), (last, whole) = result.faithfulness_curve[0], result.faithfulness_curve[-1]
    assert first == 0 and empty == pytest.approx(0.0, abs=1e-5)
    assert last == len(result.edges) and whole == pytest.approx(1.0, abs=1e-5)
    assert result.circuit_faithfulness >= result.target
    assert result.circuit_edges == min(count for count, value in result.faithfulness_curve + [(result.circuit_edges, result.circuit_faithfulness)] if value >= result.target)  # fmt: skip
    sums: dict = collections.defaultdict(float)  # integrated gradients keep the sum rule
    for edge in result.edges:
        sums[edge.sender] += edge.score
    for node in result.nodes:
        assert sums[(node.kind, node.layer, node.head)] == pytest.approx(node.attribution, abs=1e-5)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_path_patching_of_one_edge_equals_a_hand_written_hook(tiny_dirs, tiny_models, family):
    result = find_circuit(
        tiny_models[family], clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, method="eap", verify=40
    )
    verified = result.verification()["items"]
    item = next(v for v in verified if v["receiver"]["kind"] == "head" and v["sender"]["kind"] == "head")
    sender, receiver = item["sender"], item["receiver"]
    model, (clean_ids, corrupt_ids), tokens = reference(tiny_dirs[family])
    _, clean, _ = hooked_run(model, family, clean_ids, tokens)
    corrupt_diff, corrupt, _ = hooked_run(model, family, corrupt_ids, tokens)
    layers_of, attention, output, norm, _ = NAMES[family]
    layers = layers_of(model)
    head_dim = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    columns = slice(sender["head"] * head_dim, (sender["head"] + 1) * head_dim)
    projection = getattr(getattr(layers[sender["layer"]], attention), output)
    weight = projection.weight.t() if family == "gpt2" else projection.weight  # [width, h·d]
    change_z = (clean["z"][sender["layer"]] - corrupt["z"][sender["layer"]])[:, columns]  # [q, d]
    delta = change_z @ weight[:, columns].t()  # [q, width]: what the sender's clean output adds

    def change(model):
        layer = layers[receiver["layer"]]
        stream = {}
        hooks = [layer.register_forward_pre_hook(lambda m, a, k: stream.__setitem__("x", a[0] if a else k["hidden_states"]), with_kwargs=True)]  # fmt: skip
        read = getattr(layer, norm)
        if family == "gpt2":
            module, width = layer.attn.c_attn, model.config.hidden_size
            offset = {"q": 0, "k": width, "v": 2 * width}[receiver["input"]]
        else:
            module, offset = getattr(layer.self_attn, receiver["input"] + "_proj"), 0
        cols = slice(offset + receiver["head"] * head_dim, offset + (receiver["head"] + 1) * head_dim)

        def replace(m, a, out):
            normed = read(stream["x"] + delta)
            weight = m.weight.t() if family == "gpt2" else m.weight  # [out, width]
            out = out.clone()
            out[..., cols] = normed @ weight[cols].t() + (0 if m.bias is None else m.bias[cols])
            return out

        hooks.append(module.register_forward_hook(replace))
        return hooks

    patched_diff, _, _ = hooked_run(model, family, corrupt_ids, tokens, change=change)
    assert item["exact"] == pytest.approx(patched_diff - corrupt_diff, abs=1e-4)


def test_atp_verifies_nodes_by_patching_their_output(tiny_models):
    result = find_circuit(
        tiny_models["llama"], clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, method="atp", verify=3
    )
    assert result.edges == [] and result.kept == "nodes"
    verification = result.verification()
    assert len(verification["items"]) == 3
    assert verification["sign_agreement"] == 1.0
    from attnviz.render.circuit_graph import verification_words

    assert f"Pearson {verification['pearson']:.2f} with the scores, same sign in 100%" in verification_words(result)


def test_per_position_scores_add_up_and_kl_runs_from_corrupt_to_clean(tiny_models):
    loaded = tiny_models["gpt2"]
    result = find_circuit(
        loaded, clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, per_position=True, metric="kl"
    )
    assert result.clean_metric == pytest.approx(0.0, abs=1e-6) and result.corrupt_metric > 0
    for item in [*result.nodes, *result.edges]:
        assert len(item.per_position) == 16
        total = item.attribution if hasattr(item, "attribution") else item.score
        assert sum(item.per_position) == pytest.approx(total, abs=1e-9)
    (_, empty), (_, whole) = result.faithfulness_curve[0], result.faithfulness_curve[-1]
    assert empty == pytest.approx(0.0, abs=1e-4) and whole == pytest.approx(1.0, abs=1e-4)  # float32 KL
    # the logit-difference attributions of the same pair differ (another metric), the logit differences do not
    plain = find_circuit(loaded, clean=CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG)
    assert plain.clean_logit_diff == pytest.approx(result.clean_logit_diff)
