"""The query–key view: one weight's breakdown adds up to transformers' eager attention; the map is deterministic."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TEXTS

from attnviz.common.errors import ParameterError


def _eager_row(directory, family: str, text: str, loaded, layer: int, head: int, query: int) -> torch.Tensor:
    """transformers' eager weights of one query row (``output_attentions=True``): the independent reference."""
    import transformers

    model_class = transformers.BertModel if family == "bert" else transformers.AutoModelForCausalLM
    model = model_class.from_pretrained(str(directory), attn_implementation="eager").eval()
    batch = loaded.encode([text])
    with torch.no_grad():
        attentions = model(**batch.inputs, output_attentions=True).attentions
    return attentions[layer][0, head, query].float()


@pytest.mark.parametrize(("family", "head", "query"), [("bert", 1, 4), ("llama", 5, "last")])
def test_per_dimension_products_sum_to_the_scaled_logit_of_the_eager_weights(
    tiny_dirs, tiny_models, family, head, query
):
    """Σ_d q_d·k_d × scaling is the logit; the softmax of every key's logit is transformers' eager row."""
    from attnviz.heads.query_key import explain_logit

    loaded = tiny_models[family]
    breakdown = explain_logit(loaded, TEXTS[0], layer=1, head=head, query=query, key=2)
    row = _eager_row(tiny_dirs[family], family, TEXTS[0], loaded, 1, head, breakdown.query_position)
    visible = breakdown.logits.shape[0]
    assert float(breakdown.products.sum()) * breakdown.scaling == pytest.approx(breakdown.logit, rel=1e-6)
    assert breakdown.logits[breakdown.key_position].item() == pytest.approx(breakdown.logit, rel=1e-5, abs=1e-6)
    assert torch.allclose(torch.softmax(breakdown.logits, 0), row[:visible], atol=1e-6)
    assert breakdown.weight == pytest.approx(float(row[breakdown.key_position]), abs=1e-6)
    if family == "llama":  # rotary: every frequency pair lies in one band, so the bands add up to the logit
        assert breakdown.bands and sum(band.logit for band in breakdown.bands) == pytest.approx(
            breakdown.logit, abs=1e-5
        )
        assert all(
            later.wavelength[0] >= earlier.wavelength[1] for earlier, later in zip(breakdown.bands, breakdown.bands[1:])
        )
    else:
        assert breakdown.bands == []


def test_map_is_deterministic_for_a_seed_and_links_are_the_strongest_weights(tiny_models):
    from attnviz.heads.query_key import query_key_map

    loaded = tiny_models["llama"]
    whole = query_key_map(loaded, TEXTS[:3], layer=0, head=3)
    again = query_key_map(loaded, TEXTS[:3], layer=0, head=3)
    assert torch.equal(whole.coordinates, again.coordinates)
    tokens = len(whole.kinds) // 2
    assert whole.kinds == ["query"] * tokens + ["key"] * tokens and whole.explained is not None
    # every link joins a query to a key of the same text, at or before it (causal), strongest first
    weights = [w for _, _, w in whole.links]
    assert weights == sorted(weights, reverse=True)
    for q, k, _ in whole.links:
        assert whole.kinds[q] == "query" and whole.kinds[k] == "key"
        assert whole.examples[q] == whole.examples[k] and whole.positions[k] <= whole.positions[q]
    drawn = [query_key_map(loaded, TEXTS[:3], layer=0, head=3, max_points=20, seed=seed) for seed in (1, 1, 2)]
    assert torch.equal(drawn[0].coordinates, drawn[1].coordinates) and drawn[0].tokens == drawn[1].tokens
    assert len(drawn[0].kinds) == 20 and drawn[0].tokens != drawn[2].tokens
    for seed in (-1, 2**32, 2.5):  # outside what t-SNE takes: one typed error, not scikit-learn's
        with pytest.raises(ParameterError, match="seed must be a whole number from 0 to 4,294,967,295"):
            query_key_map(loaded, TEXTS[:3], layer=0, head=3, projection="tsne", seed=seed)


def test_map_keeps_every_weight_it_normalises_away(tiny_models):
    """Keys moved to the queries' centre and q, k rescaled: each query's softmax over its keys is unchanged."""
    from attnviz.heads.query_key import _HeadRecorder, _project, _record

    loaded = tiny_models["bert"]
    batch = loaded.encode([TEXTS[1]])
    recorder: _HeadRecorder = _record(loaded, batch, 0, 2)
    assert recorder.query is not None and recorder.key is not None
    q, k = recorder.query[0], recorder.key[0]
    shifted = k - k.mean(0) + q.mean(0)
    ratio = (shifted.norm(dim=-1).mean() / q.norm(dim=-1).mean()).sqrt()
    before = torch.softmax(q @ k.T * recorder.scaling, -1)
    after = torch.softmax((q * ratio) @ (shifted / ratio).T * recorder.scaling, -1)
    assert torch.allclose(before, after, atol=1e-5)
    assert torch.allclose(before, recorder.weights[0], atol=1e-5)
    coordinates, explained = _project(q, k, "pca", 0)
    assert coordinates.shape == (2 * q.shape[0], 2) and explained is not None and explained[0] >= explained[1]


def test_breakdown_and_map_show_inline_as_offline_pages(tiny_models):
    """A notebook shows both as the explain page: the breakdown's dimension table, the map's points as SVG."""
    import attnviz
    from attnviz.heads.query_key import explain_logit, query_key_map

    loaded = tiny_models["llama"]
    breakdown = explain_logit(loaded, TEXTS[0], layer=0, head=1, query=5, key=1)
    page = attnviz.show(breakdown).html
    assert "id='dimensions'" in page and "id='bands'" in page and "<svg" not in page
    assert f"{breakdown.logit:.4f}" in page and "http" not in page.replace("http-equiv", "")
    mapping = query_key_map(loaded, TEXTS[:2], layer=0, head=1)
    frame = mapping._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and frame.count("class=&quot;point&quot;") == len(mapping.kinds)
