"""A toy model as attnviz's :class:`~attnviz.models.base.LoadedModel`, plus what only toy models have: a task.

Texts are written in the toy vocabulary: symbols separated by spaces
(``"3 1 4 1 5"``, ``"a b c a b c"``) or, when every symbol is one character,
run together (``"31415"``). attnviz lays them out as the task was trained
(see :mod:`attnviz.toy.tasks`): ``<bos>``, ``<sep>`` and ``<eos>`` are added,
never typed. For sequence-to-sequence tasks the text is the input items and a
target is the answer the decoder reads; without one, the model's own greedy
answer is used, so a heatmap shows the model doing the task. Decoder-only
sequence-to-sequence models also accept ``"3 1 4 <sep> 4 1 3"``.

Every batch carries ``inputs["labels"]``: ``[b, q]`` token ids the output side
should predict, ``-100`` where nothing is scored.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnviz.common.errors import InputError, UnsupportedModelError
from attnviz.common.parallel import SINGLE_PROCESS, DataParallel
from attnviz.common.resources import batch_memory, require_memory
from attnviz.core import AttentionContext, AttentionSite
from attnviz.models.base import EncodedBatch, LoadedModel, PrunedCopy
from attnviz.models.probing import ProbeBatch
from attnviz.models.pruning_records import identity_from_history
from attnviz.models.readers import HeadInput, LayerReaders, Projection, ResidualReaders, check_residual_sum
from attnviz.models.readout import Readout, readout_of
from attnviz.models.slicing import head_output_slices
from attnviz.outputs import files
from attnviz.toy.config import ToyConfig
from attnviz.toy.encoding import IGNORE, batch_toy_examples, encode_toy_texts, greedy_answers
from attnviz.toy.files import write_checkpoint_files
from attnviz.toy.inputs import random_symbols_batch, symbol_probe_batches
from attnviz.toy.model import Block, ToyOutput, ToyTransformer
from attnviz.toy.pruning import prune_toy_heads
from attnviz.toy.task_objective import TaskObjective
from attnviz.toy.tasks import Task, TaskSettings, ToyExample, get_task
from attnviz.toy.tokenizer import ToyTokenizer


class ToyModel(LoadedModel):
    """A :class:`ToyTransformer` with its tokenizer and task."""

    model: ToyTransformer

    def __init__(
        self,
        model: ToyTransformer,
        tokenizer: ToyTokenizer,
        task_settings: TaskSettings,
        *,
        name: str = "toy",
        metadata: dict[str, Any] | None = None,
    ):
        self.model = model
        self.config: ToyConfig = model.config
        self.tokenizer = tokenizer
        self.task_settings = task_settings
        self.toy_task: Task = get_task(task_settings.task)
        #: the task's name (copy, reverse, sort, previous-token, induction)
        self.task = task_settings.task
        self.name = name
        self.causal = self.config.architecture == "decoder"
        self.encoder_decoder = self.config.architecture == "encoder-decoder"
        self.max_length = self.config.max_positions
        #: what the checkpoint recorded: training settings, held-out metrics, pruning history, …
        self.metadata: dict[str, Any] = dict(metadata or {})
        #: the checkpoint directory this model was loaded from (None when built in memory)
        self.source_path: Path | None = None
        self._refresh_sites()
        pruned = self.metadata.get("pruned")
        history = pruned.get("removed") if isinstance(pruned, dict) else pruned
        if history:  # checked against the weights: a record that disagrees raises RecordError
            self.head_identity = identity_from_history(history, self.layout(), self.config.num_heads)

    def _refresh_sites(self) -> None:
        self._sites: dict[nn.Module, AttentionSite] = {m: site for site, m in self.model.attention_modules().items()}

    # -- LoadedModel --------------------------------------------------------------------------------

    def with_model(self, model: nn.Module) -> ToyModel:
        assert isinstance(model, ToyTransformer)
        return type(self)(model, self.tokenizer, self.task_settings, name=self.name, metadata=self.metadata)

    def check_head_removal(self) -> None:
        """Every toy attention variant can lose heads."""

    def remove_heads(self, removed: Mapping[AttentionSite, Sequence[int]]) -> tuple[ToyModel, None]:
        return prune_toy_heads(self, removed), None

    def check_objective(self) -> None:
        """Every toy architecture, encoder-decoder included, is judged by its task's loss."""

    def objective(
        self, batches: list[EncodedBatch], *, probes: int = 8, seed: int = 0, parallel: DataParallel = SINGLE_PROCESS
    ) -> TaskObjective:
        return TaskObjective(self, batches, parallel=parallel)

    # -- causal analysis: the toy's final LayerNorm and output head are its readout ------------------

    def check_patching(self) -> None:
        if self.encoder_decoder:
            raise UnsupportedModelError(
                f"{self.name} is an encoder-decoder toy model: attnviz patch supports decoder and encoder toys"
            )

    def vocabulary_tokens(self, text: str) -> tuple[list[int], list[str]]:
        tokens = self.tokenizer.split(text)
        return self.tokenizer.ids(tokens), tokens

    def answer_position(self, batch: EncodedBatch, index: int) -> int:
        return batch.lengths[index] - 1  # the last position (an encoder toy labels every position)

    def head_output_weights(self) -> dict[AttentionSite, tuple[Tensor, Tensor | None]]:
        return {
            site: (module.output.weight.detach(), module.output.bias.detach())
            for site, module in sorted(self.model.attention_modules().items())
        }

    def readout(self) -> Readout | None:
        return readout_of(self.model.final_norm, self.model.lm_head)

    def residual_readers(self) -> ResidualReaders:
        """The blocks of a decoder or encoder toy (pre-LayerNorm sums): separate query, key and value ``nn.Linear``."""
        self.check_patching()
        blocks = self.model.decoder if self.model.decoder is not None else self.model.encoder
        assert blocks is not None  # a decoder or an encoder toy (check_patching refuses encoder-decoder toys)
        layers = []
        for block in blocks:
            assert isinstance(block, Block)
            attention = block.attention
            linears: tuple[tuple[HeadInput, nn.Linear], ...] = (
                ("q", attention.query), ("k", attention.key), ("v", attention.value)
            )  # fmt: skip
            projections = tuple(
                Projection(linear, linear.weight.detach(), linear.bias.detach(), attention.head_dim,
                           tuple((kind, head) for head in range(attention.heads)))
                for kind, linear in linears
            )  # fmt: skip
            layers.append(
                LayerReaders(attention.site, block, block.attention_norm, projections, block.mlp_norm, block.mlp)
            )
        return check_residual_sum(self, ResidualReaders(tuple(layers), self.model.final_norm))

    def save_pruned(
        self, directory: str | os.PathLike, pruned: PrunedCopy, *, source: str, transformers_copy: bool = False
    ) -> tuple[Path, None]:
        """A toy checkpoint (its config records the heads per layer, its metadata what was removed)."""
        with files.staged_directory(Path(directory)) as stage:
            assert isinstance(pruned.model, ToyModel)
            write_checkpoint_files(pruned.model, stage)
        return Path(directory), None

    def source_paths(self) -> list[Path]:
        return [Path(self.source_path).resolve()] if self.source_path is not None else []

    def timing_batch(self, tokens: int, *, texts: Sequence[str], seed: int = 0) -> EncodedBatch:
        return random_symbols_batch(self, tokens, seed)

    def default_probe_length(self, longest: int) -> int:
        """The task's longest sequence (the induction toy: 8), at most as many symbols as there are, so the
        probe looks like what the model was trained on."""
        fits = (self.config.max_positions - 1) // 2
        return max(2, min(self.task_settings.max_length, len(self.tokenizer.symbols), fits))

    def probe_batches(self, length: int, sequences: int, *, seed: int, batch_size: int) -> list[ProbeBatch]:
        return symbol_probe_batches(self, length, sequences, seed=seed, batch_size=batch_size)

    def site_of(self, module: nn.Module) -> AttentionSite | None:
        return self._sites.get(module)

    def head_output_projections(self) -> dict[AttentionSite, Tensor]:
        """Each toy attention's ``output`` ``nn.Linear``, cut by head (sites whose heads were all pruned left out)."""
        modules = self.model.attention_modules()
        return {
            site: head_output_slices(module.output, module.head_dim)
            for site, module in modules.items()
            if module.heads > 0
        }

    def stacks(self) -> tuple[str, ...]:
        return self.config.stacks()

    def layout(self) -> dict[AttentionSite, int]:
        """Heads at every site, from the module sizes (pruned layers included)."""
        return dict(sorted((site, module.heads) for site, module in self.model.attention_modules().items()))

    #: (texts, *, targets, max_length, truncate): texts of the toy vocabulary as a right-padded batch with labels
    encode = encode_toy_texts

    def forward(
        self, batch: EncodedBatch, context: AttentionContext | None = None, *, logits: bool = True
    ) -> ToyOutput:
        """Run the model; returns :class:`ToyOutput` (``logits`` ``[b, q, vocab]`` of the output side).

        ``logits`` is accepted for symmetry with ``HFModel.forward``; toy models always compute them.
        """
        inputs = batch.inputs
        return self.model(
            input_ids=inputs["input_ids"],
            attention_mask=inputs.get("attention_mask"),
            decoder_input_ids=inputs.get("decoder_input_ids"),
            decoder_attention_mask=inputs.get("decoder_attention_mask"),
            context=context,
        )

    # -- the task ---------------------------------------------------------------------------------------

    def task_examples(self, num_examples: int, rng: random.Random) -> list[ToyExample]:
        items = [self.toy_task.sample(rng, self.task_settings) for _ in range(num_examples)]
        return [self.toy_task.example(self.config.architecture, x) for x in items]

    def own_examples(self, num_examples: int, seed: int) -> EncodedBatch:
        # one batch, one forward pass: its attention weights count too
        needed = batch_memory(num_examples, self.config.max_positions, heads=self.config.num_heads)
        require_memory("toy_examples", num_examples, needed, "the task's examples")
        return self.task_batch(num_examples, seed)

    def task_batch(self, num_examples: int, seed: int) -> EncodedBatch:
        """``num_examples`` fresh random examples of the task (the same for the same seed), labels included."""
        if num_examples < 1:
            raise InputError(f"need at least one example (got {num_examples})")
        return self.batch_examples(self.task_examples(num_examples, random.Random(seed)))

    def task_loss(self, batch: EncodedBatch, context: AttentionContext | None = None) -> Tensor:
        """Mean cross-entropy over the labelled positions: a differentiable scalar."""
        return label_loss(self.forward(batch, context).logits, batch.inputs["labels"])

    def task_metrics(self, batch: EncodedBatch, context: AttentionContext | None = None) -> dict[str, float]:
        """``loss``, ``accuracy`` (labelled tokens predicted right), ``sequence_accuracy`` (examples all right)."""
        with torch.no_grad():
            logits = self.forward(batch, context).logits
        return label_metrics(logits, batch.inputs["labels"])

    def generate(self, items: Sequence[list[str]], *, max_length: int | None = None) -> list[list[str]]:
        """The model's greedy answer to each item list (sequence-to-sequence tasks), ``<eos>`` left out."""
        return greedy_answers(self, items, max_length=max_length)

    def batch_examples(self, examples: Sequence[ToyExample], truncated: list[bool] | None = None) -> EncodedBatch:
        """Pad examples on the right into an :class:`EncodedBatch` on the model's device."""
        return batch_toy_examples(self, examples, truncated)


def label_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy of ``logits`` ``[b, q, vocab]`` over the labelled positions of ``labels`` ``[b, q]``."""
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)


def label_metrics(logits: Tensor, labels: Tensor) -> dict[str, float]:
    """Loss and accuracies of ``logits`` ``[b, q, vocab]`` against ``labels`` ``[b, q]`` (``-100`` unscored)."""
    scored = labels != IGNORE  # [b, q]
    loss = label_loss(logits, labels)
    right = (logits.argmax(-1) == labels) & scored  # [b, q]
    has_labels = scored.any(dim=1)  # [b]
    all_right = (right | ~scored).all(dim=1) & has_labels  # [b]
    tokens = int(scored.sum())
    examples = int(has_labels.sum())
    return {
        "loss": float(loss),
        "accuracy": float(right.sum()) / max(tokens, 1),
        "sequence_accuracy": float(all_right.sum()) / max(examples, 1),
        "examples": examples,
        "tokens": tokens,
    }
