"""Whisper on audio: every stack against transformers' eager attention (teacher-forced and written), wav reading and
resampling, wrap, the command line on a planted wav file, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from cli_helpers import assert_clean_error, run_cli
from figure_helpers import png_pixels, read_svg
from tiny_audio import build_tiny_whisper, write_wav

import attnviz
from attnviz.captures.attention_capture import AttentionCapture
from attnviz.common.audio import as_waveform, read_wav

STACKS = {"encoder": "encoder_attentions", "decoder": "decoder_attentions", "cross": "cross_attentions"}
TRANSCRIPT = "a cat sits on a red mat"


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    return build_tiny_whisper(tmp_path_factory.mktemp("whisper") / "whisper")


@pytest.fixture(scope="module")
def loaded(whisper):
    return attnviz.load_model(str(whisper))


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """One second at 8 kHz (resampled to 16 kHz): silence with a 440 Hz burst from 0.3 s to 0.6 s."""
    return write_wav(tmp_path_factory.mktemp("audio") / "burst.wav")


def eager(whisper, loaded, clip, decoder_ids: list[int]):
    """transformers' own eager Whisper on the clip's features and ``decoder_ids``, with attentions and logits."""
    import transformers

    model = transformers.WhisperForConditionalGeneration.from_pretrained(whisper, attn_implementation="eager").eval()
    features = loaded.encode_audio([as_waveform(clip, loaded.sampling_rate)]).inputs["input_features"]
    with torch.no_grad():
        return model(input_features=features, decoder_input_ids=torch.tensor([decoder_ids]), output_attentions=True)


def assert_patterns_equal(capture: AttentionCapture, outputs, frames: int) -> float:
    """Every stack's patterns equal eager's on the kept frames (≤ 1e-5); returns the largest difference."""
    largest = 0.0
    for stack, field in STACKS.items():
        for layer, reference in enumerate(getattr(outputs, field)):  # each [1, h, q, k]
            expected = reference[0]
            if stack == "encoder":
                expected = expected[:, :frames, :frames]
            elif stack == "cross":
                expected = expected[:, :, :frames]
            difference = float((capture.layer(layer, stack) - expected).abs().max())
            assert difference <= 1e-5, (stack, layer, difference)
            largest = max(largest, difference)
    return largest


def test_teacher_forced_transcript_matches_eager(whisper, loaded, clip):
    capture = attnviz.capture(loaded, str(clip), target=TRANSCRIPT)
    assert capture.tokens[:3] == ["0.00s", "0.02s", "0.04s"] and len(capture.tokens) == 50  # 1 s of 20 ms frames
    prefix = loaded.decoder_prefix()
    ids = prefix + loaded.tokenizer(TRANSCRIPT, add_special_tokens=False)["input_ids"]
    assert len(capture.target_tokens) == len(ids) and capture.target_special[: len(prefix)] == [True] * len(prefix)
    outputs = eager(whisper, loaded, clip, ids)
    assert_patterns_equal(capture, outputs, 50)
    batch = loaded.encode_audio([as_waveform(clip, loaded.sampling_rate)], targets=[TRANSCRIPT])
    with torch.no_grad():
        logits = loaded.forward(batch, logits=True).logits
    assert float((logits - outputs.logits).abs().max()) <= 1e-4
    # the burst (0.3–0.6 s) draws the cross-attention: more weight per frame there than on the silence around it
    cross = capture.layer(-1, "cross").mean(dim=(0, 1))  # [frame]
    assert cross[15:30].mean() > cross[35:].mean()


def test_all_frames_keep_the_whole_window(whisper, loaded, clip):
    capture = attnviz.capture(loaded, str(clip), target="a cat", all_frames=True, stacks=["encoder", "cross"])
    assert len(capture.tokens) == 1500 and capture.tokens[-1] == "29.98s"
    assert torch.allclose(capture.layer(0, "encoder").sum(-1), torch.ones(4, 1500), atol=1e-5)
    trimmed = attnviz.capture(loaded, str(clip), target="a cat", stacks=["cross"])
    assert torch.equal(trimmed.layer(0, "cross"), capture.layer(0, "cross")[:, :, :50])
    assert float(trimmed.layer(0, "cross").sum(-1).max()) < 1  # the rest went to the padding after the audio


def test_written_transcript_matches_eager(whisper, loaded, clip):
    written = attnviz.generate(loaded, clip, max_new_tokens=6)
    assert isinstance(written, attnviz.Generation)
    assert written.text == loaded.tokenizer.decode(written.token_ids, skip_special_tokens=True)
    prefix = loaded.decoder_prefix()
    assert written.capture.generated_from == len(prefix) and len(written.token_ids) == 6
    outputs = eager(whisper, loaded, clip, prefix + written.token_ids)
    assert_patterns_equal(written.capture, outputs, 50)
    greedy = outputs.logits[0, len(prefix) - 1 : -1].argmax(-1).tolist()  # [written]: what each step predicted
    assert greedy == written.token_ids
    # without a target, capture lets the model write (and keeps only what is asked)
    capture = attnviz.capture(loaded, np.zeros(8000, dtype=np.float32), stacks=["cross"], layers=[0])
    assert capture.stacks == ["cross"] and capture.generated_from == len(prefix) and len(capture.tokens) == 25
    # generate keeps only what is asked too: the same numbers as the whole capture
    part = attnviz.generate(loaded, clip, max_new_tokens=6, stacks=["cross"], layers=[0])
    assert part.token_ids == written.token_ids and part.capture.stacks == ["cross"]
    assert torch.equal(part.capture.layer(0, "cross"), written.capture.layer(0, "cross"))
    for bad, message in (({"image": clip}, "vision-language"), ({"max_length": 8}, "applies to text")):
        with pytest.raises(attnviz.AttnvizError, match=message):
            attnviz.generate(loaded, clip, max_new_tokens=2, **bad)


def test_wav_reading_and_resampling(tmp_path):
    stereo = write_wav(tmp_path / "stereo.wav", seconds=0.5, rate=44100, channels=2)
    samples, rate = read_wav(stereo)
    assert rate == 44100 and samples.shape == (22050,) and 0.55 < float(samples.abs().max()) < 0.65
    waveform = as_waveform(stereo, 16000)
    assert waveform.shape == (8000,) and waveform.dtype == torch.float32
    burst = waveform[int(0.3 * 16000) : int(0.5 * 16000)]
    assert math.isclose(float(burst.abs().max()), 20000 / 32768, rel_tol=0.02)  # interpolation keeps the amplitude
    assert float(waveform[: int(0.29 * 16000)].abs().max()) == 0.0


def test_wrap_reads_audio_and_restores_the_model(whisper, loaded, clip):
    import transformers

    model = transformers.WhisperForConditionalGeneration.from_pretrained(whisper).eval()
    implementation = model.config._attn_implementation
    wrapped = attnviz.wrap(model, transformers.AutoProcessor.from_pretrained(whisper))
    capture = attnviz.capture(wrapped, str(clip), target=TRANSCRIPT)
    reference = attnviz.capture(loaded, str(clip), target=TRANSCRIPT)
    assert all(torch.equal(a, b) for a, b in zip(capture.patterns["cross"], reference.patterns["cross"]))
    assert model.config._attn_implementation == implementation
    with pytest.raises(attnviz.AttnvizError, match="WhisperProcessor"):
        attnviz.wrap(model, transformers.AutoTokenizer.from_pretrained(whisper))


def test_refusals_in_python(loaded, clip):
    with pytest.raises(attnviz.AttnvizError, match="reads audio: statistics"):
        attnviz.compute_statistics(loaded, [str(clip)])
    with pytest.raises(attnviz.AttnvizError, match="reads audio: give it a .wav file"):
        attnviz.capture(loaded, "hello there")
    with pytest.raises(attnviz.AttnvizError, match="one-dimensional"):
        attnviz.capture(loaded, np.zeros((2, 100), dtype=np.float32), target="a cat")


def test_cli_heatmap_and_capture(whisper, loaded, clip, capsys, tmp_path):
    result = run_cli(capsys, "heatmap", "--audio", clip, "--model", whisper, "--target", TRANSCRIPT,
                     "--out", tmp_path / "cross.svg")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    figure = read_svg(tmp_path / "cross.svg")
    assert {"0.00s", "0.32s", "mat"} <= set(figure.texts), figure.texts
    assert any("cross-attention" in text for text in figure.texts)
    assert "50 time frames (0.00s–0.98s)" in " ".join(result.stderr.split())
    result = run_cli(
        capsys, "heatmap", "--audio", clip, "--model", whisper, "--generate", "3", "--out", tmp_path / "w.png"
    )
    assert result.exit_code == 0 and "transcript:" in result.stderr and png_pixels(tmp_path / "w.png").shape[0] > 100
    out = tmp_path / "burst.safetensors"
    result = run_cli(capsys, "capture", "--audio", clip, "--model", whisper, "--target", TRANSCRIPT, "--out", out)
    assert result.exit_code == 0, result.stderr
    saved, reference = AttentionCapture.load(out), attnviz.capture(loaded, str(clip), target=TRANSCRIPT)
    assert saved.tokens == reference.tokens and saved.target_tokens == reference.target_tokens
    for stack in STACKS:
        assert all(torch.equal(a, b) for a, b in zip(saved.patterns[stack], reference.patterns[stack]))


def test_cli_bad_input(whisper, clip, capsys, tmp_path):
    not_wav = tmp_path / "notes.wav"
    not_wav.write_text("not audio")
    out = ("--out", tmp_path / "x.png")
    cases = [
        (("--audio", tmp_path / "missing.wav", "--model", whisper), ["does not exist"]),
        (("--audio", not_wav, "--model", whisper), ["not a PCM wav file"]),
        (("--audio", clip, "--model", "minilm"), ["text model", "Whisper"]),
        (("The cat.", "--model", whisper), ["reads audio", "--audio"]),
        (("The cat.", "--audio", clip, "--model", whisper), ["give no TEXT"]),
    ]
    for arguments, fragments in cases:
        assert_clean_error(run_cli(capsys, "heatmap", *arguments, *out), *fragments)


def test_other_audio_families_are_refused(tmp_path, capsys):
    import transformers

    config = transformers.Speech2TextConfig(
        vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, input_feat_per_channel=8,
    )  # fmt: skip
    transformers.Speech2TextForConditionalGeneration(config).save_pretrained(tmp_path / "s2t")
    result = run_cli(capsys, "heatmap", "The cat.", "--model", tmp_path / "s2t", "--out", tmp_path / "h.png")
    assert_clean_error(result, "reads audio", "Whisper among audio models")
