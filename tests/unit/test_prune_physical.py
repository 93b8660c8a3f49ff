"""Physical pruning: the smaller model computes what the masked model computes; checkpoints round-trip."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import TEXTS, main_output

from attnviz.common.errors import ModelSpecError, OutputError, UnsupportedModelError
from attnviz.core import AttentionSite
from attnviz.models.head_sets import removal_mask
from attnviz.models.physical import find_attention_blocks, plan_site, prune_heads_physically
from attnviz.models.pruned import load_pruned_model
from attnviz.models.pruned_format import TRANSFORMERS_COPY, save_pruned_checkpoint, write_directory_atomically
from attnviz.models.specs import PRUNED_MARKER, load_model
from attnviz.prune.checkpoint import check_output_dir
from attnviz.prune.cost import parameter_count

# fixtures shared by the pruning tests (tiny BERT, GPT-2 and LLaMA models)

S0, S1 = AttentionSite("self", 0), AttentionSite("self", 1)

#: removals per family; for LLaMA (groups of 4 query heads per key/value head) layer 0 loses
#: heads 1 and 2 of group 0 only (uneven: masked), layer 1 all of group 0 plus head 5 of group 1.
REMOVALS = {
    "bert": {S0: [1], S1: [0, 3]},
    "gpt2": {S0: [0, 2], S1: [3]},
    "llama": {S0: [1, 2], S1: [0, 1, 2, 3, 5]},
}


def _masked_and_pruned(loaded, removed, pruned):
    batch = loaded.encode(TEXTS)
    masked = main_output(loaded, batch, loaded.context(head_mask=removal_mask(loaded.layout(), removed)))
    valid = batch.inputs["attention_mask"].bool()
    return masked[valid], main_output(pruned, batch)[valid]


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_physically_pruned_model_matches_masked_model(tiny_models, family):
    loaded = tiny_models[family]
    removed = REMOVALS[family]
    params_before = parameter_count(loaded.model)
    pruned, plans = prune_heads_physically(loaded, removed)
    masked, ours = _masked_and_pruned(loaded, removed, pruned)
    assert (masked - ours).abs().max() <= 1e-5
    assert parameter_count(pruned.model) < params_before
    assert parameter_count(loaded.model) == params_before  # the original is untouched
    assert sum(len(plan.removed) for plan in plans.values()) == sum(len(h) for h in removed.values())


def test_mha_pruning_slices_every_removed_head(tiny_models):
    loaded = tiny_models["bert"]
    pruned, plans = prune_heads_physically(loaded, REMOVALS["bert"])
    assert pruned.layout() == {S0: 3, S1: 2}
    assert all(not plan.masked for plan in plans.values())
    attention = pruned.model.encoder.layer[1].attention
    assert attention.self.query.out_features == 2 * 8 and attention.output.dense.in_features == 2 * 8
    # per head: query, key, value rows (3·8·32 + 3·8 bias) and output columns (8·32)
    assert parameter_count(loaded.model) - parameter_count(pruned.model) == 3 * (3 * 8 * 32 + 3 * 8 + 8 * 32)


def test_gpt2_fused_projection_keeps_query_key_value_blocks(tiny_models):
    loaded = tiny_models["gpt2"]
    pruned, _ = prune_heads_physically(loaded, {S0: [0, 2]})
    attention = pruned.model.transformer.h[0].attn
    original = loaded.model.transformer.h[0].attn
    assert attention.c_attn.weight.shape == (32, 3 * 16) and attention.split_size == 16
    # the kept heads 1 and 3 of the key block sit at columns 32 + 8 … in the original fused weight
    assert torch.equal(attention.c_attn.weight[:, 16:24], original.c_attn.weight[:, 40:48])
    assert torch.equal(attention.c_proj.weight[8:16], original.c_proj.weight[24:32])


def test_gqa_plans(tiny_models):
    blocks = find_attention_blocks(tiny_models["llama"])
    block = blocks[S0]
    assert (block.family, block.num_heads, block.num_kv_heads, block.group_size) == ("llama", 8, 2, 4)
    # a whole group: its key/value head goes too
    plan = plan_site(block, [4, 5, 6, 7])
    assert plan.keep_kv_heads == [0] and plan.keep_heads == [0, 1, 2, 3] and plan.masked == []
    # one head from every group: group size 4 -> 3, nothing masked
    plan = plan_site(block, [1, 6])
    assert plan.keep_kv_heads == [0, 1] and plan.keep_heads == [0, 2, 3, 4, 5, 7] and plan.masked == []
    # uneven: group 0 loses two, group 1 one -> one sliced from each, head 2 masked
    plan = plan_site(block, [1, 2, 6])
    assert plan.keep_heads == [0, 2, 3, 4, 5, 7] and plan.masked == [2] and plan.sliced == [1, 6]
    # only one group touched: nothing can be sliced, all masked
    plan = plan_site(block, [0, 1])
    assert plan.keep_heads == list(range(8)) and plan.masked == [0, 1]
    with pytest.raises(UnsupportedModelError):
        plan_site(block, list(range(8)))


def test_gqa_pruned_layer_shapes(tiny_models):
    loaded = tiny_models["llama"]
    pruned, plans = prune_heads_physically(loaded, REMOVALS["llama"])
    attention = pruned.model.model.layers[1].self_attn
    assert attention.k_proj.out_features == 8 and attention.q_proj.out_features == 3 * 8
    assert attention.num_key_value_groups == 3
    assert pruned.layout() == {S0: 8, S1: 3}
    assert plans[S0].masked == [1, 2] and plans[S1].sliced == [0, 1, 2, 3, 5]


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_pruned_checkpoint_round_trip(tiny_dirs, tiny_models, tmp_path, family):
    loaded = tiny_models[family]
    removed = REMOVALS[family]
    pruned, plans = prune_heads_physically(loaded, removed)
    out = tmp_path / "pruned"
    save_pruned_checkpoint(
        out,
        source=str(tiny_dirs[family]),
        original=loaded,
        pruned=pruned,
        plans=plans,
        removed=removed,
        transformers_copy=True,
    )
    marker = json.loads((out / PRUNED_MARKER).read_text())
    assert marker["format"] == "attnviz-pruned" and marker["family"] == family
    assert [site["heads"] for site in marker["sites"]] == [len(p.keep_heads) for p in plans.values()]

    reloaded = load_model(str(out), device="cpu")  # through the marker
    assert reloaded.layout() == pruned.layout()
    assert parameter_count(reloaded.model) == parameter_count(pruned.model)
    masked, ours = _masked_and_pruned(loaded, removed, reloaded)
    assert (masked - ours).abs().max() <= 1e-5

    # plain transformers: the physically pruned directory does not fit the config, the masked copy does
    with pytest.raises(RuntimeError, match="size"):
        type(loaded.model).from_pretrained(str(out))
    plain = type(loaded.model).from_pretrained(str(out / TRANSFORMERS_COPY), attn_implementation="eager").eval()
    batch = loaded.encode(TEXTS)
    with torch.no_grad():
        output = plain(**batch.inputs)
    output = output.logits if hasattr(output, "logits") else output.last_hidden_state
    valid = batch.inputs["attention_mask"].bool()
    assert (output[valid].double() - masked).abs().max() <= 1e-5
    assert parameter_count(plain) == parameter_count(loaded.model)


def test_pruned_checkpoint_keeps_dtype(tiny_dirs, tmp_path):
    loaded = load_model(str(tiny_dirs["llama"]), device="cpu", dtype="bfloat16")
    pruned, plans = prune_heads_physically(loaded, REMOVALS["llama"])
    assert {p.dtype for p in pruned.model.parameters()} == {torch.bfloat16}
    save_pruned_checkpoint(
        tmp_path / "bf16",
        source="x",
        original=loaded,
        pruned=pruned,
        plans=plans,
        removed=REMOVALS["llama"],
        transformers_copy=False,
    )
    reloaded = load_pruned_model(tmp_path / "bf16", dtype=torch.bfloat16)
    assert {p.dtype for p in reloaded.model.parameters()} == {torch.bfloat16}
    assert not (tmp_path / "bf16" / TRANSFORMERS_COPY).exists()
    batch = loaded.encode(TEXTS[:2])
    assert torch.equal(main_output(pruned, batch), main_output(reloaded, batch))


def test_damaged_marker_is_a_clear_error(tmp_path):
    (tmp_path / PRUNED_MARKER).write_text("{not json")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelSpecError, match="prune the model again"):
        load_pruned_model(tmp_path)


def test_output_directory_checks(tmp_path):
    source = tmp_path / "model"
    source.mkdir()
    (source / "config.json").write_text("{}")
    with pytest.raises(OutputError, match="overwrite the input"):
        check_output_dir(source, force=True, inputs=[source.resolve()])
    with pytest.raises(OutputError, match="overwrite the input"):
        check_output_dir(source / "inside", force=True, inputs=[source.resolve()])
    with pytest.raises(OutputError, match="overwrite the input"):
        check_output_dir(tmp_path, force=True, inputs=[source.resolve()])  # --force would delete the input
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("x")
    with pytest.raises(OutputError, match="add force to replace it"):
        check_output_dir(full, force=False)
    assert check_output_dir(full, force=True) == full
    assert check_output_dir(tmp_path / "new", force=False) == tmp_path / "new"


def test_directory_write_is_atomic(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")

    def failing(tmp):
        (tmp / "half.txt").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OutputError, match="disk full"):
        write_directory_atomically(out, failing)
    assert [p.name for p in out.iterdir()] == ["old.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary left behind
    write_directory_atomically(out, lambda tmp: (tmp / "new.txt").write_text("new"))
    assert [p.name for p in out.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
