"""Attention while a text model writes: continue a prompt and capture every step's attention (the public call is
:func:`attnviz.generate`, :mod:`attnviz.captures.writing`, which sends a captioner's image and Whisper's audio on).

The model continues a prompt token by token with its key/value cache, so step ``t`` runs
one query row through attnviz's core, not a new forward pass over everything. Each
step's rows are recorded where they belong, so the capture holds per layer the full
``[head, query, key]`` pattern over prompt + generated tokens; row ``i`` of a generated
token is its attention at the step it was fed to the model. One extra step feeds the
last generated token so that its row exists too (its prediction is discarded).

Decoding is plain: greedy (argmax of the logits), or sampling from
``softmax(logits / temperature)`` with a seeded generator. No other rule of the model's
generation config (top-k, repetition penalty, forced tokens) is applied; the text equals
``model.generate(do_sample=..., temperature=..., top_k=None, top_p=None)`` with such rules
switched off. Generation stops after ``max_new_tokens`` tokens or at an end-of-sequence token.

Decoder-only (causal) models keep their prompt in ``tokens`` and append the generated
tokens; encoder-decoder models keep the source in ``tokens`` and write the decoder start
token plus the generated tokens into ``target_tokens``. ``generated_from`` is the index of
the first generated token on that axis.
"""

from __future__ import annotations

import inspect
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnviz.captures.recording import plan_recording
from attnviz.captures.result import AttentionCapture
from attnviz.common.display import NotebookDisplay
from attnviz.common.errors import InputError, ParameterError, UnsupportedModelError
from attnviz.common.images import ImageSource
from attnviz.common.lazy import lazy_exports
from attnviz.common.resources import require_memory
from attnviz.common.tokens import token_strings, word_ids_from_markers
from attnviz.core import CONTEXT_KWARG, AttentionSite
from attnviz.models.base import LoadedModel
from attnviz.models.identity import HeadIdentity

# Markers of a token that starts a new word (byte-level BPE, SentencePiece) or continues one (WordPiece).


@dataclass(repr=False)  # NotebookDisplay's short repr; notebooks show the capture's view
class Generation(NotebookDisplay):
    """What :func:`attnviz.generate` returns, whatever the model reads: the capture, and what the model wrote.

    ``capture``: the attention over the input and the written tokens; ``capture.generated_from`` is the first
    written token's position, on ``tokens`` for a causal LM (prompt, then the written tokens) and on
    ``target_tokens`` for an encoder-decoder model, a captioner or Whisper (decoder prefix, then the written tokens).
    ``text``: the written tokens decoded (special tokens left out). ``token_ids``: the written token ids, the
    end-of-sequence token included when one came.
    """

    capture: AttentionCapture
    text: str
    token_ids: list[int]


@dataclass(frozen=True)
class Decoding:
    """How a model picks the tokens it writes: at most ``max_new_tokens``, each the most likely one, or with
    ``sample`` drawn from ``softmax(logits / temperature)`` by a generator seeded with ``seed`` (None: a fresh seed).
    Settings generation cannot run with are refused when it is made."""

    max_new_tokens: int
    sample: bool = False
    temperature: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        check_generation_settings(self.max_new_tokens, self.sample, self.temperature)


class _StepRecorder:
    """Observer that keeps each step's rows: ``rows[site]`` is a list of (first query position, ``[h, q, k]``)."""

    def __init__(self, source_len: int | None = None) -> None:
        self.rows: dict[AttentionSite, list[tuple[int, Tensor]]] = defaultdict(list)
        #: the source positions kept (encoder rows and columns, cross columns); None: all of them. Whisper's
        #: encoder runs over 30 s of frames, of which the audio's own are kept (the rest is padding)
        self.source_len = source_len
        #: position of the step's first query on the decoder axis (set by the loop before each step)
        self.offset = 0

    def observe(self, site: AttentionSite, pattern: Tensor, query_start: int) -> None:
        if site is None:
            return
        offset = 0 if site.stack == "encoder" else self.offset
        block = pattern[0]  # [h, blk, k]
        if self.source_len is not None and site.stack in ("encoder", "cross"):
            block = block[:, :, : self.source_len]
            if site.stack == "encoder":
                block = block[:, : max(0, self.source_len - query_start)]
        self.rows[site].append((offset + query_start, block.detach().float().cpu()))  # [h, blk, k]

    def assemble(self, query_len: int, key_lens: dict[str, int]) -> dict[str, list[Tensor]]:
        """Per stack, per layer ``[head, query, key]`` with every step's rows in place (unseen cells 0)."""
        by_stack: dict[str, dict[int, Tensor]] = defaultdict(dict)
        for site, pieces in self.rows.items():
            heads = pieces[0][1].shape[0]
            rows = key_lens[site.stack] if site.stack == "encoder" else query_len
            full = torch.zeros(heads, rows, key_lens[site.stack])  # [h, q, k]
            for start, block in pieces:  # block: [h, blk, c], c ≤ k (keys seen so far)
                full[:, start : start + block.shape[1], : block.shape[2]] = block
            by_stack[site.stack][site.layer] = full
        # the model's layer numbers: a hybrid stack's layers without attention hold no heads ([0, q, k])
        return {
            stack: [
                layers.get(i, torch.zeros(0, *next(iter(layers.values())).shape[1:])) for i in range(max(layers) + 1)
            ]
            for stack, layers in by_stack.items()
        }


