"""Every command with its default options on every kind of model attnviz loads: a check meant for one kind never
refuses another.

The kinds: tiny random Hugging Face models of each architecture (a BERT encoder, GPT-2, LLaMA with grouped-query
attention, a BART encoder-decoder, a ViT classifier) and the shipped toys (the copy decoder, the toy ViT). The text
models read SmolLM2's 8,192 positions (the size at which a toy-only memory estimate refused ``prune smollm2``), and
every run sees 1 GB of free memory (:data:`MEMORY`, a small CI runner): a resource estimate of
:mod:`attnviz.common.resources` applied where it does not belong asks for hundreds of GB and shows up as a refusal.
Where a command legitimately refuses a kind (probes on a vision model, alignment without cross-attention) the test
asserts that refusal: exit code 2 and the one ``error:`` line expected.

The second half takes the estimates one by one (:data:`ESTIMATES`): each is reached by the documented default command
it guards and passes it under :data:`MEMORY`; made to refuse, it names an option that command has.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli
from tiny_models import TEXTS, tiny_config
from tiny_vision import build_tiny_vision_model, sample_images

from attnviz.cli.errors import flag_for
from attnviz.common import resources

#: free memory every run sees: a small CI runner (a wrongly applied estimate asks for hundreds of GB)
MEMORY = 2**30
#: SmolLM2's positions, which the tiny text models take too
POSITIONS = 8192
TEXT_KINDS = ("bert", "gpt2", "llama", "bart")
VISION_KINDS = ("vit", "toy-odd-patch")
TOY_KINDS = ("toy", "toy-odd-patch")
KINDS = (*TEXT_KINDS, "vit", "toy", "toy-odd-patch")
COMMANDS = ("heatmap", "capture", "stats", "heads", "report", "prune", "align", "diff")

_NO_CROSS_ATTENTION = "has no cross-attention: alignment needs an encoder-decoder model"
_VISION_ALIGN = "is a vision model: align scores cross-attention against word alignments"
_VISION_PROBES = "is a vision model: the head probes (previous-token, induction, duplicate-token) are text tools"
_VISION_TEXT = "is a vision model: give it an image"  # diff reads text
#: the atlas is for text and token toys: said first, whatever else was asked (--weighting norm), with what to do instead
_VISION_REPORT = "is a vision model: the head atlas is drawn for text and token-toy models; measure its heads on images"
#: (command, kind) -> a fragment of the one error line of its legitimate refusal; every other pair must succeed
REFUSALS: dict[tuple[str, str], str] = {
    **{("align", kind): _NO_CROSS_ATTENTION for kind in ("bert", "gpt2", "llama", "toy")},
    **{("align", kind): _VISION_ALIGN for kind in VISION_KINDS},
    **{("heads", kind): _VISION_PROBES for kind in VISION_KINDS},
    **{("report", kind): _VISION_REPORT for kind in VISION_KINDS},
    **{("diff", kind): _VISION_TEXT for kind in VISION_KINDS},
    ("prune", "bart"): "is an encoder-decoder model: attnviz prune supports encoder-only and decoder-only",
}


def _build_text_model(family: str, path: Path) -> str:
    """A tiny random ``family`` model reading SmolLM2's 8,192 positions, with MiniLM's tokenizer."""
    import transformers

    from attnviz.models.specs import minilm_path

    model_class, config = tiny_config(family)
    for field in ("max_position_embeddings", "n_positions"):
        if hasattr(config, field):
            setattr(config, field, POSITIONS)
    torch.manual_seed(0)
    model_class._from_config(config, attn_implementation="eager").save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """``{kind: model spec}``."""
    root = tmp_path_factory.mktemp("kinds")
    specs = {family: _build_text_model(family, root / family) for family in TEXT_KINDS}
    specs["vit"] = str(build_tiny_vision_model("vit", root / "vit"))
    specs.update({"toy": "toy-copy", "toy-odd-patch": "toy-odd-patch"})
    return specs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """Two short texts, a folder of eight pictures (the fewest pruning judges on), word-aligned digit pairs."""
    root = tmp_path_factory.mktemp("inputs")
    (root / "short.txt").write_text("\n".join(TEXTS[:2]) + "\n", encoding="utf-8")
    (root / "pictures").mkdir()
    for index, image in enumerate(sample_images(8, seed=1, size=32)):
        image.save(root / "pictures" / f"picture-{index}.png")
    (root / "pairs.jsonl").write_text(
        '{"source": "2 6 0 1 8", "target": "8 1 0 6 2", "alignment": "0-4 1-3 2-2 3-1 4-0"}\n'
        '{"source": "5 9 0", "target": "0 9 5", "alignment": "0-2 1-1 2-0"}\n',
        encoding="utf-8",
    )
    return {"text": root / "short.txt", "pictures": root / "pictures", "pairs": root / "pairs.jsonl"}


@pytest.fixture
def small_machine(monkeypatch):
    """Every estimate sees :data:`MEMORY` free (``budget['bytes']`` changes it)."""
    budget = {"bytes": MEMORY}
    monkeypatch.setattr(resources, "available_memory", lambda: budget["bytes"])
    monkeypatch.setattr("attnviz.toy.config.available_memory", lambda: budget["bytes"])
    return budget


def command_line(command: str, kind: str, model: str, inputs: dict[str, Path], out: Path) -> list[object]:
    """``attnviz COMMAND`` with its default options on ``model``, given the input it needs (a short one)."""
    if kind in VISION_KINDS:
        one_input: list[object] = ["--image", inputs["pictures"] / "picture-0.png"]
        data: list[object] = [] if kind in TOY_KINDS else ["--images", inputs["pictures"]]
    else:
        one_input = ["0 1 2 3"] if kind in TOY_KINDS else ["The cat sat on the mat."]
        data = [] if kind in TOY_KINDS else ["--data", inputs["text"]]
    text_data = [] if kind in VISION_KINDS else data
    return {
        "heatmap": ["heatmap", *one_input, "--model", model, "--out", out / "heatmap.png"],
        "capture": ["capture", *one_input, "--model", model, "--out", out / "capture.safetensors"],
        "stats": ["stats", model, *data],
        "heads": ["heads", model],
        "report": ["report", model, *text_data, "--out", out / "report.html"],  # text only (a vision model refuses)
        "prune": ["prune", model, *data, "--ratio", "0.25", "--out", out / "pruned"],
        "align": ["align", model, "--data", inputs["pairs"]],
        "diff": ["diff", model, model, *text_data],
    }[command]


@pytest.mark.parametrize("kind", KINDS)
def test_every_command_with_its_defaults(capsys, tmp_path, kind, models, inputs, small_machine, one_torch_thread):
    outcomes, expected = {}, {}
    for command in COMMANDS:
        out = tmp_path / command
        out.mkdir()
        result = run_cli(capsys, *command_line(command, kind, models[kind], inputs, out))
        assert "Traceback" not in result.stderr, f"{command} on {kind}:\n{result.stderr[-3000:]}"
        refusal = REFUSALS.get((command, kind))
        errors = result.error_lines()
        if refusal is not None and len(errors) == 1 and refusal in errors[0]:
            errors = [refusal]  # the expected line (it names the model's folder)
        outcomes[command] = (result.exit_code, errors)
        expected[command] = (0, []) if refusal is None else (2, [refusal])
        if refusal is not None:  # refused before writing anything
            assert list(out.iterdir()) == [], f"{command} on {kind} wrote {list(out.iterdir())}"
    assert outcomes == expected


# -- the estimates one by one -------------------------------------------------------------------------------------

#: estimate -> (module that makes it, the parameter it blames, the documented default command that reaches it,
#: the kind it runs on); the command's options are its defaults but for what it needs (an output, a ratio)
ESTIMATES = {
    "own examples held at once (prune)": ("attnviz.models.base", "toy_examples", "prune", "toy"),
    "one batch of a toy's examples (stats)": ("attnviz.toy.loaded", "toy_examples", "stats", "toy"),
    "a toy ViT's task images (stats)": ("attnviz.common.resources", "toy_examples", "stats", "toy-odd-patch"),
    "probe sequences (heads)": ("attnviz.heads.probes", "sequences", "heads", "llama"),
    "attention of generated tokens (capture --generate)": (
        "attnviz.captures.generation",
        "max_new_tokens",
        "generate",
        "llama",
    ),
    "a toy task's vocabulary (train)": ("attnviz.toy.tasks", "num_symbols", "train", "toy"),
    "a toy's weights (train)": ("attnviz.toy.config", None, "train", "toy"),
    "one training step (train)": ("attnviz.toy.training", "batch_size", "train", "toy"),
}
#: modules that import ``require_memory`` by name (``attnviz.models.vision`` imports it from resources when it runs)
ESTIMATING_MODULES = sorted({module for module, *_ in ESTIMATES.values()})


def _estimate_command(command: str, kind: str, models, inputs, out: Path) -> list[object]:
    if command == "generate":  # docs/capture.md: capture "The capital of France is" --model smollm2 --generate 8
        return [
            "capture",
            "The capital of France is",
            "--model",
            models[kind],
            "--generate",
            "8",
            "--out",
            out / "g.safetensors",
        ]
    if command == "train":  # docs: attnviz train copy --out … (default width, heads, batch; two steps)
        return ["train", "copy", "--steps", "2", "--out", out / "toy"]
    return command_line(command, kind, models[kind], inputs, out)


def _options_of(command: str) -> set[str]:
    import typer

    from attnviz.cli.app import app

    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {option for parameter in click_command.params for option in getattr(parameter, "opts", ())}


@pytest.mark.parametrize("estimate", ESTIMATES)
def test_each_estimate_passes_the_documented_defaults_and_names_an_option_of_its_command(
    capsys, tmp_path, monkeypatch, estimate, models, inputs, small_machine, one_torch_thread
):
    module, parameter, command, kind = ESTIMATES[estimate]
    made: list[tuple[str, str, float]] = []
    original = resources.require_memory
    refuse_in = {"module": ""}

    for name in ESTIMATING_MODULES:

        def recording(blamed, value, needed, what, _module=name):
            made.append((_module, blamed, needed))
            if refuse_in["module"] == _module:  # this estimate made to refuse: more than the machine has
                needed = small_machine["bytes"] + 1.0
            original(blamed, value, needed, what)

        monkeypatch.setattr(f"{name}.require_memory", recording)

    checks = []  # the weights estimate asks for the free memory, and estimates only when over it
    monkeypatch.setattr("attnviz.toy.config.available_memory", lambda: checks.append(1) or small_machine["bytes"])
    out = tmp_path / "defaults"
    out.mkdir()
    args = _estimate_command(command, kind, models, inputs, out)
    result = run_cli(capsys, *args)
    assert result.exit_code == 0, result.stderr[-3000:]
    if module == "attnviz.toy.config":
        assert checks and all(m != module for m, *_ in made)
    else:
        reached = [needed for m, blamed, needed in made if m == module and blamed == parameter]
        assert reached, f"{estimate}: not reached by {args[0]} on {kind} ({made})"
        assert max(reached) <= MEMORY

    # made to refuse, the estimate names an option of the command it ran in
    refuse_in["module"] = module
    if module == "attnviz.toy.config":
        monkeypatch.setattr("attnviz.toy.config.available_memory", lambda: 1)
    out = tmp_path / "refused"
    out.mkdir()
    result = run_cli(capsys, *_estimate_command(command, kind, models, inputs, out))
    errors = result.error_lines()
    assert result.exit_code == 2 and len(errors) == 1, result.stderr[-3000:]
    flags = [word.rstrip(":,") for word in errors[0].split() if word.startswith("--")]
    assert flags and set(flags) <= _options_of(args[0]), (errors[0], sorted(_options_of(args[0])))
    if parameter is not None:
        assert flag_for(parameter) in flags
    assert list(out.iterdir()) == []


def test_a_toy_checkpoint_too_large_for_this_machine_names_no_option(capsys, tmp_path, monkeypatch):
    """A saved toy's sizes are no option of the command loading it: the refusal says what its weights need."""
    import shutil

    from attnviz.models.specs import shipped_toy_path

    checkpoint = tmp_path / "copy"
    shutil.copytree(shipped_toy_path("toy-copy"), checkpoint)
    monkeypatch.setattr(resources, "available_memory", lambda: 100_000)  # a machine with 100 KB free
    monkeypatch.setattr("attnviz.toy.config.available_memory", lambda: 100_000)
    result = run_cli(capsys, "stats", checkpoint)
    errors = result.error_lines()
    assert result.exit_code == 2 and len(errors) == 1, result.stderr
    assert "this toy model's weights need about" in errors[0] and "the 100 KB available" in errors[0], errors[0]
    assert "--" not in errors[0] and "damaged" not in errors[0]
