"""One model interface: Hugging Face and toy models answer the same LoadedModel calls for pruning, probing and
batching, and no code outside ``attnviz/models`` and ``attnviz/toy`` asks which kind of model it has."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from tiny_models import TEXTS

from attnviz.common.errors import InputError, UnsupportedModelError
from attnviz.core import AttentionSite
from attnviz.models.base import LoadedModel, PrunedCopy
from attnviz.models.hf import HFModel
from attnviz.models.objective import LanguageModelObjective, RepresentationObjective
from attnviz.models.specs import load_model
from attnviz.models.vision import VisionModel
from attnviz.prune.checkpoint import model_source_paths
from attnviz.prune.cost import forward_output
from attnviz.prune.judging import judging_batches
from attnviz.toy import build_toy_model
from attnviz.toy.loaded import ToyModel
from attnviz.toy.task_objective import TaskObjective

PACKAGE = Path(__file__).resolve().parents[2] / "attnviz"

#: what commands ask of a model beyond encode / forward / layout, where the base class can only refuse or
#: guess: each kind implements every one (own_examples, token_counts, default_probe_length have defaults
#: that fit any model)
CONTRACT = (
    "check_objective",
    "objective",
    "check_head_removal",
    "remove_heads",
    "save_pruned",
    "source_paths",
    "timing_batch",
    "probe_batches",
    "with_model",
)
#: names of the classes that implement LoadedModel: nothing outside the models layer may test for them
MODEL_CLASSES = {"HFModel", "ToyModel", "ToyTransformer"}
#: variable names that hold a loaded model in the library
MODEL_VARIABLES = {"loaded", "original", "pruned"}
S0 = AttentionSite("self", 0)


@pytest.fixture(scope="module")
def toy():
    torch.manual_seed(0)
    return build_toy_model("reverse", architecture="decoder", width=16, num_heads=2, num_layers=2, mlp_width=16)


def test_both_kinds_implement_the_whole_contract():
    for kind in (HFModel, ToyModel, VisionModel):
        inherited = [name for name in CONTRACT if getattr(kind, name) is getattr(LoadedModel, name)]
        assert inherited == [], f"{kind.__name__} leaves {inherited} to the base class"


def _kind_questions(source: str, module: str) -> list[str]:
    """``is_toy(...)``, ``hasattr(loaded, ...)``, ``getattr(loaded, "...", default)``, ``isinstance(x, ToyModel)``
    and imports of the model classes in one module's ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        where = f"{module}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ImportFrom) and any(alias.name in MODEL_CLASSES for alias in node.names):
            found.append(f"{where} imports {', '.join(a.name for a in node.names if a.name in MODEL_CLASSES)}")
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        name, args = node.func.id, node.args
        subject = ast.unparse(args[0]).split(".")[-1] if args else ""
        asks_for_attribute = (
            name == "hasattr" or (name == "getattr" and len(args) == 3)
        ) and subject in MODEL_VARIABLES
        tests_class = name == "isinstance" and len(args) == 2 and set(ast.unparse(args[1]).split(".")) & MODEL_CLASSES
        if name == "is_toy":
            found.append(f"{where} calls is_toy")
        elif asks_for_attribute or tests_class:
            found.append(f"{where} {ast.unparse(node)}")
    return found