def continue_text(
    loaded: LoadedModel,
    prompt: str,
    decoding: Decoding,
    *,
    max_length: int | None = None,
    truncate: bool = True,
    image: ImageSource | None = None,
) -> Generation:
    """Continue ``prompt`` as ``decoding`` says and capture all attention (see the module docstring;
    :func:`attnviz.generate` is the public call).

    ``image``: a picture in the prompt, for a vision-language model (as in
    :func:`~attnviz.captures.attention_capture.capture`); the picture is read once, with the prompt."""
    model = _generative_model(loaded)
    if image is not None:
        from attnviz.captures.vision_language import vision_language_batch

        batch = vision_language_batch(loaded, [prompt], [image])
    else:
        batch = loaded.encode([prompt], max_length=max_length, truncate=truncate)
    # what else the first step reads (a picture's pixels, PaliGemma's token types): the later steps read the cache
    first_inputs = {key: value for key, value in batch.inputs.items() if key not in ("input_ids", "attention_mask")}
    prompt_len = len(batch.tokens[0])
    # decoder positions: the prompt (causal LMs) or the decoder start token, then the new tokens
    used = (1, "start") if loaded.encoder_decoder else (prompt_len, "prompt")
    check_room(loaded, used, prompt_len, decoding)
    recorder = _StepRecorder()
    context = loaded.context([recorder])
    input_ids = batch.inputs["input_ids"]  # [1, n]
    attention_mask = batch.inputs["attention_mask"]  # [1, n]
    kwargs: dict[str, Any] = {CONTEXT_KWARG: context, "use_cache": True}
    cache = cache_argument(model)
    with torch.no_grad(), loaded.running():  # a model the user wrapped runs on the core only meanwhile
        if loaded.encoder_decoder:
            kwargs["encoder_outputs"] = model.get_encoder()(
                input_ids=input_ids, attention_mask=attention_mask, **{CONTEXT_KWARG: context}
            )
            kwargs["attention_mask"] = attention_mask
            sequence = [_decoder_start_id(model)]
        else:
            sequence = input_ids[0].tolist()

        # Qwen2-VL's multimodal rotary positions: after the prompt, a step's positions are the cache's length plus
        # the offset the picture left (rope_deltas); transformers derives them wrongly from a mask spanning the
        # whole sequence, so its later steps get no mask (one unpadded sequence: every key is seen anyway)
        multimodal_rope = hasattr(getattr(model, "model", None), "rope_deltas")

        def forward(step_input: Tensor, past: Any):
            if loaded.encoder_decoder:
                return model(decoder_input_ids=step_input, **{cache: past}, **kwargs)
            mask = torch.ones(1, len(sequence), dtype=torch.long, device=loaded.device)  # [1, keys so far]
            if past is None:
                return model(input_ids=step_input, attention_mask=mask, **{cache: past}, **kwargs, **first_inputs)
            if multimodal_rope:  # positions from the cache's length and the picture's offset (see above)
                return model(input_ids=step_input, **{cache: past}, **kwargs)
            return model(input_ids=step_input, attention_mask=mask, **{cache: past}, **kwargs)

        generated = write_tokens(
            forward,
            recorder,
            sequence,
            cache=cache,
            eos_ids=_eos_ids(model),
            decoding=decoding,
            device=loaded.device,
        )
    return Generation(
        capture=_capture_of(loaded, batch, recorder, sequence, prompt_len),
        text=loaded.tokenizer.decode(generated, skip_special_tokens=True),
        token_ids=generated,
    )


