"""attnviz.wrap: a transformers model the user loaded, run through attnviz's core only during attnviz's calls.

Every supported family (tiny random models), float32 and bfloat16 on the CPU: the capture of the
wrapped model equals the model's own eager ``output_attentions``; afterwards the model has its own
attention implementation, training flags, gradients flags and bit-identical outputs; the tokenizer
keeps its settings. Then every library call that takes a loaded model runs on a wrapped one.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import TEXTS
from wrap_helpers import eager_patterns, inputs_of, plain_outputs, user_model

import attnviz
from attnviz.common.errors import InputError, UnsupportedModelError
from attnviz.core import AttentionSite
from attnviz.heads import ProbeSettings

WRAPPABLE = ("bert", "gpt2", "llama", "bart", "t5")
#: largest |capture − eager| allowed: float32 is exact up to rounding; bfloat16 rounds weights to 8 bits
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 5e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("family", WRAPPABLE)
def test_wrapped_capture_matches_eager_and_leaves_the_model_as_it_was(tiny_model_dirs, family, dtype):
    model, tokenizer = user_model(tiny_model_dirs[family], dtype)
    target = TEXTS[1] if model.config.is_encoder_decoder else None
    inputs = inputs_of(tokenizer, TEXTS[0], target)
    before = plain_outputs(model, inputs)
    training = [m.training for m in model.modules()]
    next(model.parameters()).requires_grad_(False)
    grads = [p.requires_grad for p in model.parameters()]
    padding_side, pad_token = tokenizer.padding_side, tokenizer.pad_token

    loaded = attnviz.wrap(model, tokenizer)
    capture = attnviz.capture(loaded, TEXTS[0], target=target)

    assert model.config._attn_implementation == "sdpa"
    assert [m.training for m in model.modules()] == training
    assert [p.requires_grad for p in model.parameters()] == grads
    assert (tokenizer.padding_side, tokenizer.pad_token) == (padding_side, pad_token)
    assert torch.equal(plain_outputs(model, inputs), before)
    reference = eager_patterns(model, inputs)
    assert sorted(capture.patterns) == sorted(reference)
    for stack, layers in reference.items():
        assert len(layers) == capture.num_layers(stack)
        for layer, eager in enumerate(layers):
            ours = capture.layer(layer, stack)
            assert ours.shape == eager[0].shape
            difference = float((ours - eager[0].float()).abs().max())
            assert difference <= TOLERANCE[dtype], (stack, layer, difference)
    assert capture.causal == (family in ("gpt2", "llama"))


def test_eager_models_stay_eager_and_nested_calls_restore_once(tiny_model_dirs):
    model, tokenizer = user_model(tiny_model_dirs["llama"], implementation="eager")
    loaded = attnviz.wrap(model, tokenizer, name="my-llama")
    with loaded.running():
        assert model.config._attn_implementation == "attnviz"
        assert not model.training
        attnviz.capture(loaded, TEXTS[0])  # a call inside a call: the outer one restores
        assert model.config._attn_implementation == "attnviz"
    assert model.config._attn_implementation == "eager"
    assert model.training
    assert loaded.name == "my-llama"


def test_restored_after_an_error_inside_a_call(tiny_model_dirs):
    model, tokenizer = user_model(tiny_model_dirs["bert"])
    loaded = attnviz.wrap(model, tokenizer)
    with pytest.raises(InputError):
        attnviz.capture(loaded, "   ")
    with pytest.raises(RuntimeError), loaded.running():
        raise RuntimeError("the user's code failed")
    assert model.config._attn_implementation == "sdpa"
    assert model.training


def test_families_off_the_interface_get_one_clear_error(tiny_model_dirs):
    model, tokenizer = user_model(tiny_model_dirs["gpt_neo"], implementation="eager")
    with pytest.raises(UnsupportedModelError, match="gpt_neo models do not call transformers' attention interface"):
        attnviz.wrap(model, tokenizer)
    assert model.config._attn_implementation == "eager"


def test_what_is_not_a_transformers_model_is_refused(tiny_model_dirs):
    with pytest.raises(InputError, match="takes a transformers model"):
        attnviz.wrap(torch.nn.Linear(2, 2))
    model, _ = user_model(tiny_model_dirs["bert"])
    with pytest.raises(InputError, match="tokenizer"):
        attnviz.wrap(model, tokenizer="not a tokenizer")


def test_the_tokenizer_saved_with_the_model_is_found(tiny_model_dirs):
    model, tokenizer = user_model(tiny_model_dirs["bert"])
    loaded = attnviz.wrap(model)
    assert attnviz.capture(loaded, TEXTS[0]).tokens == tokenizer.convert_ids_to_tokens(tokenizer(TEXTS[0])["input_ids"])


def test_statistics_and_probes_of_a_wrapped_model_equal_those_of_the_loaded_one(tiny_model_dirs):
    directory = tiny_model_dirs["gpt2"]
    model, tokenizer = user_model(directory)
    wrapped = attnviz.wrap(model, tokenizer)
    loaded = attnviz.load_model(str(directory), device="cpu")
    ours = attnviz.compute_statistics(wrapped, TEXTS, progress=False)
    theirs = attnviz.compute_statistics(loaded, TEXTS, progress=False)
    for name in ("entropy", "previous_token", "first_token"):
        assert torch.allclose(ours.matrix(name), theirs.matrix(name), atol=1e-9, rtol=0)
    probe = ProbeSettings(length=8, sequences=2)
    functions = attnviz.head_functions(wrapped, probe=probe)
    reference = attnviz.head_functions(loaded, probe=probe)
    assert torch.allclose(functions.matrix("induction"), reference.matrix("induction"), atol=1e-9, equal_nan=True)
    assert model.config._attn_implementation == "sdpa" and model.training


def test_generation_and_atlas_of_a_wrapped_model(tiny_model_dirs):
    for family in ("gpt2", "bart"):
        directory = tiny_model_dirs[family]
        model, tokenizer = user_model(directory)
        wrapped = attnviz.wrap(model, tokenizer)
        ours = attnviz.generate(wrapped, TEXTS[0], max_new_tokens=4)
        theirs = attnviz.generate(attnviz.load_model(str(directory), device="cpu"), TEXTS[0], max_new_tokens=4)
        assert ours.token_ids == theirs.token_ids
        for stack in theirs.capture.stacks:
            assert torch.allclose(ours.capture.stacked(stack), theirs.capture.stacked(stack), atol=1e-6)
        assert model.config._attn_implementation == "sdpa" and model.training
    atlas = attnviz.head_atlas(attnviz.wrap(*user_model(tiny_model_dirs["bert"])), TEXTS[:3], examples=1)
    assert '"format":"attnviz-atlas"' in atlas.html


def test_pruning_a_wrapped_model_leaves_the_users_model_whole(tiny_model_dirs):
    model, tokenizer = user_model(tiny_model_dirs["gpt2"])
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    wrapped = attnviz.wrap(model, tokenizer)
    outcome = attnviz.prune_model(
        wrapped, attnviz.PruneConfig(ratio=0.25, latency_repeats=1, latency_tokens=16), texts=TEXTS
    )
    assert outcome.pruned.model is not model
    assert all(torch.equal(state[name], tensor) for name, tensor in model.state_dict().items())
    assert model.config._attn_implementation == "sdpa" and model.training
    pruned_layout = outcome.pruned.layout()
    assert sum(pruned_layout.values()) == sum(wrapped.layout().values()) - len(outcome.report.pruned)
    assert outcome.pruned.model.config._attn_implementation == "sdpa"
    assert outcome.report.max_abs_diff < 1e-4
    assert AttentionSite("self", 0) in pruned_layout


def test_alignment_and_similarity_of_a_wrapped_model_equal_those_of_the_loaded_one(tiny_model_dirs):
    from attnviz.heads.alignment import AlignmentPair, align_heads, parse_alignment

    pairs = [AlignmentPair("the cat sat", "le chat assis", parse_alignment("0-0 1-1 2-2"))]
    directory = tiny_model_dirs["bart"]
    model, tokenizer = user_model(directory)
    ours = align_heads(attnviz.wrap(model, tokenizer), pairs)
    theirs = align_heads(attnviz.load_model(str(directory), device="cpu"), pairs)
    assert torch.equal(ours.aer_grid(), theirs.aer_grid())
    assert model.config._attn_implementation == "sdpa" and model.training
    directory = tiny_model_dirs["bert"]
    model, tokenizer = user_model(directory)
    ours = attnviz.head_similarity(attnviz.wrap(model, tokenizer), texts=TEXTS[:2])
    theirs = attnviz.head_similarity(attnviz.load_model(str(directory), device="cpu"), texts=TEXTS[:2])
    assert torch.allclose(ours.divergence, theirs.divergence, atol=1e-9)


@pytest.mark.parametrize("mode", ["eval", "mixed"])
def test_statistics_over_several_batches_leave_every_module_mode_as_it_was(tiny_model_dirs, mode):
    """A pass of several batches switches a wrapped model onto the core once; a model in eval mode, or one whose
    modules are in mixed modes, ends with every module's flag as it began, and the statistics equal a loaded copy's."""
    model, tokenizer = user_model(tiny_model_dirs["llama"])
    if mode == "eval":
        model.eval()
    else:
        model.model.layers[0].eval()  # the rest stays in training mode
    flags = [module.training for module in model.modules()]
    loaded = attnviz.wrap(model, tokenizer)
    stats = attnviz.compute_statistics(loaded, TEXTS[:4], batch_size=1, progress=False)
    assert [module.training for module in model.modules()] == flags
    assert model.config._attn_implementation == "sdpa"
    reference = attnviz.compute_statistics(
        attnviz.load_model(str(tiny_model_dirs["llama"])), TEXTS[:4], batch_size=1, progress=False
    )
    for name in ("entropy", "first_token"):
        torch.testing.assert_close(stats.matrix(name), reference.matrix(name), rtol=0, atol=1e-6)
