"""What the commands share for audio: ``--audio`` (a wav file for Whisper), ``--all-frames``, capturing, the summary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnviz.cli.options import INPUT_PANEL, VIEW_PANEL, option

if TYPE_CHECKING:
    from attnviz.cli.option_groups import GenerationOptions, RunOptions

AudioOption = option(
    str | None,
    "--audio",
    help="A .wav file (PCM, mono or stereo, any rate: resampled) for Whisper: with --target TEXT the attention "
    "on that transcript, else on the transcript it writes (--generate N tokens, 48 by default). Example: "
    "--audio speech.wav --model ./whisper-tiny",
    panel=INPUT_PANEL,
    show_default=False,
)
AllFramesOption = option(
    bool,
    "--all-frames",
    help="Audio: keep all of Whisper's time frames (its 30 s window, the padding after the audio included) "
    "instead of those that cover the audio. Example: --all-frames",
    panel=VIEW_PANEL,
)


def capture_audio_option(
    audio: str,
    model: str,
    running: RunOptions,
    target: str | None,
    generating: GenerationOptions,
    *,
    others: dict[str, Any],
    all_frames: bool = False,
    max_bytes: int | None = None,
    **recording: Any,
):
    """Read ``--audio`` (before loading anything), load Whisper and capture it on ``target`` (teacher-forced) or
    while it writes (``--generate``, 48 tokens by default). ``others``: the inputs that do not go with audio
    (``{"TEXT": text, "--image": image, …}``), refused when given; ``recording``: ``layers``, ``heads``, ``stacks``;
    ``max_bytes``: the limit of a capture on a given transcript."""
    from attnviz.captures.audio import DEFAULT_WRITTEN_TOKENS, audio_model_of
    from attnviz.captures.recording import capture_encoded
    from attnviz.captures.writing import generate
    from attnviz.cli.console import console
    from attnviz.common.audio import read_wav, resample
    from attnviz.common.errors import InputError
    from attnviz.common.progress import status
    from attnviz.models.specs import load_model

    for name, value in others.items():
        if value not in (None, False):
            raise InputError(f"--audio reads a sound: give no {name} with it (its transcript goes in --target)")
    generation = generating.settings(target)
    samples, rate = read_wav(audio)  # a bad file fails before the model loads
    with status(f"loading {model}"):
        loaded = audio_model_of(load_model(model, device=running.device, dtype=running.dtype))
    waveform = resample(samples, rate, loaded.sampling_rate)
    if target is not None:
        batch = loaded.encode_audio(
            [waveform], targets=[target], all_frames=all_frames, truncate=not running.no_truncate
        )
        return capture_encoded(loaded, batch, max_bytes=max_bytes, **recording)[0]
    generation = generation or {"max_new_tokens": DEFAULT_WRITTEN_TOKENS}
    with status(f"writing up to {generation['max_new_tokens']} tokens"):
        written = generate(
            loaded, waveform, all_frames=all_frames, truncate=not running.no_truncate, **generation, **recording
        )
    console.print(f"[bold]transcript:[/bold] {written.text!r} ({len(written.token_ids)} tokens)", highlight=False)
    return written.capture


def print_audio_summary(result, stack: str) -> None:
    """One line on stderr: the model, the time frames, the transcript's tokens, layers × heads of ``stack``."""
    from attnviz.cli.capturing import stack_size
    from attnviz.cli.console import console

    frames = result.tokens
    span = f"{frames[0]}–{frames[-1]}" if frames else "no frames"
    console.print(
        f"[bold]{result.model}[/bold] (audio) · {len(frames)} time frames ({span}) → "
        f"{len(result.target_tokens or [])} transcript tokens · {stack} attention: {stack_size(result, stack)}",
        highlight=False,
    )
