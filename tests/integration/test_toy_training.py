"""Training toy models: determinism for a seed, the progress/metrics, `attnviz train` and its checkpoint series."""

from __future__ import annotations

import json
import os

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from attnviz.common.errors import AttnvizError
from attnviz.models.specs import load_model
from attnviz.toy import TrainingSettings, build_toy_model, checkpoint_series, train_toy_model
from attnviz.toy.training import learning_rate_at

TINY = {"width": 16, "num_heads": 2, "num_layers": 1, "mlp_width": 16}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _train(seed: int, steps: int = 6, task: str = "copy", **fields):
    loaded = build_toy_model(task, max_length=4, **{**TINY, **fields})
    return train_toy_model(
        loaded, TrainingSettings(steps=steps, batch_size=8, seed=seed, eval_examples=20, warmup_steps=2)
    )


def test_training_is_deterministic_for_a_seed():
    torch.manual_seed(123)  # the caller's RNG must not matter, nor be changed
    state_before = torch.random.get_rng_state()
    first = _train(seed=7)
    assert torch.equal(torch.random.get_rng_state(), state_before)
    torch.manual_seed(999)
    second = _train(seed=7)
    other = _train(seed=8)
    for name, tensor in first.model.model.state_dict().items():
        assert torch.equal(tensor, second.model.model.state_dict()[name]), name
    assert any(not torch.equal(t, other.model.model.state_dict()[n]) for n, t in first.model.model.state_dict().items())
    assert first.held_out == second.held_out
    assert [h["loss"] for h in first.history] == [h["loss"] for h in second.history]


def test_training_reduces_the_loss_and_records_metadata():
    result = _train(seed=0, steps=60, task="previous-token", num_layers=1)
    assert result.history[-1]["loss"] < result.history[0]["loss"] - 0.5
    assert set(result.held_out) >= {"loss", "accuracy", "sequence_accuracy"}
    assert result.model.metadata["step"] == 60
    assert result.model.metadata["training"]["settings"]["seed"] == 0


def test_learning_rate_schedule():
    settings = TrainingSettings(steps=100, learning_rate=1.0, warmup_steps=10)
    assert learning_rate_at(0, settings) == pytest.approx(0.1)
    assert learning_rate_at(9, settings) == pytest.approx(1.0)
    assert learning_rate_at(99, settings) == pytest.approx(0.1, abs=1e-3)


def test_training_settings_errors():
    with pytest.raises(AttnvizError, match="steps must be at least 1"):
        TrainingSettings(steps=0).validate()
    with pytest.raises(AttnvizError, match="checkpoint_every must be at least 1"):
        TrainingSettings(checkpoint_every=0).validate()


# -- the command ----------------------------------------------------------------------------------------------


def test_train_command_saves_a_series(tmp_path, capsys):
    out = tmp_path / "toy-copy"
    result = run_cli(
        capsys,
        "train",
        "copy", "--out", str(out), "--steps", "6", "--checkpoint-every", "2", "--width", "16", "--heads", "2",
        "--layers", "1", "--lengths", "2:4", "--batch-size", "8", "--eval-examples", "20",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    document = json.loads((out / "attnviz-toy.json").read_text())
    assert document["step"] == 6 and document["metadata"]["held_out"]["examples"] == 20
    series = checkpoint_series(out)
    assert [step for step, _ in series] == [2, 4]
    loaded = [load_model(str(path), device="cpu") for _, path in series]
    assert [m.metadata["step"] for m in loaded] == [2, 4]
    assert not torch.equal(loaded[0].model.lm_head.weight, loaded[1].model.lm_head.weight)
    assert not list(tmp_path.glob(".*tmp"))  # no staging directory left behind


@pytest.mark.parametrize(
    "args, message",
    [
        (["reverse", "--width", "30", "--heads", "4"], "4 heads do not divide the width 30"),
        (["reverse", "--window", "-1"], "window must be 0 or more"),
        (["induction", "--architecture", "encoder-decoder"], "does not fit the encoder-decoder architecture"),
        (["reverse", "--lengths", "three"], "is not MIN:MAX"),
    ],
)
def test_train_command_bad_input(tmp_path, capsys, args, message):
    result = run_cli(capsys, "train", *args, "--out", tmp_path / "out", "--steps", "1")
    assert_clean_error(result, message)
    assert not (tmp_path / "out").exists()


def test_train_command_refuses_a_foreign_directory(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "thesis.tex").write_text("mine")
    result = run_cli(capsys, "train", "copy", "--out", tmp_path / "out", "--steps", "1")
    assert_clean_error(result, "not an attnviz toy checkpoint")
    assert (tmp_path / "out" / "thesis.tex").read_text() == "mine"


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["add"], ["unknown task 'add': use one of copy", "induction"]),
        (["reverse", "--attention", "flash"], ["unknown attention variant 'flash'", "performer", "scaled-dot"]),
        (["reverse", "--architecture", "both"], ["unknown architecture 'both'", "encoder-decoder"]),
    ],
)
def test_train_choices_are_closed_sets(capsys, tmp_path, args, fragments):
    result = run_cli(capsys, "train", *args, "--out", str(tmp_path / "out"), "--steps", "1")
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()  # one line, with every allowed value
    assert line.startswith("error:") and all(fragment in line for fragment in fragments), line
    assert not (tmp_path / "out").exists()


def test_train_help_lists_the_choices(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # one help row per option, so a choice list is not wrapped
    result = run_cli(capsys, "train", "--help")
    text = " ".join(result.stdout.split())
    for choice in ("copy|reverse|sort|previous-token|induction", "encoder|decoder|encoder-decoder", "performer"):
        assert choice in text, text
