"""One model interface: commands reach toy and Hugging Face models through the same LoadedModel calls."""

from __future__ import annotations

import sys
import types

import torch

from attnviz.models import specs
from attnviz.models.specs import ModelLoader, load_model, register_loader


def test_own_examples_toy_task_or_none_for_text_models(minilm):
    toy = load_model("toy-previous-token", device="cpu")
    batch = toy.own_examples(5, seed=3)
    again = toy.task_batch(5, 3)
    assert len(batch) == 5 and torch.equal(batch.inputs["input_ids"], again.inputs["input_ids"])
    assert minilm.own_examples(5, seed=3) is None


def test_remove_heads_through_the_contract_on_both_kinds(tiny_model_dirs):
    toy = load_model("toy-previous-token", device="cpu")
    bert = load_model(str(tiny_model_dirs["bert"]), device="cpu")
    for loaded in (toy, bert):
        loaded.check_head_removal()
        site = next(iter(loaded.layout()))
        before = loaded.layout()[site]
        pruned, _ = loaded.remove_heads({site: [0]})
        assert pruned.layout()[site] == before - 1
        assert loaded.layout()[site] == before  # the original is left as it was


def test_a_new_format_is_one_registration(tmp_path, monkeypatch):
    seen = {}

    def load_fake(path, *, name, device, dtype):
        seen.update(path=path, name=name)
        return load_model("toy-copy", device="cpu")

    (tmp_path / "model.fake").write_text("weights")
    monkeypatch.setattr(specs, "LOADERS", list(specs.LOADERS))
    module = types.ModuleType("fake_format_loader")
    module.load_fake = load_fake
    monkeypatch.setitem(sys.modules, "fake_format_loader", module)
    register_loader(ModelLoader("fake", lambda path: path.suffix == ".fake", "fake_format_loader:load_fake"))
    loaded = load_model(str(tmp_path / "model.fake"), device="cpu")
    assert seen == {"path": tmp_path / "model.fake", "name": str(tmp_path / "model.fake")}
    assert loaded.name == "toy-copy"
