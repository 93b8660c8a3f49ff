"""Norm-based attention (``weighting="norm"``) equals α_ij·‖(x_j W_V^h + b_V^h) W_O^h‖ computed independently.

The reference reads transformers' eager weights (``output_attentions=True``) and the value projection's
output with a plain forward hook, and cuts each head's output-projection slice by hand.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import TEXTS


def _eager_reference(directory, family: str, batch) -> dict[int, torch.Tensor]:
    """layer -> ``[b, h, q, k]`` norm-based maps from eager weights and hooked value vectors."""
    import transformers

    model_class = transformers.BertModel if family == "bert" else transformers.AutoModelForCausalLM
    model = model_class.from_pretrained(str(directory), attn_implementation="eager").eval()
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    values: dict[int, torch.Tensor] = {}
    hooks = []
    if family == "bert":
        layers = model.encoder.layer
        for number, layer in enumerate(layers):
            hooks.append(
                layer.attention.self.value.register_forward_hook(
                    lambda module, inputs, output, n=number: values.__setitem__(n, output)  # [b, k, h·d]
                )
            )
        outputs = [layer.attention.output.dense.weight for layer in layers]  # [hidden, h·d]
    elif family == "gpt2":
        layers = model.transformer.h
        for number, layer in enumerate(layers):
            hooks.append(
                layer.attn.c_attn.register_forward_hook(  # [b, k, 3·h·d]: query | key | value
                    lambda module, inputs, output, n=number: values.__setitem__(
                        n, output[..., 2 * config.hidden_size :]
                    )
                )
            )
        outputs = [layer.attn.c_proj.weight.t() for layer in layers]  # Conv1D [h·d, hidden] -> [hidden, h·d]
    else:
        layers = model.model.layers
        for number, layer in enumerate(layers):
            hooks.append(
                layer.self_attn.v_proj.register_forward_hook(
                    lambda module, inputs, output, n=number: values.__setitem__(n, output)  # [b, k, kvh·d]
                )
            )
        outputs = [layer.self_attn.o_proj.weight for layer in layers]  # [hidden, h·d]
    with torch.no_grad():
        attentions = model(**batch.inputs, output_attentions=True).attentions  # per layer [b, h, q, k]
    for hook in hooks:
        hook.remove()
    reference = {}
    for number, weights in enumerate(attentions):
        value = values[number]
        group = heads // (value.shape[-1] // head_dim)  # query heads per key/value head
        norms = []
        for head in range(heads):
            kv = head // group
            v = value[..., kv * head_dim : (kv + 1) * head_dim]  # [b, k, d]
            w_o = outputs[number][:, head * head_dim : (head + 1) * head_dim]  # [hidden, d]
            norms.append((v @ w_o.t()).norm(dim=-1))  # [b, k]
        reference[number] = weights.detach() * torch.stack(norms, dim=1)[:, :, None, :]  # [b, h, q, k]
    return reference


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_norm_maps_equal_an_independent_hook_computation(tiny_dirs, tiny_models, family):
    from attnviz.captures.attention_capture import capture_batch

    loaded = tiny_models[family]
    texts = TEXTS[:3]
    captures = capture_batch(loaded, texts, weighting="norm")
    reference = _eager_reference(tiny_dirs[family], family, loaded.encode(texts))
    for example, capture in enumerate(captures):
        assert capture.weighting == "norm"
        length = len(capture.tokens)
        for layer, expected in reference.items():
            ours = capture.layer(layer)  # [h, q, k]
            wanted = expected[example, :, :length, :length]
            scale = float(wanted.detach().abs().max())
            assert torch.allclose(ours, wanted, rtol=1e-5, atol=1e-5 * scale), (family, layer)
    # grouped-query heads share values but not output columns: their norms differ
    if family == "llama":
        first = captures[0].layer(0)
        assert not torch.allclose(first[0], first[1])


def test_norm_capture_round_trips_and_weights_capture_says_weights(tiny_models, tmp_path):
    from attnviz.captures.attention_capture import AttentionCapture, capture

    loaded = tiny_models["bert"]
    norm = capture(loaded, TEXTS[0], weighting="norm")
    assert float(norm.layer(0).sum(-1).max()) > 1.5  # norms, not renormalised: rows do not sum to 1
    path = norm.save(tmp_path / "norm.safetensors")
    back = AttentionCapture.load(path)
    assert back.weighting == "norm" and torch.equal(back.layer(1), norm.layer(1))
    weights = AttentionCapture.load(capture(loaded, TEXTS[0]).save(tmp_path / "weights.safetensors"))
    assert weights.weighting == "weights"
    assert torch.allclose(weights.layer(0).sum(-1), torch.ones(4, len(weights.tokens)), atol=1e-5)


def test_unknown_weighting_is_refused(tiny_models):
    from attnviz.captures.attention_capture import capture
    from attnviz.common.errors import ParameterError

    with pytest.raises(ParameterError, match="weighting must be one of weights, norm"):
        capture(tiny_models["bert"], TEXTS[0], weighting="value")  # type: ignore[arg-type]


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_stats_of_norm_weighting_are_those_of_renormalised_norm_rows(tiny_models, family):
    """stats(weighting="norm") = the statistics of each capture row α·‖f‖ divided by its sum; carriers by hand."""
    from attnviz.captures.attention_capture import capture
    from attnviz.stats import compute_statistics

    loaded = tiny_models[family]
    text = TEXTS[1]
    norm_capture = capture(loaded, text, weighting="norm")
    weights_capture = capture(loaded, text)
    norm = norm_capture.stacked()  # [layer, head, q, k]
    weights = weights_capture.stacked()
    rows = norm / norm.sum(-1, keepdim=True)
    special = torch.tensor(norm_capture.special)
    stats = compute_statistics(loaded, [text], weighting="norm", progress=False)
    assert stats.weighting == "norm"
    assert torch.allclose(stats.matrix("first_token"), rows[..., 0].mean(-1).double(), atol=1e-5)
    assert torch.allclose(stats.matrix("special_tokens"), rows[..., special].sum(-1).mean(-1).double(), atol=1e-5)
    assert torch.allclose(stats.matrix("max_weight"), rows.amax(-1).mean(-1).double(), atol=1e-5)
    # what each token carries: ‖f(x_j)‖ = (α·‖f‖) / α on any query that sees key j (the last one sees all)
    value_norms = norm[:, :, -1] / weights[:, :, -1]  # [layer, head, k]
    carriers = stats.carriers
    assert torch.allclose(carriers.matrix("first_value_norm"), value_norms[..., 0].double(), rtol=1e-4)
    assert torch.allclose(carriers.matrix("other_value_norm"), value_norms[..., 1:].mean(-1).double(), rtol=1e-4)
    assert torch.allclose(carriers.matrix("first_token_weight_share"), weights[..., 0].mean(-1).double(), atol=1e-5)
    assert torch.allclose(carriers.matrix("first_token_norm_share"), rows[..., 0].mean(-1).double(), atol=1e-5)
    plain = compute_statistics(loaded, [text], progress=False)  # the weights: the same carriers beside them
    assert plain.weighting == "weights"
    assert torch.allclose(plain.carriers.matrix("first_token_norm_share"), carriers.matrix("first_token_norm_share"))
    assert torch.allclose(plain.matrix("first_token"), carriers.matrix("first_token_weight_share"), atol=1e-6)


def test_value_norms_equal_the_norms_of_the_transformed_values_for_every_head_and_rank():
    """‖v W_h‖ through the [d, d] factor equals the direct product, for grouped heads and for slices without a
    Cholesky factor: a pruned (zero) head, and one of rank below d (an output narrower than the head)."""
    from attnviz.core.weighting import grams_of, projection_factor, projection_factors, value_norms

    generator = torch.Generator().manual_seed(0)
    batch, kv_heads, n_rep, keys, head_dim = 2, 2, 3, 7, 8
    value = torch.randn(batch, kv_heads, keys, head_dim, generator=generator)  # [b, kvh, k, d]
    for hidden in (32, 5):  # 5 < d: every Gram matrix is singular
        projections = torch.randn(kv_heads * n_rep, head_dim, hidden, generator=generator)  # [h, d, hidden]
        projections[4] = 0.0  # a pruned head
        expected = torch.stack(
            [
                (value[:, head // n_rep].double() @ projections[head].double()).norm(dim=-1)
                for head in range(kv_heads * n_rep)
            ],
            dim=1,
        )  # [b, h, k]
        got = value_norms(value, projections, factor=projection_factor(projections))
        assert got.shape == (batch, kv_heads * n_rep, keys)
        assert float((got.double() - expected).abs().max()) <= 1e-5 * float(expected.max()), hidden
        assert float(got[:, 4].abs().max()) == 0.0
        out = torch.full((batch, kv_heads * n_rep, keys), float("nan"))
        assert value_norms(value, projections, out) is out and torch.equal(out, value_norms(value, projections))
    # several sites factorised together: shapes grouped, a site without a Cholesky factor beside ones with
    sites = {
        "wide": torch.randn(6, head_dim, 32, generator=generator),
        "narrow": torch.randn(6, head_dim, 5, generator=generator),
        "wide again": torch.randn(6, head_dim, 32, generator=generator),
        "fewer heads": torch.randn(2, head_dim, 32, generator=generator),
    }
    sites["wide again"][1] = 0.0  # a pruned head in a group whose other sites factorise
    parts = [sites["wide"], sites["wide again"]]  # the Gram matrices in one product (a GPU's way) or one per site
    assert torch.allclose(grams_of(parts, together=True), grams_of(parts, together=False), rtol=1e-12, atol=0)
    factors = projection_factors(sites)
    assert list(factors) == list(sites)
    assert projection_factors({}) == {}  # a model with no known output projection
    for name, projections in sites.items():
        alone = projection_factor(projections)
        got = value_norms(value, projections, factor=factors[name])
        expected = value_norms(value, projections, factor=alone)
        assert torch.allclose(got, expected, rtol=1e-6, atol=0), name
        per_value_head = projections.shape[0] // kv_heads
        direct = [
            (value[:, head // per_value_head] @ projections[head]).norm(dim=-1) for head in range(len(projections))
        ]
        assert torch.allclose(got, torch.stack(direct, 1), rtol=1e-4, atol=1e-6), name


def test_value_norms_written_in_place_keep_their_gradient():
    """Values that require a gradient (an attribution pass): the norms equal those without, and their gradient
    equals the direct ‖v W_h‖'s, though the norms are written into a buffer."""
    from attnviz.core.weighting import value_norms

    generator = torch.Generator().manual_seed(1)
    value = torch.randn(1, 2, 5, 4, generator=generator, dtype=torch.float64).float()  # [b, kvh, k, d]
    projections = torch.randn(4, 4, 6, generator=generator)  # [h, d, hidden], two heads per value head
    leaf = value.clone().requires_grad_(True)
    norms = value_norms(leaf, projections, torch.empty(1, 4, 5))
    assert torch.allclose(norms.detach(), value_norms(value, projections), rtol=1e-6, atol=0)
    norms.sum().backward()
    direct = value.clone().requires_grad_(True)
    sum((direct[:, head // 2] @ projections[head]).norm(dim=-1).sum() for head in range(4)).backward()
    assert leaf.grad is not None and torch.allclose(leaf.grad, direct.grad, rtol=1e-4, atol=1e-6)


def test_factor_cache_reuses_unchanged_factors_and_recomputes_edited_ones():
    """Factors kept across calls: reused (the same tensors) while the projections are unchanged, recomputed where
    they were edited in place through ``.data`` (same tensor, storage and version) or had two heads swapped; equal
    to uncached ones either way; no gradient kept; the global random state untouched."""
    from attnviz.core.weighting import FactorCache, projection_factors

    generator = torch.Generator().manual_seed(2)
    weights = {
        "a": torch.randn(4, 8, 32, generator=generator, requires_grad=True),
        "b": torch.randn(4, 8, 32, generator=generator, requires_grad=True),
        "narrow": torch.randn(2, 8, 16, generator=generator, requires_grad=True),  # a group of its own
    }
    cache = FactorCache()
    state = torch.random.get_rng_state()
    first = projection_factors(weights, cache=cache)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert list(first) == list(weights)
    plain = projection_factors(weights)
    assert all(torch.equal(first[site], plain[site]) for site in weights)
    assert not any(factor.requires_grad for factor in first.values())
    again = projection_factors(weights, cache=cache)
    assert all(again[site] is first[site] for site in weights)  # reused, not recomputed

    weights["a"].data[1, 3, 5] += 0.25  # one weight, in place, invisible to the version counter
    edited = projection_factors(weights, cache=cache)
    assert edited["narrow"] is first["narrow"]  # its group is unchanged
    assert not torch.equal(edited["a"][1], first["a"][1])
    assert torch.equal(edited["a"], projection_factors(weights)["a"])

    weights["b"].data[[0, 2]] = weights["b"].data[[2, 0]].clone()  # two heads swapped: same values, other places
    swapped = projection_factors(weights, cache=cache)
    assert torch.equal(swapped["b"][0], edited["b"][2]) and torch.equal(swapped["b"][2], edited["b"][0])
    assert torch.equal(swapped["b"], projection_factors(weights)["b"])

    fewer = {"a": weights["a"][:3]}  # a pruned model's site: other shapes, a group of another key
    assert torch.equal(projection_factors(fewer, cache=cache)["a"], projection_factors(fewer)["a"])


def test_statistics_after_an_in_place_weight_edit_use_the_edited_weights(tiny_dirs, monkeypatch):
    """Two stats calls on one model reuse its norms' factors; an edit of the output projection through ``.data``
    between calls (what a user ablating a head by hand does) changes the carriers as a fresh model's would."""
    from attnviz.core import weighting
    from attnviz.models.specs import load_model
    from attnviz.stats import compute_statistics

    computed: list[int] = []  # sites factorised by each call of the factorisation
    factors_of = weighting._factors_of
    monkeypatch.setattr(
        weighting, "_factors_of", lambda p, groups: computed.append(sum(map(len, groups))) or factors_of(p, groups)
    )
    loaded = load_model(str(tiny_dirs["llama"]), device="cpu")  # its own copy: the edit must not reach other tests
    before = compute_statistics(loaded, TEXTS[:2], progress=False, weighting="norm").carriers
    assert computed == [len(before.means), 0]  # the carriers factorise; norm weighting reuses theirs
    again = compute_statistics(loaded, TEXTS[:2], progress=False, weighting="norm").carriers
    assert computed[2:] == [0, 0]
    site = next(iter(before.means))
    assert torch.equal(again.means[site], before.means[site])
    output = loaded.model.model.layers[0].self_attn.o_proj.weight  # [hidden, h·d]
    head_dim = loaded.model.config.head_dim
    output.data[:, head_dim : 2 * head_dim] *= 3.0  # head 1 of layer 0: its outputs three times larger
    after = compute_statistics(loaded, TEXTS[:2], progress=False).carriers
    fresh = compute_statistics(loaded.with_model(loaded.model), TEXTS[:2], progress=False).carriers  # no cache
    first_layer = next(s for s in before.means if s.layer == 0)
    norms_before = before.means[first_layer][0]  # first_value_norm, [h]
    assert torch.allclose(after.means[first_layer][0][1], 3 * norms_before[1], rtol=1e-5)
    assert torch.equal(after.means[first_layer][0][0], norms_before[0])
    for name in after.means:
        assert torch.allclose(after.means[name], fresh.means[name], rtol=1e-6, atol=0, equal_nan=True)
