"""attnviz.wrap on CUDA: float16 and bfloat16 models, and a model dispatched with ``device_map``.

Skipped without a CUDA GPU (CI has none). Patterns are compared with the model's own eager attention on
the same device and dtype; statistics with those of a float32 CPU run of the same weights.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import TEXTS
from wrap_helpers import eager_patterns, inputs_of, plain_outputs, user_model

import attnviz

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

#: half-precision patterns against eager attention in the same precision
HALF_TOLERANCE = 5e-3
#: half-precision statistics against float32 ones (means of probabilities)
STATISTICS_TOLERANCE = 2e-2


def on_device(inputs: dict, device) -> dict:
    return {key: value.to(device) for key, value in inputs.items()}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("family", ["bert", "llama", "bart"])
def test_half_precision_cuda_model(tiny_model_dirs, family, dtype):
    model, tokenizer = user_model(tiny_model_dirs[family], dtype)
    model.to("cuda")
    target = TEXTS[1] if model.config.is_encoder_decoder else None
    inputs = on_device(inputs_of(tokenizer, TEXTS[0], target), "cuda")
    before = plain_outputs(model, inputs)
    loaded = attnviz.wrap(model, tokenizer)
    capture = attnviz.capture(loaded, TEXTS[0], target=target)
    assert model.config._attn_implementation == "sdpa" and model.training
    assert torch.equal(plain_outputs(model, inputs), before)
    for stack, layers in eager_patterns(model, inputs).items():
        for layer, eager in enumerate(layers):
            assert float((capture.layer(layer, stack) - eager[0].float().cpu()).abs().max()) <= HALF_TOLERANCE
    if not model.config.is_encoder_decoder:
        ours = attnviz.compute_statistics(loaded, TEXTS, progress=False)
        cpu, _ = user_model(tiny_model_dirs[family])
        reference = attnviz.compute_statistics(attnviz.wrap(cpu, tokenizer), TEXTS, progress=False)
        for name in ("max_weight", "first_token", "previous_token"):
            assert torch.allclose(ours.matrix(name), reference.matrix(name), atol=STATISTICS_TOLERANCE)


def test_model_dispatched_with_device_map(tiny_model_dirs):
    import transformers

    directory = tiny_model_dirs["llama"]
    model = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.bfloat16, device_map="auto")
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    placement = getattr(model, "hf_device_map", None)  # transformers before 5.2x leaves it unset on one device
    inputs = on_device(inputs_of(tokenizer, TEXTS[0]), "cuda")
    before = plain_outputs(model, inputs)
    capture = attnviz.capture(attnviz.wrap(model, tokenizer), TEXTS[0])
    assert getattr(model, "hf_device_map", None) == placement
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(plain_outputs(model, inputs), before)
    for layer, eager in enumerate(eager_patterns(model, inputs)["self"]):
        assert float((capture.layer(layer) - eager[0].float().cpu()).abs().max()) <= HALF_TOLERANCE
