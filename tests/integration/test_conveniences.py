"""Daily conveniences: standard input, --version, attnviz models, attnviz cache clear, content-keyed GGUF cache,
and the --generate options of capture and heatmap."""

from __future__ import annotations

import io
import json
import os
import struct

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli
from safetensors import safe_open

from attnviz.captures.attention_capture import AttentionCapture


def _gguf_bytes(name: str = "blk.0.weight", dims=(4, 2), data: bytes = b"\x00" * 32) -> bytes:
    """A minimal GGUF v3 file: one string metadata entry, one tensor entry, then the tensor data."""

    def string(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    header = b"GGUF" + struct.pack("<IQQ", 3, 1, 1)
    metadata = string("general.name") + struct.pack("<I", 8) + string("tiny")
    tensor = string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
    tensor += struct.pack("<IQ", 0, 0)  # type F32, data offset 0
    return header + metadata + tensor + data


def _stdin(monkeypatch, text: str) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)


# -- GGUF cache keyed by content ------------------------------------------------------------------


def test_gguf_index_end_by_hand():
    from attnviz.models.gguf import gguf_index_end

    data = _gguf_bytes()
    header = 4 + 4 + 8 + 8
    metadata = (8 + len("general.name")) + 4 + (8 + len("tiny"))
    tensor = (8 + len("blk.0.weight")) + 4 + 2 * 8 + 4 + 8
    assert gguf_index_end(data) == header + metadata + tensor == len(data) - 32


def test_content_key_ignores_path_and_time_but_not_the_index(tmp_path):
    from attnviz.models.gguf import content_key

    first, second = tmp_path / "a" / "model.gguf", tmp_path / "b" / "model.gguf"
    for path in (first, second):
        path.parent.mkdir()
        path.write_bytes(_gguf_bytes())
    os.utime(second, (1_000_000, 1_000_000))
    assert content_key(first) == content_key(second)
    second.write_bytes(_gguf_bytes(dims=(2, 4)))  # same size, another tensor index
    assert content_key(first) != content_key(second)
    second.write_bytes(_gguf_bytes(data=b"\x00" * 33))  # another size
    assert content_key(first) != content_key(second)


