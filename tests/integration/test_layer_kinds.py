"""Stacks whose layers are not one attention module each: hybrid stacks (layers without softmax attention),
shared layers applied several times (ALBERT), NLLB-MoE's cross-attention, LongT5's blocked local attention, and
the families attnviz refuses by name (audio, LongT5 transient-global).

Each model is a tiny seeded config with weights drawn wide (peaked attention), compared with transformers' own
eager attention (``output_attentions``); LongT5's blocked weights are laid out over the tokens by an index loop
written here, independent of the library's.
"""

from __future__ import annotations

import math

import pytest
import torch
from cli_helpers import run_cli
from zoo_reference import unfold_local

import attnviz

VOCAB = 30522  # MiniLM's tokenizer, saved with every model
TEXT = "The cat sat on the mat because it was tired."
TARGET = "Le chat"


def _save(model, path):
    import transformers

    from attnviz.models.specs import minilm_path

    model.save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(path)
    return path


def _build(family: str, path):
    import transformers as t

    torch.manual_seed(0)
    if family in ("qwen3_next", "qwen3_next_linear"):  # 0 and 2 linear attention (gated delta rule), 1 and 3 softmax
        kinds = ["linear_attention", "full_attention"] * 2 if family == "qwen3_next" else ["linear_attention"] * 4
        config = t.Qwen3NextConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, linear_num_value_heads=2, linear_num_key_heads=2,
            linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=16, shared_expert_intermediate_size=16, initializer_range=0.2,
            layer_types=kinds, bos_token_id=101, eos_token_id=102,
        )  # fmt: skip
        model = t.Qwen3NextForCausalLM._from_config(config, attn_implementation="eager")
    elif family == "albert":  # one attention module applied at 3 layers
        config = t.AlbertConfig(
            vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=64, initializer_range=0.2,
        )  # fmt: skip
        model = t.AlbertModel._from_config(config, attn_implementation="eager")
    elif family == "nllb_moe":
        config = t.NllbMoeConfig(
            vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_experts=4, expert_capacity=8,
            init_std=0.2, max_position_embeddings=64, pad_token_id=0, bos_token_id=101, eos_token_id=102,
            decoder_start_token_id=101, encoder_sparse_step=2, decoder_sparse_step=2,
        )  # fmt: skip
        model = t.NllbMoeForConditionalGeneration._from_config(config, attn_implementation="eager")
    elif family in ("longt5", "longt5_global"):
        config = t.LongT5Config(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
            local_radius=2, global_block_size=4, pad_token_id=0, eos_token_id=102, decoder_start_token_id=0,
            encoder_attention_type="local" if family == "longt5" else "transient-global", initializer_factor=10.0,
        )  # fmt: skip
        model = t.LongT5ForConditionalGeneration._from_config(config, attn_implementation="eager")
    elif family == "whisper":
        config = t.WhisperConfig(
            vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
            max_source_positions=30, max_target_positions=64, pad_token_id=0, bos_token_id=101,
            eos_token_id=102, decoder_start_token_id=101,
        )  # fmt: skip
        model = t.WhisperForConditionalGeneration._from_config(config, attn_implementation="eager")
    elif family == "xmod":  # a language adapter per layer, and no default language in the config
        config = t.XmodConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
            languages=["en_XX", "de_DE"],
        )  # fmt: skip
        model = t.XmodModel._from_config(config, attn_implementation="eager")
    else:
        raise ValueError(family)
    return _save(model, path)


class _Built(dict):
    """``family -> directory``, each model built on first use and kept for the module."""

    def __init__(self, root) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, family: str):
        self[family] = _build(family, self.root / family)
        return self[family]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return _Built(tmp_path_factory.mktemp("layer_kinds"))


def _eager(loaded, path, batch):
    """transformers' own eager model on ``batch``: its outputs with ``output_attentions``."""
    reference = type(loaded.model).from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        return reference(**batch.inputs, output_attentions=True)


