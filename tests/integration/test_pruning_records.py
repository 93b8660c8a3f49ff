"""Pruning records are believed only once checked against the weights they describe.

A pruned Hugging Face checkpoint's ``attnviz-pruned.json`` and a pruned toy checkpoint's history of removals are
text a user can edit: every record that names a head the layer does not have, names a head twice, or gives counts
the weights do not hold is refused with one ``error:`` line naming the file; ``diff`` never pairs heads of models
pruned from different layouts. Hypothesis edits records at random: each edit either loads a model whose head
numbers fit its weights, or gives one error.
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest
from bad_input_helpers import TOY
from cli_helpers import assert_clean_error, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnviz.common.errors import ModelSpecError
from attnviz.core import AttentionSite
from attnviz.models.physical import prune_heads_physically
from attnviz.models.pruned_format import save_pruned_checkpoint
from attnviz.models.specs import load_model

MARKER = "attnviz-pruned.json"
TOY_MARKER = "attnviz-toy.json"
S0, S1 = AttentionSite("self", 0), AttentionSite("self", 1)
TEXT = "The cat sat on the mat."


@pytest.fixture(scope="module")
def pruned_bert(tiny_dirs, tiny_models, tmp_path_factory):
    """Tiny BERT (2 layers × 4 heads) without head 1 of layer 0 and heads 0, 2 of layer 1; its record."""
    loaded = tiny_models["bert"]
    removed = {S0: [1], S1: [0, 2]}
    pruned, plans = prune_heads_physically(loaded, removed)
    out = tmp_path_factory.mktemp("records") / "pruned-bert"
    save_pruned_checkpoint(
        out, source="tiny", original=loaded, pruned=pruned, plans=plans, removed=removed, transformers_copy=False
    )
    return out, json.loads((out / MARKER).read_text())


def edited_copy(pruned_bert, tmp_path, edit):
    source, record = pruned_bert
    target = tmp_path / "edited"
    shutil.copytree(source, target)
    changed = copy.deepcopy(record)
    edit(changed)
    (target / MARKER).write_text(json.dumps(changed))
    return target


def _site(index, **fields):
    return lambda record: record["sites"][index].update(fields)


LIES = [
    ("head-the-layer-lacks", _site(0, kept_heads=[0, 2, 7]), ["kept_heads", "head 7", "0–3"]),
    ("removed-twice", _site(1, removed_heads=[0, 0, 2]), ["removed_heads", "head 0 more than once"]),
    ("kept-twice", _site(1, kept_heads=[1, 1]), ["kept_heads", "head 1 more than once"]),
    ("count-disagrees", _site(1, heads=3), ["kept_heads lists 2", "3"]),
    ("kept-beyond-heads", _site(1, kept_heads=[1, 9]), ["head 9"]),
    (
        "weights-hold-fewer",
        _site(1, kept_heads=[1, 2, 3], heads=3, kv_heads=3, kept_kv_heads=[1, 2, 3], removed_heads=[0]),
        ["weights hold", "[32, 16]", "[32, 24]"],
    ),
    ("removed-not-kept-disagree", _site(0, removed_heads=[2]), ["removed_heads", "kept_heads"]),
    ("original-of-another-model", _site(0, original_heads=12), ["12 heads", "4"]),
    ("site-the-model-lacks", _site(1, layer=5), ["self.5"]),
    ("site-twice", lambda r: r["sites"].append(copy.deepcopy(r["sites"][0])), ["self.0 twice"]),
    ("sites-not-a-list", lambda r: r.update(sites={"self.0": [1]}), ['"sites"']),
    ("count-is-text", _site(1, heads="2"), ["'2'"]),
]


@pytest.mark.parametrize("edit, fragments", [(e, f) for _, e, f in LIES], ids=[name for name, _, _ in LIES])
def test_a_record_that_lies_is_one_error_naming_the_file(capsys, pruned_bert, tiny_dirs, tmp_path, edit, fragments):
    lying = edited_copy(pruned_bert, tmp_path, edit)
    result = run_cli(capsys, "diff", tiny_dirs["bert"], lying, "--text", TEXT)
    assert_clean_error(result, f"{lying / MARKER}", *fragments)
    assert len(result.error_lines()) == 1 and not result.stdout.strip()


def test_honest_record_still_pairs_heads_by_original_number(pruned_bert, tiny_models):
    from attnviz.compare.models import compare_models

    result = compare_models(tiny_models["bert"], load_model(str(pruned_bert[0])), [TEXT], progress=False)
    assert sorted(result.only("only_a")) == [("self", 0, 1), ("self", 1, 0), ("self", 1, 2)]
    layer0 = [h for h in result.heads if h.site == S0 and h.status == "matched"]
    assert [h.head for h in layer0] == [0, 2, 3] and all(h.js_divergence <= 1e-6 for h in layer0)


def test_pruned_tiny_model_is_not_paired_head_by_head_with_minilm(capsys, pruned_bert, minilm):
    result = run_cli(capsys, "diff", "minilm", pruned_bert[0], "--text", TEXT)
    assert_clean_error(result, "6 self layers × 12 heads", "2 self layers × 4 heads", "--by-statistics")
    assert "JS" not in result.stdout


def test_pruning_a_pruned_checkpoint_keeps_original_numbers(pruned_bert, tmp_path):
    """Layer 0 kept heads 0, 2, 3; removing its position 0 again leaves original heads 2 and 3."""
    once = load_model(str(pruned_bert[0]))
    twice, plans = prune_heads_physically(once, {S0: [0]})
    out = tmp_path / "twice"
    save_pruned_checkpoint(
        out, source="once", original=once, pruned=twice, plans=plans, removed={S0: [0]}, transformers_copy=False
    )
    reloaded = load_model(str(out))
    assert reloaded.head_identity.ids("self", 0, 2) == [2, 3]
    assert reloaded.head_identity.ids("self", 1, 2) == [1, 3]


# -- toy checkpoints: the history of removals --------------------------------------------------------------


def toy_with_history(tmp_path, history):
    target = tmp_path / "toy"
    shutil.copytree(TOY, target)
    document = json.loads((target / TOY_MARKER).read_text())
    document.setdefault("metadata", {})["pruned"] = {"from": "toy", "removed": history}
    (target / TOY_MARKER).write_text(json.dumps(document))
    return target


@pytest.mark.parametrize(
    "history, fragments",
    [
        ({"self.0": [1]}, ['"removed" is not a list']),
        ([["self.0", 1]], ['"removed" is not a list']),
        ([{"self.0": [1]}], ["leave self.0 3 of 4 heads", "weights hold 4"]),
        ([{"self.9": [1]}], ["self.9"]),
        ([{"self.0": [1, 1]}], ["head 1 more than once"]),
        ([{"self.0": "1"}], ["not a list of head numbers"]),
    ],
)
def test_toy_history_that_lies_is_one_error(capsys, tmp_path, history, fragments):
    toy = toy_with_history(tmp_path, history)
    result = run_cli(capsys, "stats", toy)
    assert_clean_error(result, f"{toy / TOY_MARKER}", *fragments)


# -- random edits ------------------------------------------------------------------------------------------

FIELDS = ["stack", "layer", "heads", "kv_heads", "original_heads", "original_kv_heads", "kept_heads"]
FIELDS += ["kept_kv_heads", "removed_heads", "masked_heads"]
SMALL = st.integers(-2, 6)
VALUES = st.one_of(
    SMALL,
    st.lists(SMALL, max_size=5),
    st.sampled_from([None, True, "self", "0", 2.0, {}, {"0": 1}, [[1]], "cross"]),
)
EDIT = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 1), st.sampled_from(FIELDS), VALUES),
    st.tuples(st.just("delete"), st.integers(0, 1), st.sampled_from(FIELDS), st.none()),
    st.tuples(st.just("sites"), st.none(), st.none(), st.one_of(VALUES, st.just([]))),
    st.tuples(st.just("swap"), st.none(), st.none(), st.none()),
)


def apply_edit(record, edit):
    kind, index, field, value = edit
    if kind == "set":
        record["sites"][index][field] = value
    elif kind == "delete":
        record["sites"][index].pop(field, None)
    elif kind == "sites":
        record["sites"] = value
    else:  # the two layers' entries swapped: each names the other's heads
        first, second = record["sites"]
        first["layer"], second["layer"] = second["layer"], first["layer"]


@pytest.fixture(scope="module")
def scratch(pruned_bert, tmp_path_factory):
    target = tmp_path_factory.mktemp("fuzz-records") / "pruned"
    shutil.copytree(pruned_bert[0], target)
    return target


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(edits=st.lists(EDIT, min_size=1, max_size=3))
def test_random_edits_load_a_consistent_model_or_give_one_error(pruned_bert, scratch, edits):
    record = copy.deepcopy(pruned_bert[1])
    for edit in edits:
        try:
            apply_edit(record, edit)
        except (TypeError, KeyError, IndexError, ValueError, AttributeError):
            break  # an earlier edit replaced what this one edits: the record stays as it is
    (scratch / MARKER).write_text(json.dumps(record))
    try:
        loaded = load_model(str(scratch))
    except ModelSpecError as exc:
        message = str(exc)
        assert "\n" not in message and str(scratch) in message, message
        return
    identity = loaded.head_identity
    for site, count in loaded.layout().items():
        ids = identity.ids(site.stack, site.layer, count)
        original = identity.original_heads[site.stack][site.layer]
        assert len(ids) == count and len(set(ids)) == count and all(0 <= i < original for i in ids)
        assert set(identity.masked_ids(site.stack, site.layer)) <= set(ids)