def test_a_conversion_under_the_old_path_key_is_adopted_without_converting(tmp_path, monkeypatch):
    from attnviz.models import gguf

    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model.gguf"
    model.write_bytes(_gguf_bytes())
    legacy = tmp_path / "cache" / "gguf" / gguf._legacy_key(model)
    legacy.mkdir(parents=True)
    (legacy / "config.json").write_text("{}")
    (legacy / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setattr(gguf, "_convert", lambda *args: pytest.fail("converted again"))
    target = gguf.converted_gguf_dir(model)
    assert target.name == gguf.content_key(model)
    assert (target / "model.safetensors").stat().st_ino == (legacy / "model.safetensors").stat().st_ino
    assert gguf.converted_gguf_dir(model) == target


# -- models and cache clear ----------------------------------------------------------------------------


def test_models_lists_shipped_hub_cache_and_conversions_and_cache_clear_counts_bytes(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "attnviz-cache"
    converted = cache / "gguf" / "Tiny-0123456789abcdef"
    converted.mkdir(parents=True)
    (converted / "model.safetensors").write_bytes(b"x" * 5000)
    (converted / "config.json").write_bytes(b"y" * 17)
    twin = cache / "gguf" / "Tiny-fedcba9876543210"  # hard links share their bytes: counted once
    twin.mkdir()
    os.link(converted / "model.safetensors", twin / "model.safetensors")
    hub = tmp_path / "hub"
    (hub / "models--acme--tiny-bert" / "blobs").mkdir(parents=True)
    (hub / "models--acme--tiny-bert" / "blobs" / "abc").write_bytes(b"z" * 100)
    monkeypatch.setenv("ATTNVIZ_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("COLUMNS", "200")

    result = run_cli(capsys, "models")
    assert result.exit_code == 0, result.stderr
    assert "reverse task, encoder-decoder, 2 layers × 4 heads" in result.stdout  # toy-reverse: the table is stdout
    # the image toys say what they are, as the token toys do
    table = " ".join(result.stdout.replace("│", " ").split())
    assert "odd-patch task, ViT classifier, 2 layers × 4 heads, 32×32 images in 8×8 patches" in table
    assert "caption task, captioner, ViT encoder 2 layers × 4 heads + GPT-2 decoder 1 layer × 4 heads" in table
    for fragment in (
        "minilm",
        "smollm2",
        "toy-reverse",
        "acme/tiny-bert",
        "Tiny-0123456789abcdef",
        "Tiny-fedcba9876543210",
    ):
        assert fragment in result.stdout
    assert "5.0 KB" in result.stdout  # 5,017 bytes of the first conversion

    result = run_cli(capsys, "cache", "clear")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("5017 bytes freed")
    assert not (cache / "gguf").exists()
    result = run_cli(capsys, "cache", "clear")
    assert result.stdout.startswith("0 bytes freed")


def test_version_matches_the_package(capsys):
    import attnviz

    result = run_cli(capsys, "--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"attnviz {attnviz.__version__}"


# -- standard input ------------------------------------------------------------------------------------


def test_dash_reads_text_from_standard_input(tmp_path, capsys, monkeypatch):
    out = tmp_path / "cat.safetensors"
    _stdin(monkeypatch, "The cat sat on the mat.\n")
    result = run_cli(capsys, "capture", "-", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert AttentionCapture.load(out).tokens == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    _stdin(monkeypatch, "   \n")
    assert_clean_error(run_cli(capsys, "heatmap", "-", "--out", tmp_path / "h.png"), "standard input is empty")
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    assert_clean_error(run_cli(capsys, "capture", "-", "--out", out), "nothing is piped in")


def test_data_dash_reads_examples_from_standard_input(tmp_path, capsys, monkeypatch):
    from attnviz.common.texts import examples_from_text

    assert examples_from_text('{"text": "A b."}\n\n{"text": "C d."}\n') == ["A b.", "C d."]
    assert examples_from_text("A b.\nC d.\n") == ["A b.", "C d."]
    out = tmp_path / "stats.json"
    _stdin(monkeypatch, "The cat sat.\nDogs bark loudly.\n")
    result = run_cli(capsys, "stats", "minilm", "--data", "-", "--no-table", "--json", out)
    assert result.exit_code == 0, result.stderr
    record = json.loads(out.read_text())
    assert (
        record["num_examples"] == 2 and record["num_tokens"] == 6 + 6
    )  # [CLS] the cat sat . [SEP], [CLS] dogs bark loudly . [SEP]


# -- --generate on the command line ----------------------------------------------------------------


def test_capture_generate_writes_generated_from_and_heatmap_draws_it(tiny_model_dirs, tmp_path, capsys):
    out = tmp_path / "gen.safetensors"
    model = tiny_model_dirs["llama"]
    result = run_cli(
        capsys, "capture", "The cat sat.", "--model", model, "--generate", "4", "--bits", "16", "--out", out
    )
    assert result.exit_code == 0, result.stderr
    assert "generated:" in result.stderr
    with safe_open(str(out), framework="pt") as handle:
        metadata = handle.metadata()
        assert handle.get_tensor("self.0").dtype == torch.float16
    prompt_tokens = 6  # [CLS] the cat sat . [SEP]
    assert json.loads(metadata["generated_from"]) == prompt_tokens
    assert len(json.loads(metadata["tokens"])) == prompt_tokens + 4
    figure = tmp_path / "gen.png"
    result = run_cli(capsys, "heatmap", "--from-capture", out, "--head", "mean", "--out", figure)
    assert result.exit_code == 0, result.stderr
    result = run_cli(
        capsys, "heatmap", "The cat sat.", "--model", model, "--generate", "3", "--sample", "--seed", "2",
        "--temperature", "0.8", "--words", "--layer", "0", "--head", "1", "--out", figure,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr


def test_generation_boundaries_on_each_axis():
    from attnviz.render.capture_view import generated_boundaries

    pattern = torch.full((1, 5, 5), 0.2)
    causal = AttentionCapture(
        model="m", tokens=list("abcde"), causal=True, patterns={"self": [pattern]},
        word_ids=[None, 0, 0, 1, 2], generated_from=3,
    )  # fmt: skip
    assert generated_boundaries(causal, "self", words=False) == (3, 3)
    assert generated_boundaries(causal, "self", words=True) == (2, 2)  # groups: [0] [1, 2] [3] [4]
    seq2seq = AttentionCapture(
        model="m", tokens=list("ab"), causal=False,
        patterns={"encoder": [pattern[:, :2, :2]], "cross": [pattern[:, :, :2]], "decoder": [pattern]},
        target_tokens=list("vwxyz"), target_word_ids=[None, 0, 1, 2, 3], generated_from=1,
    )  # fmt: skip
    assert generated_boundaries(seq2seq, "cross", words=False) == (1, None)
    assert generated_boundaries(seq2seq, "encoder", words=False) == (None, None)


def test_generate_option_refusals(tiny_model_dirs, tmp_path, capsys):
    out = tmp_path / "x.safetensors"
    assert_clean_error(run_cli(capsys, "capture", "Hi.", "--sample", "--out", out), "only with --generate")
    assert_clean_error(
        run_cli(capsys, "capture", "Hi.", "--generate", "2", "--seed", "1", "--out", out), "only with --sample"
    )
    bart = tiny_model_dirs["bart"]
    assert_clean_error(
        run_cli(capsys, "capture", "Hi.", "--model", bart, "--generate", "2", "--target", "Salut", "--out", out),
        "not both",
    )
    assert_clean_error(run_cli(capsys, "capture", "Hi.", "--generate", "2", "--out", out), "language-model head")
    assert not out.exists()


def test_cache_clear_on_a_cache_this_user_cannot_change_is_one_line(tmp_path, capsys, monkeypatch):
    """A read-only conversion cache (someone else's, or a read-only mount): one error line, nothing removed."""
    import errno
    import tempfile

    cache = tmp_path / "cache"
    converted = cache / "gguf" / "Tiny-0123456789abcdef"
    converted.mkdir(parents=True)
    (converted / "model.safetensors").write_bytes(b"x" * 10)
    monkeypatch.setenv("ATTNVIZ_CACHE", str(cache))
    (cache / "gguf").chmod(0o555)
    if os.access(cache / "gguf", os.W_OK):  # root writes anywhere: refuse writes there as the kernel would
        real_mkdtemp = tempfile.mkdtemp

        def read_only_mkdtemp(*args, dir=None, **kwargs):
            if dir is not None and os.path.realpath(dir) == os.path.realpath(cache / "gguf"):
                raise PermissionError(errno.EACCES, "Permission denied", str(dir))
            return real_mkdtemp(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile, "mkdtemp", read_only_mkdtemp)
    try:
        result = run_cli(capsys, "cache", "clear")
    finally:
        (cache / "gguf").chmod(0o755)
    assert_clean_error(result, "conversion cache")
    assert "Permission denied" in result.error_lines()[0] and "ATTNVIZ_CACHE" in result.error_lines()[0]
    assert "internal error" not in result.stderr
    assert (converted / "model.safetensors").read_bytes() == b"x" * 10