def test_hybrid_stack_keeps_the_model_layer_numbers_and_equals_eager(model_dirs):
    path = model_dirs["qwen3_next"]
    loaded = attnviz.load_model(str(path))
    assert loaded.attention_layers() == [1, 3] and loaded.num_layers() == 4
    assert [site.name for site in loaded.layout()] == ["self.1", "self.3"]
    capture = attnviz.capture(loaded, TEXT)
    assert capture.recorded_layers() == [1, 3] and capture.head_counts() == [0, 4, 0, 4]
    assert capture.attention_layers() == [1, 3]
    with pytest.raises(attnviz.common.errors.InputError, match="only layers 1, 3 of this model have attention"):
        capture.stacked()
    batch = loaded.encode([TEXT])
    eager = _eager(loaded, path, batch)
    assert len(eager.attentions) == 2  # eager numbers the attention layers 0, 1: they are the model's 1 and 3
    for layer, reference in zip((1, 3), eager.attentions, strict=True):
        assert float((capture.layer(layer) - reference[0]).abs().max()) <= 1e-5
        assert float(reference[0].amax(-1).mean()) > 0.4  # peaked: a wrong bias or scale would show
    with torch.no_grad():
        logits = loaded.forward(batch, logits=True).logits
    assert float((logits - eager.logits).abs().max()) <= 1e-4

    # statistics over the attention layers only, row l of a matrix being layer l
    stats = attnviz.compute_statistics(loaded, [TEXT], progress=False)
    assert sorted(site.name for site in stats.sites) == ["self.1", "self.3"]
    matrix = stats.matrix("max_weight")  # [layer, head]
    assert matrix.shape == (4, 4) and bool(matrix[[0, 2]].isnan().all())
    for layer, reference in zip((1, 3), eager.attentions, strict=True):
        expected = reference[0].amax(-1).mean(-1).double()  # [h]: each head's mean over the queries
        assert torch.allclose(matrix[layer], expected, atol=1e-5)

    # a capture of the attention layers saved and read back keeps their numbers
    only = attnviz.capture(loaded, TEXT, layers=[-1])
    assert only.recorded_layers() == [3] and torch.allclose(only.layer(3), capture.layer(3))


def test_hybrid_layer_without_attention_is_one_error_line(model_dirs, capsys, tmp_path):
    path = model_dirs["qwen3_next"]
    for args in (
        ["heatmap", TEXT, "--model", path, "--layer", "2", "--out", tmp_path / "h.svg"],
        ["explain", path, TEXT, "--layer", "0", "--head", "0", "--out", tmp_path / "why.html"],
    ):
        result = run_cli(capsys, *args)
        assert result.exit_code != 0 and "Traceback" not in result.stderr
        (line,) = result.error_lines()
        assert "--layer" in line and "has no attention" in line and "1, 3" in line
    assert not list(tmp_path.iterdir())
    result = run_cli(capsys, "heatmap", TEXT, "--model", path, "--layer", "all", "--out", tmp_path / "h.svg")
    assert result.exit_code == 0 and "4 layers, attention in 1, 3 × 4 heads" in result.stderr
    result = run_cli(capsys, "stats", path, "--text", TEXT, "--json", tmp_path / "s.json")
    assert result.exit_code == 0, result.stderr
    import json

    record = json.loads((tmp_path / "s.json").read_text())
    assert record["stacks"]["self"]["attention_layers"] == [1, 3]
    assert sorted({head["layer"] for head in record["heads"]}) == [1, 3]


def test_shared_layer_is_a_layer_per_application(model_dirs):
    path = model_dirs["albert"]
    loaded = attnviz.load_model(str(path))
    assert [site.name for site in loaded.layout()] == ["self.0", "self.1", "self.2"]
    capture = attnviz.capture(loaded, TEXT)
    batch = loaded.encode([TEXT])
    eager = _eager(loaded, path, batch)
    assert len(eager.attentions) == 3 == capture.num_layers()
    for layer, reference in enumerate(eager.attentions):
        assert float((capture.layer(layer) - reference[0]).abs().max()) <= 1e-5
    # the applications differ (each reads another layer's input): collapsing them onto one site would show
    assert float((capture.layer(0) - capture.layer(2)).abs().max()) > 1e-2
    with torch.no_grad():
        states = loaded.forward(batch).last_hidden_state
    assert float((states - eager.last_hidden_state).abs().max()) <= 1e-4
    stats = attnviz.compute_statistics(loaded, [TEXT], progress=False)
    entropy = stats.matrix("entropy")  # [layer, head]
    for layer, reference in enumerate(eager.attentions):
        pattern = reference[0].double()  # [h, q, k]
        expected = -(pattern * pattern.clamp(min=1e-30).log()).sum(-1).mean(-1)
        assert torch.allclose(entropy[layer], expected, atol=1e-4)
    with pytest.raises(attnviz.common.errors.UnsupportedModelError, match="several layers"):
        loaded.check_head_removal()
    # one output projection serves every application: patching one application's heads is refused, not approximated
    with pytest.raises(attnviz.common.errors.UnsupportedModelError, match="several times per layer"):
        attnviz.patch_heads(loaded, clean="the cat sat", corrupt="the dog sat", answer="cat", wrong="dog")


