"""Captures of some layers and heads only: the same numbers as a full capture, the model's own labels,
and a size limit checked before the model runs."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import run_cli
from tiny_models import TEXTS

from attnviz.captures.attention_capture import AttentionCapture, capture
from attnviz.common.errors import InputError, ParameterError
from attnviz.common.resources import format_bytes

TEXT = TEXTS[0]


def _eager_attentions(directory, loaded, batch):
    """transformers' eager attention of the same batch (``output_attentions=True``)."""
    eager = type(loaded.model).from_pretrained(str(directory), attn_implementation="eager").eval()
    with torch.no_grad():
        return eager(**batch.inputs, output_attentions=True)


@pytest.mark.parametrize(("family", "layer", "heads"), [("bert", 1, [1, 3]), ("llama", 1, [2, 5, 7])])
def test_subset_equals_the_same_heads_of_a_full_capture_and_of_eager_attention(
    tiny_dirs, tiny_models, family, layer, heads
):
    """BERT, and LLaMA whose 8 query heads share 2 key/value heads (GQA): recorded heads are the model's."""
    loaded = tiny_models[family]
    full = capture(loaded, TEXT)
    part = capture(loaded, TEXT, layers=[layer], heads=heads)
    assert part.recorded_layers() == [layer]
    assert part.num_layers() == full.num_layers()
    assert torch.equal(part.layer(layer), full.layer(layer)[heads])  # [len(heads), q, k]: the same computation
    batch = loaded.encode([TEXT])
    reference = _eager_attentions(tiny_dirs[family], loaded, batch).attentions[layer][0, heads]  # [len(heads), q, k]
    assert torch.allclose(part.layer(layer), reference.float(), atol=1e-5)
    # the model's numbers: heads 2, 5, 7 of layer 1 are not heads 0, 1, 2 of layer 0
    assert part.identity is not None
    assert part.identity.ids("self", layer, len(heads)) == heads
    for other in range(part.num_layers()):
        if other != layer:
            with pytest.raises(InputError, match=f"layer {other} is not in this capture"):
                part.layer(other)


def test_encoder_decoder_records_the_chosen_stack_only(tiny_model_dirs):
    """T5: the cross-attention of the last layer, head 3, equals the full capture's and eager attention's."""
    from attnviz.models.specs import load_model

    loaded = load_model(str(tiny_model_dirs["t5"]), device="cpu")
    target = "Le chat est assis."
    full = capture(loaded, TEXT, target=target)
    part = capture(loaded, TEXT, target=target, stacks=["cross"], layers=[-1], heads=[3])
    assert part.stacks == ["cross"]
    last = full.num_layers("cross") - 1
    assert part.recorded_layers("cross") == [last]
    assert torch.equal(part.layer(last, "cross"), full.layer(last, "cross")[[3]])
    batch = loaded.encode([TEXT], targets=[target])
    reference = _eager_attentions(tiny_model_dirs["t5"], loaded, batch).cross_attentions[last][0, [3]]
    assert torch.allclose(part.layer(last, "cross"), reference.float(), atol=1e-5)
    with pytest.raises(ParameterError, match="no decoder attention|has no"):
        capture(loaded, TEXT, target=target, stacks=["self"])


@pytest.mark.parametrize("bits", [32, 8])
def test_saved_subset_keeps_the_models_numbers(tiny_models, tmp_path, capsys, bits):
    """The file stores layer 1 only, labelled layer 1 head 3; --from-capture draws it as L1 H3."""
    from safetensors import safe_open

    part = capture(tiny_models["bert"], TEXT, layers=[1], heads=[3])
    path = part.save(tmp_path / "part.safetensors", bits=bits)
    with safe_open(str(path), framework="pt") as handle:
        names = sorted(name for name in handle.keys() if not name.endswith(".scale"))  # noqa: SIM118
    assert names == ["self.1"]
    back = AttentionCapture.load(path)
    assert back.recorded_layers() == [1]
    assert back.identity is not None and back.identity.ids("self", 1, 1) == [3]
    tolerance = 0 if bits == 32 else float(part.layer(1).amax()) / 510 + 1e-7
    assert torch.allclose(back.layer(1), part.layer(1), atol=tolerance, rtol=0)

    figure = tmp_path / "head.svg"
    result = run_cli(capsys, "heatmap", "--from-capture", path, "--out", figure)
    assert result.exit_code == 0, result.stderr
    svg = figure.read_text(encoding="utf-8")
    assert "layer 1, head 3" in svg and "layer 0, head 0" not in svg
    result = run_cli(capsys, "heatmap", "--from-capture", path, "--layer", "1", "--head", "0", "--out", figure)
    assert result.error_lines() == ["error: head 0 is not in this capture: it records heads 3 of this layer"]