def check_room(
    loaded: LoadedModel, used: tuple[int, str], prompt_len: int, decoding: Decoding, *, source_len: int = 0
) -> None:
    """Refuse, before the model runs, writing past the model's positions (``used``: how many are taken before the
    new tokens, and by what: the prompt, or a decoder's start token) or past the memory every step's rows take: a
    ``[heads, positions, positions + source_len]`` float32 pattern per layer, twice (the rows, and the capture)."""
    new, (taken, what) = decoding.max_new_tokens, used
    if loaded.max_length is not None and taken + new > loaded.max_length:
        raise InputError(
            f"{taken} {what} token(s) + {new} new tokens exceed the model's {loaded.max_length} positions: generate "
            "fewer tokens or shorten the prompt"
        )
    positions = prompt_len + new
    needed = 2 * sum(loaded.layout().values()) * positions * (positions + source_len) * 4
    require_memory("max_new_tokens", new, needed, "the attention of every generated token")


def cache_argument(model) -> str:
    """The name of forward's key/value cache argument (and output): ``cache`` since transformers renamed
    ``past_key_values``, which it warns about and drops in 5.40."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def write_tokens(
    forward: Callable[[Tensor, Any], Any],
    recorder: _StepRecorder,
    sequence: list[int],
    *,
    cache: str,
    eos_ids: set[int],
    decoding: Decoding,
    device: Any,
) -> list[int]:
    """The decoding loop of every generation: feed ``sequence`` (the prompt, or the decoder start token), then
    each new token, with the key/value cache; returns the new token ids (appended to ``sequence`` too).

    ``forward(step_input, past)``: the model's outputs (``logits``, and the cache under the name ``cache``) for
    ``step_input`` (``[1, q]``: the whole ``sequence`` first, then ``[1, 1]``) after the cache ``past``. Each step
    sets ``recorder.offset`` to where its queries start. It stops after ``decoding.max_new_tokens`` tokens or one of
    ``eos_ids``, with one more step that only gives the last token its attention rows.
    """
    generator = None
    if decoding.sample:
        generator = torch.Generator(device=device)
        generator.manual_seed(decoding.seed if decoding.seed is not None else torch.seed())
    generated: list[int] = []
    step_input = torch.tensor([sequence], device=device)  # [1, q]: the whole sequence, then one token
    past = None
    while True:
        recorder.offset = len(sequence) - step_input.shape[1]
        outputs = forward(step_input, past)
        past = getattr(outputs, cache)
        if len(generated) >= decoding.max_new_tokens or (generated and generated[-1] in eos_ids):
            break  # this step only gave the last token its row
        logits = outputs.logits[0, -1].float()  # [vocab]
        token = _next_token(logits, decoding.sample, decoding.temperature, generator)
        generated.append(token)
        sequence.append(token)
        step_input = torch.tensor([[token]], device=device)  # [1, 1]
    return generated


def _generative_model(loaded: LoadedModel):
    """The model with its language-model head, or a clear refusal (:meth:`LoadedModel.check_generation`)."""
    loaded.check_generation()
    return loaded.model


def _eos_ids(model) -> set[int]:
    value = getattr(model.generation_config, "eos_token_id", None)
    if value is None:
        value = getattr(model.config, "eos_token_id", None)
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, (list, tuple)) else {int(value)}


def _decoder_start_id(model) -> int:
    for source in (model.generation_config, model.config):
        value = getattr(source, "decoder_start_token_id", None)
        if value is not None:
            return int(value)
    raise UnsupportedModelError("the model's config names no decoder_start_token_id, so generation cannot start")


#: below this a temperature turns the logits into infinities (softmax of logits / T): greedy decoding is that limit
MIN_TEMPERATURE = 1e-4


def check_generation_settings(max_new_tokens: int, sample: bool, temperature: float) -> None:
    """Refuse settings generation cannot run with, before any model loads."""
    if max_new_tokens < 1:
        raise ParameterError(
            "max_new_tokens", f"{{max_new_tokens}} (tokens to generate) must be at least 1, got {max_new_tokens}"
        )
    if sample and not (math.isfinite(temperature) and temperature > 0):
        raise ParameterError(
            "temperature", f"{{temperature}} must be a positive number for sampling, got {temperature}"
        )
    if sample and temperature < MIN_TEMPERATURE:
        raise ParameterError(
            "temperature",
            f"{{temperature}} {temperature} is too small to sample with (at least {MIN_TEMPERATURE}): "
            "leave out sampling for the most likely token at every step",
        )


def _next_token(logits: Tensor, sample: bool, temperature: float, generator: torch.Generator | None) -> int:
    """Greedy argmax, or a draw from ``softmax(logits / temperature)``; ``logits``: ``[vocab]``."""
    if not sample:
        return int(logits.argmax())
    probabilities = torch.softmax(logits / temperature, dim=-1)  # [vocab]
    return int(torch.multinomial(probabilities[None], 1, generator=generator)[0, 0])


def _capture_of(loaded, batch, recorder: _StepRecorder, sequence: list[int], prompt_len: int) -> AttentionCapture:
    tokenizer = loaded.tokenizer
    special_ids = set(tokenizer.all_special_ids)
    if loaded.encoder_decoder:
        new_ids = sequence  # decoder start token + generated tokens
        known_tokens, known_special, known_words = [], [], []
    else:
        new_ids = sequence[prompt_len:]
        known_tokens, known_special, known_words = batch.tokens[0], batch.special[0], batch.word_ids[0]
    # decoded with the prompt: a character whose bytes the prompt and the first new token share reads once
    new_tokens = (
        token_strings(tokenizer, new_ids if loaded.encoder_decoder else sequence)[-len(new_ids) :] if new_ids else []
    )
    new_special = [token_id in special_ids for token_id in new_ids]
    last_word = max((w for w in known_words if w is not None), default=None)
    new_words = word_ids_from_markers(new_tokens, new_special, last_word)
    if loaded.encoder_decoder:
        target = (new_tokens, new_special, new_words)
        return written_target_capture(
            loaded.name, batch, recorder, prompt_len, target, identity=hybrid_identity(loaded)
        )
    patterns = recorder.assemble(len(sequence), {"self": len(sequence)})
    return AttentionCapture(
        model=loaded.name,
        tokens=known_tokens + new_tokens,
        causal=loaded.causal,
        patterns=patterns,
        special=known_special + new_special,
        word_ids=known_words + new_words,
        generated_from=prompt_len,
        image_grid=batch.image_grid,
        extras={} if batch.images is None else {"image": batch.images[0].detach().to("cpu", torch.float32)},
        identity=hybrid_identity(loaded),
    )


def hybrid_identity(loaded: LoadedModel) -> HeadIdentity | None:
    """The identity that names the attention layers of a hybrid stack (its other layers hold no heads); None for a
    model whose every layer has attention."""
    if all(loaded.present_layers(stack) is None for stack in loaded.stacks()):
        return None
    return plan_recording(loaded).identity


def written_target_capture(
    name: str,
    batch,
    recorder: _StepRecorder,
    source_len: int,
    target: tuple[list[str], list[bool], list[int | None]],
    **fields: Any,
) -> AttentionCapture:
    """The capture of an encoder-decoder model that wrote its target: the source side from ``batch`` (its first
    example, ``source_len`` tokens), the target side (tokens, special flags, word ids: the decoder start token, then
    what it wrote) from ``target``, the patterns of every step from ``recorder``; ``fields``: more capture fields."""
    tokens, special, words = target
    patterns = recorder.assemble(len(tokens), {"encoder": source_len, "decoder": len(tokens), "cross": source_len})
    fields.setdefault("generated_from", 1)  # after the decoder start token
    return AttentionCapture(
        model=name,
        tokens=batch.tokens[0],
        causal=False,
        patterns={stack: patterns[stack] for stack in ("encoder", "decoder", "cross") if stack in patterns},
        special=batch.special[0],
        word_ids=batch.word_ids[0],
        target_tokens=tokens,
        target_special=special,
        target_word_ids=words,
        **fields,
    )


#: the old name of :func:`attnviz.generate`: it still works for one release, warning at each use
__getattr__ = lazy_exports(
    __name__,
    {},
    {"generate_capture": ("attnviz.captures.writing", "generate", "attnviz.generate(model, prompt, max_new_tokens=N)")},
)[0]