def test_no_code_outside_the_models_layer_asks_which_kind_of_model_it_has():
    outside = [
        path for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).parts[0] not in ("models", "toy")
    ]
    assert len(outside) > 50  # the scan sees the package
    questions = [
        question
        for path in outside
        for question in _kind_questions(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    ]
    assert questions == []


def test_the_scan_catches_each_kind_question():
    source = (
        "from attnviz.toy.loaded import ToyModel\n"
        "def f(loaded, outcome):\n"
        "    is_toy(loaded)\n"
        "    hasattr(loaded, 'task_loss')\n"
        "    getattr(outcome.original, 'fallback', False)\n"
        "    isinstance(loaded, ToyModel)\n"
        "    getattr(loaded, 'name')\n"  # a plain attribute read: not a question
    )
    questions = _kind_questions(source, "probe.py")
    assert [q.split(" ", 1)[1] for q in questions] == [
        "imports ToyModel",
        "calls is_toy",
        "hasattr(loaded, 'task_loss')",
        "getattr(outcome.original, 'fallback', False)",
        "isinstance(loaded, ToyModel)",
    ]


# -- the contract's answers, against references -------------------------------------------------------


def test_each_kind_names_its_objective(tiny_models, toy):
    bert, gpt2 = tiny_models["bert"], tiny_models["gpt2"]
    batches = {name: [model.encode(TEXTS[:2])] for name, model in (("bert", bert), ("gpt2", gpt2))}
    assert type(gpt2.objective(batches["gpt2"])) is LanguageModelObjective  # causal with an LM head
    assert type(bert.objective(batches["bert"], probes=2, seed=1)) is RepresentationObjective  # no labels
    task = toy.objective(toy.own_example_batches(8, batch_size=4, seed=0))
    assert type(task) is TaskObjective and task.kind == "task"
    # the task objective's loss is the toy's own label loss, token-weighted over batches
    with torch.no_grad():
        losses = [(toy.task_loss(batch), int((batch.inputs["labels"] != -100).sum())) for batch in task.batches]
    expected = sum(float(loss) * count for loss, count in losses) / sum(count for _, count in losses)
    assert task.loss() == pytest.approx(expected, rel=1e-6)


def test_encoder_decoder_and_fallback_models_are_refused_before_any_data(tiny_models):
    bert = tiny_models["bert"]
    for attribute, message in (("encoder_decoder", "encoder-decoder"), ("fallback", "attention interface")):
        odd = HFModel(bert.model, bert.tokenizer, name="odd")
        setattr(odd, attribute, True)
        with pytest.raises(UnsupportedModelError, match=message):
            odd.check_objective()
        with pytest.raises(UnsupportedModelError, match=message):
            odd.objective([])


def test_own_example_batches_are_the_toy_task_and_none_for_text(tiny_models, toy):
    batches = toy.own_example_batches(10, batch_size=4, seed=5)
    assert [len(batch) for batch in batches] == [4, 4, 2]
    for index, batch in enumerate(batches):  # batch i is the task drawn with seed 5 · 1_000_003 + i
        reference = toy.task_batch(len(batch), 5 * 1_000_003 + index)
        assert torch.equal(batch.inputs["input_ids"], reference.inputs["input_ids"])
    assert tiny_models["bert"].own_example_batches(10, batch_size=4, seed=5) is None


def test_judging_batches_draw_fresh_toy_data_and_reuse_texts(tiny_models, toy):
    settings = {"own_examples": 6, "batch_size": None, "max_tokens_per_batch": None, "max_length": None, "seed": 2}
    scoring, evaluation = judging_batches(toy, ["ignored"], None, **settings)
    assert sum(len(b) for b in scoring) == 6 and sum(len(b) for b in evaluation) == 6
    assert torch.equal(scoring[0].inputs["input_ids"], toy.task_batch(6, 2 * 1_000_003).inputs["input_ids"])
    assert torch.equal(evaluation[0].inputs["input_ids"], toy.task_batch(6, 3 * 1_000_003).inputs["input_ids"])
    bert = tiny_models["bert"]
    scoring, evaluation = judging_batches(bert, TEXTS, None, **settings)
    assert evaluation is scoring and sorted(t for b in scoring for t in b.lengths) == sorted(bert.token_counts(TEXTS))
    with pytest.raises(InputError, match="no text"):
        judging_batches(bert, [], None, **settings)
    from attnviz.common.texts import load_texts

    scoring, _ = judging_batches(bert, None, None, **settings)  # no text given: the shipped corpus
    assert sum(len(b) for b in scoring) == len([text for text in load_texts() if text.strip()])


def test_prune_without_text_uses_the_shipped_corpus(tiny_models):
    from attnviz.common.texts import load_texts
    from attnviz.prune.pipeline import PruneConfig, prune_model

    config = PruneConfig(count=1, importance="random", max_length=64, latency_tokens=16, latency_repeats=1)
    default = prune_model(tiny_models["bert"], config).report
    given = prune_model(tiny_models["bert"], config, texts=load_texts()).report
    assert default.scoring_units == given.scoring_units > 100 and default.latency_tokens == 16
    assert default.loss_after == pytest.approx(given.loss_after)


def test_timing_batch_has_the_length_asked_for(tiny_models, toy):
    bert = tiny_models["bert"]
    batch = bert.timing_batch(40, texts=TEXTS[:1])
    assert batch.lengths == [40] and batch.special[0][0] and batch.special[0][-1]  # [CLS] … [SEP], cut silently
    ids = batch.inputs["input_ids"][0].tolist()
    assert bert.tokenizer.convert_ids_to_tokens(ids) == batch.tokens[0]
    drawn = toy.timing_batch(500, texts=[], seed=4)
    assert drawn.lengths == [toy.max_length]  # capped at the position table
    assert torch.equal(drawn.inputs["input_ids"], toy.timing_batch(500, texts=[], seed=4).inputs["input_ids"])
    assert set(drawn.tokens[0]) <= set(toy.tokenizer.symbols)


def test_token_counts_match_encode(tiny_models, toy):
    bert = tiny_models["bert"]
    assert bert.token_counts(TEXTS) == [len(bert.encode([text]).tokens[0]) for text in TEXTS]
    assert toy.token_counts(["1 2 3", "4 5"]) == [len(toy.encode([t]).tokens[0]) for t in ("1 2 3", "4 5")]


def test_probe_batches_repeat_a_block_on_both_kinds(tiny_models, toy):
    for loaded in (tiny_models["gpt2"], toy):
        (probe,) = loaded.probe_batches(3, 2, seed=0, batch_size=2)
        start = probe.source_start
        ids = probe.batch.inputs["input_ids"]  # [2, framing + 6]
        assert torch.equal(ids[:, start : start + 3], ids[:, start + 3 : start + 6])


def test_save_pruned_round_trips_on_both_kinds(tiny_models, tiny_dirs, toy, tmp_path):
    gpt2 = tiny_models["gpt2"]
    for name, loaded in (("gpt2", gpt2), ("toy", toy)):
        pruned, plans = loaded.remove_heads({S0: [1]})
        out = tmp_path / name
        path, copy = loaded.save_pruned(out, PrunedCopy(pruned, {S0: [1]}, plans), source=name)
        reloaded = load_model(str(path), device="cpu")
        assert reloaded.layout() == pruned.layout() and reloaded.layout()[S0] == loaded.layout()[S0] - 1
        batch = pruned.encode(["1 2 3 4" if name == "toy" else TEXTS[0]])
        torch.testing.assert_close(forward_output(reloaded, batch), forward_output(pruned, batch), rtol=0, atol=1e-6)
        assert copy is None  # the transformers-masked copy is written only when asked for
    pruned, plans = gpt2.remove_heads({S0: [1]})
    copy_path = gpt2.save_pruned(
        tmp_path / "gpt2-with-copy", PrunedCopy(pruned, {S0: [1]}, plans), source="gpt2", transformers_copy=True
    )[1]
    assert copy_path is not None and copy_path.is_dir() and copy_path.parent == tmp_path / "gpt2-with-copy"
    marker = json.loads((tmp_path / "gpt2" / "attnviz-pruned.json").read_text())
    assert marker["sites"][0]["removed_heads"] == [1] and marker["source"] == "gpt2"
    # the pruned checkpoint now guards itself as an input
    assert Path(tmp_path / "gpt2").resolve() in model_source_paths("gpt2", load_model(str(tmp_path / "gpt2")))
    assert tiny_dirs["gpt2"].resolve() in gpt2.source_paths()
