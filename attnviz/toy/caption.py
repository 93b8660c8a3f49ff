"""The toy captioning task ``caption``: a small ViT + GPT-2 captioner whose cross-attention has a known answer.

Each image is 32×32 RGB, a 4×4 grid of 8×8-pixel patches on one grey background (all three channels
the same value, 64–192), with 1 to 3 patches filled with distinct colours out of red (230, 25, 25),
green (25, 200, 25), blue (25, 25, 230) and yellow (230, 230, 25). The caption names the coloured
patches' colours in the row-major order of their patches ("red blue"), then ends. To write the k-th
colour word the decoder must fetch the k-th coloured patch's colour from the image, so in a trained
model the cross-attention of the step that writes that word (last decoder layer, maximum over heads)
peaks on that patch.

The model is transformers' own ``VisionEncoderDecoderModel`` (a tiny ``ViTModel`` without pooler and a
tiny ``GPT2LMHeadModel`` with cross-attention), saved as a Hugging Face directory with its image
processor and a word-level tokenizer: it loads through the same loader as any captioner
(:mod:`attnviz.models.caption`), and the directory's :data:`~attnviz.toy.odd_patch.IMAGE_TASK_FILE`
records the task and the training.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from attnviz.common.progress import quiet_third_party
from attnviz.toy.odd_patch import (
    ToyImageModelSettings,
    eager_attention,
    normalised_pixels,
    save_image_task,
    toy_image_processor,
    toy_vit_config,
    train_image_model,
)
from attnviz.toy.training import TrainingSettings

if TYPE_CHECKING:
    from PIL.Image import Image

TASK_NAME = "caption"
IMAGE_SIZE = 32
PATCH_SIZE = 8
GRID = IMAGE_SIZE // PATCH_SIZE
#: the marking colours and their words, in vocabulary order
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 25, 25),
    "green": (25, 200, 25),
    "blue": (25, 25, 230),
    "yellow": (230, 230, 25),
}
#: grey background values (inclusive)
GREY_RANGE = (64, 192)
#: most coloured patches in one image
MAX_MARKED = 3
PAD, START, END, UNKNOWN = "<pad>", "<s>", "</s>", "<unk>"
VOCABULARY = (PAD, START, END, UNKNOWN, *COLOURS)
#: decoder positions: the start token, up to three words, the end token
MAX_POSITIONS = MAX_MARKED + 2


@dataclass(frozen=True)
class CaptionExample:
    """One image of the task: its background grey, and the coloured patches (row-major index -> colour word)."""

    grey: int
    marked: dict[int, str]

    @property
    def caption(self) -> str:
        """The colour words in the row-major order of their patches, space-separated."""
        return " ".join(self.marked[patch] for patch in sorted(self.marked))

    @property
    def patches(self) -> list[int]:
        """The coloured patches (row-major indices), in caption order."""
        return sorted(self.marked)

    def pixels(self) -> Tensor:
        """``[32, 32, 3]`` uint8."""
        cells = torch.full((GRID * GRID, 3), self.grey, dtype=torch.uint8)  # [patches, rgb]
        for patch, word in self.marked.items():
            cells[patch] = torch.tensor(COLOURS[word], dtype=torch.uint8)
        grid = cells.view(GRID, GRID, 3)
        return grid.repeat_interleave(PATCH_SIZE, 0).repeat_interleave(PATCH_SIZE, 1)  # [32, 32, rgb]

    def image(self) -> Image:
        from PIL import Image as PILImage

        return PILImage.fromarray(self.pixels().numpy(), "RGB")


def draw_examples(count: int, rng: random.Random) -> list[CaptionExample]:
    """``count`` random examples: a grey in 64–192, 1–3 distinct patches with distinct colours."""
    examples = []
    for _ in range(count):
        marked_count = rng.randint(1, MAX_MARKED)
        patches = rng.sample(range(GRID * GRID), marked_count)
        words = rng.sample(list(COLOURS), marked_count)
        examples.append(CaptionExample(rng.randint(*GREY_RANGE), dict(zip(patches, words))))
    return examples


def caption_examples(count: int, seed: int) -> list[CaptionExample]:
    """``count`` examples drawn with ``seed`` (the same seed gives the same examples)."""
    return draw_examples(count, random.Random(f"caption:{seed}"))


def caption_images(count: int, seed: int) -> tuple[list[Image], list[str]]:
    """``count`` task images drawn with ``seed`` as PIL images, and their captions."""
    examples = caption_examples(count, seed)
    return [example.image() for example in examples], [example.caption for example in examples]


def task_images(count: int, seed: int) -> list[Image]:
    """``count`` fresh task images drawn with ``seed``: a trained toy captioner's own images (``own_images``)."""
    return caption_images(count, seed)[0]


