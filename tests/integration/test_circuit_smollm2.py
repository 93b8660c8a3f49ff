"""The indirect-object circuit of docs/circuit.md on SmolLM2, against autograd through hooks on ``o_proj``.

The reference runs plain transformers (sdpa attention): forward pre-hooks on every ``o_proj`` keep its input
``[q, 9 × 64]`` in the clean run and in the corrupt run, where autograd gives the logit difference's gradient
with respect to it; a head's attribution is ``Σ (z_clean − z_corrupt) · ∂M/∂z`` over its 64 columns and every
position.
"""

from __future__ import annotations

import collections

import pytest
import torch

from attnviz.circuit import find_circuit
from attnviz.models.specs import load_model

pytestmark = pytest.mark.slow

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"


def o_proj_inputs(model, ids, tokens, grad):
    seen = {}
    hooks = [
        layer.self_attn.o_proj.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0]))
        for i, layer in enumerate(model.model.layers)
    ]
    try:
        with torch.set_grad_enabled(grad):
            logits = model(ids).logits[0, -1]
            diff = logits[tokens[0]] - logits[tokens[1]]
            grads = torch.autograd.grad(diff, [seen[i] for i in sorted(seen)]) if grad else None
    finally:
        for hook in hooks:
            hook.remove()
    return {i: value.detach()[0] for i, value in seen.items()}, grads


def test_indirect_object_circuit_matches_autograd_and_is_faithful():
    loaded = load_model("smollm2", device="cpu")
    result = find_circuit(loaded, clean=CLEAN, corrupt=CORRUPT, answer=" Mary", wrong=" John", method="eap")
    heads = [(n.layer, n.head) for n in result.top_nodes(5, "head")]
    assert (23, 3) in heads  # the name mover

    model, tokenizer = loaded.model, loaded.tokenizer
    own = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        clean_ids, corrupt_ids = (tokenizer(t, return_tensors="pt")["input_ids"] for t in (CLEAN, CORRUPT))
        tokens = [tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (" Mary", " John")]
        clean, _ = o_proj_inputs(model, clean_ids, tokens, grad=False)
        corrupt, grads = o_proj_inputs(model, corrupt_ids, tokens, grad=True)
    finally:
        model.set_attn_implementation(own)
    found = {(n.layer, n.head): n.attribution for n in result.nodes if n.kind == "head"}
    for layer in clean:
        per_head = ((clean[layer] - corrupt[layer]) * grads[layer][0]).view(-1, 9, 64).sum((0, 2))
        for head, value in enumerate(per_head.tolist()):
            assert found[(layer, head)] == pytest.approx(value, abs=2e-3), (layer, head)

    sums: dict = collections.defaultdict(float)
    for edge in result.edges:
        sums[edge.sender] += edge.score
    for node in result.nodes:
        assert sums[(node.kind, node.layer, node.head)] == pytest.approx(node.attribution, abs=2e-3)
    (first, empty), (last, whole) = result.faithfulness_curve[0], result.faithfulness_curve[-1]
    assert (first, last) == (0, len(result.edges))
    assert empty == pytest.approx(0.0, abs=1e-3) and whole == pytest.approx(1.0, abs=1e-3)
    assert result.circuit_faithfulness >= 0.8