def test_nllb_moe_cross_attention_is_a_cross_site(model_dirs):
    path = model_dirs["nllb_moe"]
    loaded = attnviz.load_model(str(path))
    capture = attnviz.capture(loaded, TEXT, target=TARGET)
    eager = _eager(loaded, path, loaded.encode([TEXT], targets=[TARGET]))
    for stack, references in (
        ("encoder", eager.encoder_attentions),
        ("decoder", eager.decoder_attentions),
        ("cross", eager.cross_attentions),
    ):
        assert capture.num_layers(stack) == len(references) == 2
        for layer, reference in enumerate(references):
            assert float((capture.layer(layer, stack) - reference[0]).abs().max()) <= 1e-5


def test_longt5_local_attention_laid_out_over_tokens(model_dirs):
    path = model_dirs["longt5"]
    with pytest.warns(attnviz.common.progress.AttnvizWarning, match="eager"):
        loaded = attnviz.load_model(str(path))
    capture = attnviz.capture(loaded, TEXT, target=TARGET)
    batch = loaded.encode([TEXT], targets=[TARGET])
    eager = _eager(loaded, path, batch)
    length = len(capture.tokens)
    for layer, blocked in enumerate(eager.encoder_attentions):  # [1, blocks, h, block, 3·block]
        expected = unfold_local(blocked, length)  # [h, q, k]
        pattern = capture.layer(layer, "encoder")
        assert float((pattern - expected).abs().max()) <= 1e-5
        assert torch.allclose(pattern.sum(-1), torch.ones(4, length), atol=1e-5)
    for stack, references in (("decoder", eager.decoder_attentions), ("cross", eager.cross_attentions)):
        for layer, reference in enumerate(references):
            assert float((capture.layer(layer, stack) - reference[0]).abs().max()) <= 1e-5
    stats = attnviz.compute_statistics(loaded, [TEXT], progress=False)
    first = stats.matrix("first_token", "encoder")  # [layer, head]
    for layer in range(2):
        assert torch.allclose(first[layer], capture.layer(layer, "encoder")[:, :, 0].mean(-1).double(), atol=1e-5)
    assert not math.isnan(float(first.sum()))


def test_model_without_attention_layers_is_refused(model_dirs):
    with pytest.raises(attnviz.common.errors.UnsupportedModelError, match="no softmax attention in any layer"):
        attnviz.load_model(str(model_dirs["qwen3_next_linear"]))


@pytest.mark.parametrize(
    ("family", "fragments"),
    [
        ("whisper", ["processor of audio model", "WhisperProcessor"]),  # a Whisper saved without its processor
        ("longt5_global", ["transient-global", "summaries"]),
        ("xmod", ["does not run on a text alone", "language"]),
    ],
)
def test_refused_families_name_the_reason(model_dirs, capsys, tmp_path, family, fragments):
    result = run_cli(capsys, "heatmap", TEXT, "--model", model_dirs[family], "--out", tmp_path / "h.svg")
    assert result.exit_code != 0 and "Traceback" not in result.stderr
    (line,) = result.error_lines()
    assert all(fragment in line for fragment in fragments), line


@pytest.mark.parametrize("family", ["vit_msn", "ijepa"])
def test_vit_msn_and_ijepa_read_as_vision_towers(tmp_path, family):
    import numpy as np
    import transformers as t
    from PIL import Image

    from attnviz.captures.images import capture_image

    torch.manual_seed(0)
    config = (t.ViTMSNConfig if family == "vit_msn" else t.IJepaConfig)(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8,
        initializer_range=0.2,
    )  # fmt: skip
    model_class = t.ViTMSNModel if family == "vit_msn" else t.IJepaModel
    model_class._from_config(config, attn_implementation="eager").save_pretrained(tmp_path)
    t.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    loaded = attnviz.load_model(str(tmp_path))
    picture = Image.fromarray((np.random.RandomState(0).rand(32, 32, 3) * 255).astype("uint8"))
    capture = capture_image(loaded, picture)
    assert capture.image_grid.extra_kinds == (("cls",) if family == "vit_msn" else ())  # I-JEPA has no class token
    reference = model_class.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        eager = reference(pixel_values=loaded.encode_images([picture]).inputs["pixel_values"], output_attentions=True)
    for layer, pattern in enumerate(eager.attentions):
        assert float((capture.layer(layer) - pattern[0]).abs().max()) <= 1e-5