@dataclass(frozen=True)
class CaptionModelSettings(ToyImageModelSettings):
    """The toy captioner's size (stored in the checkpoint)."""

    MODEL: ClassVar[str] = "the caption model"

    encoder_layers: int = 2
    decoder_layers: int = 1
    mlp_width: int = 128


def build_tokenizer():
    """The task's word-level tokenizer (a transformers fast tokenizer: it saves and loads like any other)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    core = Tokenizer(models.WordLevel({word: index for index, word in enumerate(VOCABULARY)}, unk_token=UNKNOWN))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=START, eos_token=END, pad_token=PAD, unk_token=UNKNOWN
    )


@quiet_third_party()
def build_caption_model(settings: CaptionModelSettings, seed: int = 0):
    """An untrained tiny ``VisionEncoderDecoderModel``, its image processor and its tokenizer."""
    import transformers

    settings.validate()
    encoder_config = toy_vit_config(settings, settings.encoder_layers)
    ids = {word: index for index, word in enumerate(VOCABULARY)}
    decoder_config = transformers.GPT2Config(  # type: ignore[call-arg]  # is_decoder goes to PretrainedConfig
        vocab_size=len(VOCABULARY),
        n_positions=MAX_POSITIONS,
        n_embd=settings.width,
        n_layer=settings.decoder_layers,
        n_head=settings.num_heads,
        n_inner=settings.mlp_width,
        add_cross_attention=True,
        is_decoder=True,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=ids[START],
        eos_token_id=ids[END],
        pad_token_id=ids[PAD],
        tie_word_embeddings=False,
    )
    processor = toy_image_processor(IMAGE_SIZE)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        encoder = transformers.ViTModel(encoder_config, add_pooling_layer=False)
        decoder = transformers.GPT2LMHeadModel(decoder_config)
        model = transformers.VisionEncoderDecoderModel(encoder=encoder, decoder=decoder)
    model.config.decoder_start_token_id = ids[START]
    model.config.pad_token_id = ids[PAD]
    model.config.eos_token_id = ids[END]
    model.generation_config.decoder_start_token_id = ids[START]
    model.generation_config.eos_token_id = ids[END]
    model.generation_config.pad_token_id = ids[PAD]
    model.generation_config.bos_token_id = ids[START]
    model.generation_config.max_length = MAX_POSITIONS
    return model, processor, build_tokenizer()


def example_tensors(examples: list[CaptionExample]) -> tuple[Tensor, Tensor, Tensor]:
    """(``[b, 3, 32, 32]`` pixels as the processor makes them, ``[b, 5]`` decoder inputs, ``[b, 5]`` labels).

    Decoder inputs: the start token, the words, padding; labels: the words, the end token, -100 (no loss).
    """
    ids = {word: index for index, word in enumerate(VOCABULARY)}
    pixels = torch.stack([example.pixels() for example in examples]).float() / 255.0  # [b, 32, 32, 3]
    normalised = normalised_pixels(pixels)  # [b, 3, 32, 32]
    inputs = torch.full((len(examples), MAX_POSITIONS), ids[PAD], dtype=torch.long)
    labels = torch.full((len(examples), MAX_POSITIONS), -100, dtype=torch.long)
    for row, example in enumerate(examples):
        words = [ids[example.marked[patch]] for patch in example.patches]
        inputs[row, : len(words) + 1] = torch.tensor([ids[START], *words])
        labels[row, : len(words) + 1] = torch.tensor([*words, ids[END]])
    return normalised, inputs, labels


@dataclass
class CaptionResult:
    """A trained captioner and how well it does on fresh held-out images (see :func:`measure_captioner`)."""

    model: Any  # VisionEncoderDecoderModel, eval mode
    processor: Any
    tokenizer: Any
    accuracy: float  # share of held-out images captioned exactly right (greedy)
    peak_hits: float  # share of colour words whose cross-attention peak is on their patch
    seconds: float
    settings: TrainingSettings
    model_settings: CaptionModelSettings


def train_captioner(
    settings: TrainingSettings, model_settings: CaptionModelSettings | None = None, *, description: str | None = None
) -> CaptionResult:
    """Train on fresh task images every step (plain cross-entropy; AdamW, warmup then cosine decay), then measure."""
    settings.validate()
    model_settings = (model_settings or CaptionModelSettings()).validate()
    model, processor, tokenizer = build_caption_model(model_settings, settings.seed)

    def batch_loss(step: int) -> tuple[Tensor, Callable[[], str]]:
        examples = draw_examples(settings.batch_size, random.Random(f"train:{settings.seed}:{step}"))
        pixels, inputs, labels = example_tensors(examples)
        mask = (inputs != model.config.pad_token_id).long()  # [b, 5]: the padding after each caption (no loss there)
        logits = model(pixel_values=pixels, decoder_input_ids=inputs, decoder_attention_mask=mask).logits  # [b, 5, v]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return loss, lambda: f"loss {loss.item():.4f}"

    seconds = train_image_model(model, settings, description or f"training {TASK_NAME}", batch_loss, status_every=20)
    accuracy, hits = measure_captioner(model, caption_examples(settings.eval_examples, 10_000 + settings.seed))
    return CaptionResult(model, processor, tokenizer, accuracy, hits, seconds, settings, model_settings)


def measure_captioner(model, examples: list[CaptionExample]) -> tuple[float, float]:
    """(share of ``examples`` captioned exactly, share of colour words whose peak lands on their patch).

    Greedy decoding with transformers' own eager attention; the peak of the k-th word is the argmax over
    patches of the last decoder layer's cross-attention, maximum over heads, at the step that writes it
    (the query of the token before it).
    """
    ids = {word: index for index, word in enumerate(VOCABULARY)}
    words = {index: word for word, index in ids.items()}
    pixels, _, _ = example_tensors(examples)
    right = hits = total_words = 0
    with eager_attention(model), torch.no_grad():
        # the image encoded once, without its patterns (only the decoder's cross-attention is read)
        encoded = model.encoder(pixel_values=pixels)
        sequence = torch.full((len(examples), 1), ids[START], dtype=torch.long)  # [b, t]
        for _ in range(MAX_POSITIONS - 1):  # greedy, full recompute (five positions at most)
            mask = torch.ones_like(sequence)  # [b, t]: every written token counts, a written pad too
            logits = model(encoder_outputs=encoded, decoder_input_ids=sequence, decoder_attention_mask=mask).logits
            sequence = torch.cat([sequence, logits[:, -1].argmax(-1, keepdim=True)], dim=1)  # logits [b, t, vocab]
        outputs = model(
            encoder_outputs=encoded,
            decoder_input_ids=sequence[:, :-1],
            decoder_attention_mask=torch.ones_like(sequence[:, :-1]),
            output_attentions=True,
        )
    cross = outputs.cross_attentions[-1]  # [b, h, t, 1 + patches]
    peaks = cross[:, :, :, 1:].amax(dim=1).argmax(dim=-1)  # [b, t]: the patch each step looks at most
    for row, example in enumerate(examples):
        written = [words[int(token)] for token in sequence[row, 1:]]
        caption = written[: written.index(END)] if END in written else written
        right += " ".join(caption) == example.caption
        for k, patch in enumerate(example.patches):
            total_words += 1
            hits += int(peaks[row, k]) == patch
    return right / len(examples), hits / max(total_words, 1)


def save_captioner(result: CaptionResult, path: str | os.PathLike) -> Path:
    """Write the model, its image processor, its tokenizer and the task record into a new directory, atomically."""
    return save_image_task(
        path,
        (result.model, result.processor, result.tokenizer),
        {
            "task": TASK_NAME,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
            "colours": {word: list(rgb) for word, rgb in COLOURS.items()},
        },
        result,
        {"caption_accuracy": result.accuracy, "cross_attention_peak_on_patch": result.peak_hits},
    )
