"""Models placed by accelerate (``device_map``), with layers offloaded to the disk, give the same numbers.

A tiny model loaded with ``max_memory={"cpu": "200KB"}`` and an ``offload_folder`` keeps every weight on the
``meta`` device between calls (accelerate's hooks read each layer back from the folder for its forward): the
way a model larger than the machine's memory runs. Loaded by attnviz or by the user and wrapped, it must
capture, compute statistics, patch and prune exactly like the same model held in memory.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import TEXTS

import attnviz

#: a budget no layer fits in: accelerate offloads the whole model to the folder
NO_MEMORY = {"cpu": "200KB"}
CLEAN, CORRUPT = "the cat sat on the mat and the cat", "the dog sat on the mat and the cat"


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def in_memory_and_offloaded(request, tiny_dirs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("offload")
    path = str(tiny_dirs[request.param])
    in_memory = attnviz.load_model(path, device="cpu")
    offloaded = attnviz.load_model(path, device="cpu", max_memory=NO_MEMORY, offload_folder=folder)
    return in_memory, offloaded


def test_the_offloaded_model_has_its_weights_on_disk(in_memory_and_offloaded):
    _, offloaded = in_memory_and_offloaded
    assert set(offloaded.model.hf_device_map.values()) == {"disk"}
    assert all(parameter.device.type == "meta" for parameter in offloaded.model.parameters())
    assert offloaded.device == torch.device("cpu")  # inputs go where accelerate runs the layers


def test_capture_and_statistics_equal_the_model_in_memory(in_memory_and_offloaded):
    in_memory, offloaded = in_memory_and_offloaded
    expected, captured = attnviz.capture(in_memory, TEXTS[0]), attnviz.capture(offloaded, TEXTS[0])
    assert torch.equal(expected.stacked(), captured.stacked())
    reference, statistics = (attnviz.compute_statistics(model, TEXTS[:3]) for model in in_memory_and_offloaded)
    reference_rows, rows = list(reference.heads()), list(statistics.heads())
    assert len(rows) == len(reference_rows) > 0
    for (site, head, values), (other_site, other_head, other_values) in zip(reference_rows, rows):
        assert (site, head) == (other_site, other_head)
        for name, value in values.items():
            assert other_values[name] == pytest.approx(value, abs=1e-6, nan_ok=True), (site, head, name)


def test_patching_equals_the_model_in_memory(in_memory_and_offloaded):
    results = [
        attnviz.patch_heads(model, clean=CLEAN, corrupt=CORRUPT, answer="cat", wrong="dog")
        for model in in_memory_and_offloaded
    ]
    assert results[0].clean_logit_diff == results[1].clean_logit_diff
    assert results[0].corrupt_logit_diff == results[1].corrupt_logit_diff
    for expected, effect in zip(results[0].heads, results[1].heads):
        assert (effect.layer, effect.head) == (expected.layer, expected.head)
        assert effect.patched_logit_diff == pytest.approx(expected.patched_logit_diff, abs=1e-6)
        assert effect.direct_logit_attribution == pytest.approx(expected.direct_logit_attribution, abs=1e-6)


def test_pruning_the_offloaded_model_equals_pruning_it_in_memory(in_memory_and_offloaded, tmp_path):
    outcomes = [
        attnviz.prune_model(model, attnviz.PruneConfig(ratio=0.3), texts=TEXTS) for model in in_memory_and_offloaded
    ]
    assert outcomes[0].removed == outcomes[1].removed and sum(map(len, outcomes[0].removed.values())) > 0
    saved = [attnviz.save_outcome(outcome, tmp_path / name, source="tiny") for outcome, name in zip(outcomes, "ab")]
    reloaded = [attnviz.load_model(str(path), device="cpu") for path in saved]
    batches = [model.encode([TEXTS[1]]) for model in reloaded]
    with torch.no_grad():
        logits = [model.forward(batch, logits=True).logits for model, batch in zip(reloaded, batches)]
    assert torch.equal(logits[0], logits[1])


def test_a_model_the_user_offloaded_wraps_and_captures_exactly(tiny_dirs, tmp_path):
    import transformers

    path = tiny_dirs["llama"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    plain = transformers.AutoModelForCausalLM.from_pretrained(path)
    placed = transformers.AutoModelForCausalLM.from_pretrained(
        path, device_map="auto", max_memory=NO_MEMORY, offload_folder=str(tmp_path)
    )
    expected = attnviz.capture(attnviz.wrap(plain, tokenizer), TEXTS[2])
    captured = attnviz.capture(attnviz.wrap(placed, tokenizer), TEXTS[2])
    assert torch.equal(expected.stacked(), captured.stacked())
    assert all(parameter.device.type == "meta" for parameter in placed.parameters())  # left as the user had it
