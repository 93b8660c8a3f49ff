"""Compact capture files (--bits 8/16): round trip within the documented bound, size, row sums, old files."""

from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import run_cli
from figure_helpers import read_svg
from safetensors import safe_open
from safetensors.torch import save_file

from attnviz.captures.attention_capture import AttentionCapture, capture
from attnviz.captures.compact import decode_patterns, encode_pattern
from attnviz.common.errors import CaptureFileError, InputError

TEXT = (
    "The old lighthouse keeper climbed the winding stairs every evening, lit the great lamp, "
    "and watched the ships pass safely beyond the rocks until dawn. In the morning he wrote every ship's name "
    "into a heavy leather book that his grandfather had started sixty years before."
)


@pytest.fixture(scope="module")
def sentence(minilm):
    return capture(minilm, TEXT)


def test_eight_bit_round_trip_within_row_max_over_510_and_file_3_5x_smaller(sentence, tmp_path):
    full = sentence.save(tmp_path / "full.safetensors")
    small = sentence.save(tmp_path / "small.safetensors", bits=8)
    assert len(sentence.tokens) >= 50  # 4n / (n + 4) bytes ratio, plus the header
    assert full.stat().st_size / small.stat().st_size >= 3.5
    again = AttentionCapture.load(small)
    assert again.tokens == sentence.tokens
    for layer in range(sentence.num_layers()):
        original, restored = sentence.layer(layer), again.layer(layer)  # [head, query, key]
        assert restored.dtype == torch.float32
        row_max = original.amax(dim=-1, keepdim=True)  # [head, query, 1]
        error = (restored - original).abs()
        assert bool((error <= row_max / 510 + 1e-7).all())
        # rows still sum to 1 within the per-weight bound times the row length
        row_sum_error = (restored.sum(-1) - 1).abs()  # [head, query]
        assert bool((row_sum_error <= row_max[..., 0] / 510 * original.shape[-1] + 1e-6).all())
        # the bound is not loose: rounding really moves weights by up to about half a step
        assert float((error / row_max).max()) > 0.5 / 510


def test_eight_bit_codes_by_hand():
    pattern = torch.tensor([[[0.5, 0.3, 0.2], [0.0, 0.0, 0.0]]])  # [head 1, query 2, key 3]; row 1 all zero
    stored = encode_pattern("self.0", pattern, 8)
    assert stored["self.0"].dtype == torch.uint8
    assert stored["self.0"].tolist() == [[[255, 153, 102], [0, 0, 0]]]  # 0.3 / (0.5/255) = 153
    torch.testing.assert_close(stored["self.0.scale"], torch.tensor([[0.5 / 255, 0.0]]))
    back = decode_patterns(stored)["self.0"]
    torch.testing.assert_close(back, torch.tensor([[[0.5, 0.3, 0.2], [0.0, 0.0, 0.0]]]))


def test_sixteen_bit_is_float16_on_disk_and_float32_back(sentence, tmp_path):
    path = sentence.save(tmp_path / "half.safetensors", bits=16)
    with safe_open(str(path), framework="pt") as handle:
        assert handle.get_tensor("self.0").dtype == torch.float16
        assert handle.metadata()["bits"] == "16" and handle.metadata()["version"] == "2"
    again = AttentionCapture.load(path)
    for layer in range(sentence.num_layers()):
        original = sentence.layer(layer)
        assert again.layer(layer).dtype == torch.float32
        assert bool(((again.layer(layer) - original).abs() <= original * 2.0**-11 + 6e-8).all())


def test_version_one_files_still_load(sentence, tmp_path):
    """A file as attnviz wrote it before version 2: float32 tensors, no bits field."""
    path = tmp_path / "v1.safetensors"
    tensors = {f"self.{i}": layer.contiguous() for i, layer in enumerate(sentence.patterns["self"])}
    metadata = {
        "format": "attnviz-capture",
        "version": "1",
        "model": "minilm",
        "tokens": json.dumps(sentence.tokens),
        "special": json.dumps(sentence.special),
        "word_ids": json.dumps(sentence.word_ids),
        "causal": "false",
    }
    save_file(tensors, str(path), metadata=metadata)
    again = AttentionCapture.load(path)
    assert again.generated_from is None
    for layer in range(sentence.num_layers()):
        assert torch.equal(again.layer(layer), sentence.layer(layer))


def test_future_version_and_bad_bits_are_refused(sentence, tmp_path):
    path = tmp_path / "v9.safetensors"
    save_file(
        {"self.0": sentence.layer(0).contiguous()}, str(path), metadata={"format": "attnviz-capture", "version": "9"}
    )
    with pytest.raises(CaptureFileError, match="upgrade attnviz"):
        AttentionCapture.load(path)
    with pytest.raises(InputError, match="8, 16 or 32"):
        sentence.save(tmp_path / "x.safetensors", bits=4)


def test_cli_bits_and_heatmap_from_an_eight_bit_capture(tmp_path, capsys):
    out = tmp_path / "cat.safetensors"
    result = run_cli(capsys, "capture", TEXT, "--bits", "8", "--out", out)
    assert result.exit_code == 0, result.stderr
    with safe_open(str(out), framework="pt") as handle:
        assert handle.get_tensor("self.0").dtype == torch.uint8
    figure = tmp_path / "h.svg"
    result = run_cli(capsys, "heatmap", "--from-capture", out, "--head", "0", "--annotate", "--out", figure)
    assert result.exit_code == 0, result.stderr
    # the drawn weights are the 8-bit capture's, de-quantised (last layer, head 0, every cell annotated)
    pattern = AttentionCapture.load(out).layer(-1)[0]  # [query, key]
    assert read_svg(figure).annotations() == pytest.approx(pattern.flatten().tolist(), abs=0.005)