def test_cli_capture_records_the_chosen_layer_and_head(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "l1h2.safetensors"
    result = run_cli(
        capsys, "capture", TEXT, "--model", tiny_dirs["llama"], "--layer", "-1", "--head", "2", "--out", out
    )
    assert result.exit_code == 0, result.stderr
    back = AttentionCapture.load(out)
    assert back.recorded_layers() == [1]
    assert back.head_counts() == [0, 1]
    assert back.identity is not None and back.identity.ids("self", 1, 1) == [2]


def test_max_bytes_refuses_before_the_model_runs(tiny_models, monkeypatch):
    """The size is checked on the encoded text: the forward pass is never reached."""
    loaded = tiny_models["bert"]
    loaded.layout()  # the tiny probe pass that counts heads, done beforehand
    tokens = len(loaded.encode([TEXT]).tokens[0])
    calls = []
    monkeypatch.setattr(loaded, "forward", lambda *args, **kwargs: calls.append(1))
    needed = 2 * 4 * tokens * tokens * 4  # 2 layers × 4 heads × n² float32
    with pytest.raises(ParameterError, match=format_bytes(needed)) as refused:
        capture(loaded, TEXT, max_bytes=needed - 1)
    assert refused.value.parameter == "max_bytes"
    assert calls == []
    monkeypatch.undo()
    # one head of one layer is an eighth of that: it fits a limit of an eighth
    assert capture(loaded, TEXT, layers=[0], heads=[0], max_bytes=needed // 8).layer(0).shape[0] == 1


def test_cli_max_bytes_refusal_names_the_size_and_writes_nothing(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "big.safetensors"
    result = run_cli(capsys, "capture", TEXT, "--model", tiny_dirs["bert"], "--max-bytes", "1KB", "--out", out)
    assert result.exit_code != 0
    lines = result.error_lines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "would hold" in lines[0] and "KB of attention weights" in lines[0]
    assert "--max-bytes" in lines[0] and "--layer" in lines[0] and "--head" in lines[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []
    figure = tmp_path / "big.png"
    result = run_cli(capsys, "heatmap", TEXT, "--model", tiny_dirs["bert"], "--max-bytes", "100B", "--out", figure)
    assert len(result.error_lines()) == 1 and "would hold" in result.error_lines()[0]
    assert not figure.exists()


@pytest.mark.parametrize("value", ["0", "-5", "abc", "5XB", "0.0001KB"])
@pytest.mark.parametrize("command", ["capture", "heatmap"])
def test_bad_max_bytes_values_are_refused(tiny_dirs, tmp_path, capsys, command, value):
    out = tmp_path / ("x.safetensors" if command == "capture" else "x.png")
    result = run_cli(capsys, command, TEXT, "--model", tiny_dirs["bert"], f"--max-bytes={value}", "--out", out)
    assert result.exit_code != 0
    assert len(result.error_lines()) == 1 and "--max-bytes" in result.error_lines()[0]
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_heatmap_records_only_what_it_draws(tiny_dirs, tmp_path, capsys):
    figure = tmp_path / "one.svg"
    args = ("heatmap", TEXT, "--model", tiny_dirs["llama"], "--layer", "1", "--head", "6", "--out", figure)
    result = run_cli(capsys, *args)
    assert result.exit_code == 0, result.stderr
    assert "self attention: 2 layers × 8 heads, recorded: layer 1 (1 head)" in " ".join(result.stderr.split())
    assert "layer 1, head 6" in figure.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "damage",
    [
        {"recorded_layers": {"self": [0]}},  # says layer 0, holds layer 1
        {"recorded_layers": {"self": ["1"]}},  # not numbers
        {"model_heads": {"self": [4, True]}},
        {"heads": {"self": [[], [3.5]]}},
    ],
)
def test_damaged_partial_capture_metadata_is_refused(tiny_models, tmp_path, damage):
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    from attnviz.common.errors import CaptureFileError

    path = capture(tiny_models["bert"], TEXT, layers=[1], heads=[3]).save(tmp_path / "part.safetensors")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    identity = json.loads(metadata["head_identity"])
    identity.update(damage)
    metadata["head_identity"] = json.dumps(identity)
    save_file(tensors, str(path), metadata=metadata)
    with pytest.raises(CaptureFileError, match="damaged"):
        AttentionCapture.load(path)


def test_padded_batch_subset_equals_each_full_capture(tiny_models):
    """Texts of different lengths: each example's recorded heads, padding trimmed, equal its full capture's."""
    from attnviz.captures.attention_capture import capture_batch

    loaded = tiny_models["gpt2"]
    texts = [TEXTS[1], "Short one.", TEXTS[2]]
    parts = capture_batch(loaded, texts, layers=[0], heads=[1, 3])
    for text, part in zip(texts, parts, strict=True):
        full = capture(loaded, text)
        assert part.tokens == full.tokens
        assert torch.allclose(part.layer(0), full.layer(0)[[1, 3]], atol=1e-6)
        assert part.layer(0).is_contiguous()
