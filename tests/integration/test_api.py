"""The top-level ``import attnviz`` API: lazy, complete, and the same numbers as the modules."""

from __future__ import annotations

import subprocess
import sys

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
