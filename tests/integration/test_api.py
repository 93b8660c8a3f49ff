"""The top-level ``import attnviz`` API: lazy, complete, and the same numbers as the modules."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import transformers

import attnviz


def test_import_attnviz_is_light():
    # The CLI's --help and scripts that only read a capture should not pay for torch/transformers.
    code = "import sys, attnviz; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_every_export_resolves():
    import attnviz.captures.attention_capture  # a submodule import must not shadow a top-level name

    assert callable(attnviz.capture)
    for name in attnviz.__all__:
        assert getattr(attnviz, name) is not None, name
    assert set(dir(attnviz)) >= set(attnviz.__all__)


def test_top_level_flow_matches_eager_attention(tiny_model_dirs):
    directory = tiny_model_dirs["llama"]
    model = attnviz.load_model(str(directory))
    result = attnviz.capture(model, "The cat sat on the mat.")
    patterns = result.stacked()  # [layer, head, query, key]

    eager = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager")
    ids = model.tokenizer("The cat sat on the mat.", return_tensors="pt")
    with torch.no_grad():
        reference = eager(**ids, output_attentions=True).attentions
    assert patterns.shape == (2, 8, ids["input_ids"].shape[1], ids["input_ids"].shape[1])
    for layer, expected in enumerate(reference):
        torch.testing.assert_close(patterns[layer], expected[0], atol=1e-6, rtol=0)

    stats = attnviz.compute_statistics(model, ["The cat sat on the mat."], progress=False)
    # max_weight of one head = mean over queries of the row maximum, computed by hand.
    by_hand = patterns[1].amax(-1).mean(-1)  # [head]
    torch.testing.assert_close(stats.matrix("max_weight")[1].float(), by_hand, atol=1e-5, rtol=0)


# -- one call per job: the input decides ----------------------------------------------------------------------
def _images_of(figure):
    """Every image array drawn in a figure's axes, in order (float arrays, masked cells kept as they are)."""
    return [image.get_array() for ax in figure.axes for image in ax.images]


def test_capture_of_texts_is_one_capture_each_and_their_figures_are_the_patterns(tiny_model_dirs):
    import numpy as np

    model = attnviz.load_model(str(tiny_model_dirs["llama"]))
    texts = ["The cat sat on the mat.", "Bees dance."]
    one = attnviz.capture(model, texts[0])
    both = attnviz.capture(model, texts)
    assert isinstance(one, attnviz.AttentionCapture) and isinstance(both, list)
    for alone, batched in zip([one, attnviz.capture(model, texts[1])], both, strict=True):
        assert batched.tokens == alone.tokens  # padding trimmed
        torch.testing.assert_close(batched.stacked(), alone.stacked(), atol=1e-6, rtol=0)
    figure = attnviz.heatmap(one, layers=[1], heads=[2, 5])
    drawn = _images_of(figure)
    for array, head in zip(drawn, (2, 5)):
        assert np.array_equal(
            np.ma.getdata(array)[~np.ma.getmaskarray(array)],
            one.layer(1)[head].numpy()[np.tril(np.ones(array.shape, bool))],
        )
    strips = attnviz.heatmap(one, query="last", layers=[0])  # a text's query: strips, the rows of the capture
    rows = attnviz.query_rows(one, "last", layers=[0])
    assert torch.equal(rows.matrix(), one.layer(0)[:, -1, :])
    assert np.array_equal(_images_of(strips)[0], _images_of(attnviz.heatmap(rows))[0])


def test_the_old_names_warn_and_draw_the_same_figure(tiny_model_dirs):
    import importlib

    import numpy as np

    model = attnviz.load_model(str(tiny_model_dirs["llama"]))
    result = attnviz.capture(model, "The cat sat on the mat.")
    for name, (module, attribute, _) in attnviz._DEPRECATED.items():
        with pytest.deprecated_call(match=f"attnviz.{name} is deprecated"):
            assert getattr(attnviz, name) is getattr(importlib.import_module(module), attribute), name
    assert not set(attnviz._DEPRECATED) & set(attnviz.__all__) and len(attnviz.__all__) <= 30
    with pytest.deprecated_call():
        from attnviz import capture_heatmap
    old, new = capture_heatmap(result, layers=[0], heads=None), attnviz.heatmap(result, layers=[0])
    assert all(np.array_equal(a, b) for a, b in zip(_images_of(old), _images_of(new), strict=True))
    with pytest.deprecated_call(match="compute_statistics"):
        by_old_name = attnviz.compute_statistics(model, texts=["The cat sat."], progress=False)
    by_new = attnviz.compute_statistics(model, ["The cat sat."], progress=False)
    assert torch.equal(by_old_name.matrix("entropy"), by_new.matrix("entropy"))


def test_heatmap_refuses_what_its_figure_does_not_draw(tiny_model_dirs):
    from attnviz.common.errors import ParameterError

    model = attnviz.load_model(str(tiny_model_dirs["llama"]))
    result = attnviz.capture(model, "The cat sat.")
    rows = attnviz.query_rows(result, query=1)
    with pytest.raises(ParameterError, match="words does not apply to the figure of one query's strips"):
        attnviz.heatmap(result, query=1, words=True)
    with pytest.raises(ParameterError, match="layers does not apply to the figure of query rows"):
        attnviz.heatmap(rows, layers=[0])
    with pytest.raises(TypeError, match="attnviz.heatmap draws a capture"):
        attnviz.heatmap(result.stacked())
    with pytest.raises(TypeError, match="reads text"):
        attnviz.capture(model, 42)


def test_an_image_goes_through_the_same_calls():
    import numpy as np

    vision = attnviz.load_model("toy-odd-patch", device="cpu")
    pixels = np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    result = attnviz.capture(vision, pixels)
    assert result.image_grid is not None and result.extras["image"].shape == (32, 32, 3)
    figure = attnviz.heatmap(result, layers=[-1], heads=[1])
    grid = (result.image_grid.rows, result.image_grid.cols)
    (drawn,) = [array for array in _images_of(figure) if array.shape == grid]  # head 1's overlay on the picture
    cls_row = result.layer(-1)[1, 0, 1:].reshape(grid)  # the class token's attention over the patches
    assert np.allclose(np.ma.getdata(drawn), cls_row.numpy())
    view = attnviz.show(result)
    assert view.title == "attention: image view" and "image_view" in view.html
    stats = attnviz.compute_statistics(vision, [pixels, pixels[::-1]], progress=False)
    assert stats.image is not None and stats.num_examples == 2
