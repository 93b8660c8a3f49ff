"""Training toy models on their task: AdamW, warmup then cosine decay, fresh random examples every step.

Deterministic for a seed: weights are initialised and dropout drawn from
``torch.manual_seed(seed)`` inside a forked RNG (the caller's RNG state is left
alone), and the examples of step ``s`` come from ``random.Random(f"train:{seed}:{s}")``.
Held-out examples come from a different stream (``held-out:{seed}``).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from attnviz.common.errors import InputError, ParameterError
from attnviz.common.progress import progress_bar
from attnviz.common.resources import batch_memory, require_memory
from attnviz.toy.config import BYTES_PER_PARAMETER, ToyConfig, require_weights_memory
from attnviz.toy.loaded import ToyModel, label_loss, label_metrics
from attnviz.toy.model import ToyTransformer
from attnviz.toy.tasks import TaskSettings, get_task
from attnviz.toy.tokenizer import ToyTokenizer


@dataclass
class TrainingSettings:
    """How to train (stored in the checkpoint's metadata)."""

    # optimisation steps
    steps: int = 2000
    # random examples per step
    batch_size: int = 64
    # peak AdamW learning rate, reached after the warmup
    learning_rate: float = 3e-3
    # AdamW weight decay (on matrices only; not on biases, LayerNorms or embeddings)
    weight_decay: float = 0.01
    # steps of linear warmup before the cosine decay to 10% of the peak
    warmup_steps: int = 100
    # seeds the weights, the examples and dropout
    seed: int = 0
    # held-out examples for the final accuracy
    eval_examples: int = 1000
    # save a checkpoint every this many steps (None: only the final one)
    checkpoint_every: int | None = None

    def validate(self) -> TrainingSettings:
        for name in ("steps", "batch_size", "eval_examples"):
            if getattr(self, name) < 1:
                raise ParameterError(
                    name, f"{{{name}}} must be at least 1 (got {getattr(self, name)})", getattr(self, name)
                )
        if self.learning_rate <= 0:
            raise ParameterError(
                "learning_rate", f"{{learning_rate}} must be positive (got {self.learning_rate})", self.learning_rate
            )
        if self.weight_decay < 0 or self.warmup_steps < 0:
            raise InputError("weight decay and warmup steps must be 0 or more")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ParameterError(
                "checkpoint_every", f"{{checkpoint_every}} must be at least 1 (got {self.checkpoint_every})"
            )
        return self


@dataclass
class TrainingResult:
    model: ToyModel  # the trained model (in eval mode)
    held_out: dict[str, float]  # task metrics on fresh held-out examples
    history: list[dict[str, float]] = field(default_factory=list)  # step, loss, accuracy (of the training batch)
    seconds: float = 0.0  # wall time of the training loop


def build_toy_model(
    task: str,
    *,
    architecture: str | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    num_symbols: int | None = None,
    name: str | None = None,
    **config_fields,
) -> ToyModel:
    """An untrained toy model for ``task``: the vocabulary and position table are sized from the task.

    ``config_fields`` are :class:`ToyConfig` fields (``width=64, num_heads=4, attention="relative"``, …);
    fields not given, or given as None, take the task's recommended value (``Task.model_defaults``),
    then the :class:`ToyConfig` default.
    The weights are initialised from ``config_fields["seed"]`` (default 0), not from the global RNG.
    """
    spec = get_task(task)
    architecture = architecture or spec.default_architecture
    spec.check_architecture(architecture)
    settings = spec.settings(min_length, max_length, num_symbols)
    tokenizer = ToyTokenizer(spec.symbols(settings))
    fields = {**spec.model_defaults, **{key: value for key, value in config_fields.items() if value is not None}}
    try:
        config = ToyConfig(
            architecture=architecture,
            vocab_size=len(tokenizer),
            max_positions=spec.sequence_lengths(settings, architecture),
            **fields,
        ).validate()
    except TypeError as exc:  # a misspelt field name
        raise InputError(f"not a toy config field: {exc}") from exc
    with torch.random.fork_rng(devices=[]):  # the caller's RNG is neither used nor advanced
        torch.manual_seed(config.seed)
        model = ToyTransformer(config)
    return ToyModel(model, tokenizer, settings, name=name or f"toy-{task}")


def _optimizer(model: torch.nn.Module, settings: TrainingSettings) -> torch.optim.Optimizer:
    """AdamW with weight decay on weight matrices only (nanoGPT's split)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, parameter in model.named_parameters():
        is_matrix = parameter.dim() >= 2 and "embedding" not in name
        (decay if is_matrix else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=settings.learning_rate, betas=(0.9, 0.98))


def learning_rate_at(step: int, settings: TrainingSettings) -> float:
    """Linear warmup to the peak, then cosine decay to 10% of it at the last step."""
    if step < settings.warmup_steps:
        return settings.learning_rate * (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    return settings.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def evaluate(loaded: ToyModel, num_examples: int, seed: int, batch_size: int = 500) -> dict[str, float]:
    """Task metrics on ``num_examples`` held-out examples (stream ``held-out:{seed}``)."""
    rng = random.Random(f"held-out:{seed}")
    totals = {"loss": 0.0, "right": 0.0, "tokens": 0, "sequences_right": 0.0, "examples": 0}
    loaded.model.eval()
    for start in range(0, num_examples, batch_size):
        batch = loaded.batch_examples(loaded.task_examples(min(batch_size, num_examples - start), rng))
        metrics = loaded.task_metrics(batch)
        totals["loss"] += metrics["loss"] * metrics["tokens"]
        totals["right"] += metrics["accuracy"] * metrics["tokens"]
        totals["tokens"] += metrics["tokens"]
        totals["sequences_right"] += metrics["sequence_accuracy"] * metrics["examples"]
        totals["examples"] += metrics["examples"]
    tokens, examples = max(totals["tokens"], 1), max(totals["examples"], 1)
    return {
        "loss": totals["loss"] / tokens,
        "accuracy": totals["right"] / tokens,
        "sequence_accuracy": totals["sequences_right"] / examples,
        "examples": totals["examples"],
        "tokens": totals["tokens"],
    }


def train_toy_model(
    loaded: ToyModel,
    settings: TrainingSettings,
    *,
    on_checkpoint: Callable[[int, ToyModel], None] | None = None,
    description: str | None = None,
) -> TrainingResult:
    """Train ``loaded`` in place on fresh examples of its task, with a progress bar showing loss and accuracy.

    The weights are re-initialised from ``settings.seed`` first, so the result depends
    only on the config and the settings. ``on_checkpoint(step, model)`` runs every
    ``settings.checkpoint_every`` steps (not at the last step).
    """
    settings.validate()
    config = loaded.config
    # weights, gradients and AdamW's two moments; every layer keeps its activations for the backward pass
    require_weights_memory(config, copies=4)
    weights = 4 * config.parameter_estimate() * BYTES_PER_PARAMETER
    layers = config.num_layers + (config.decoder_layers if config.architecture == "encoder-decoder" else 0)
    per_step = layers * batch_memory(settings.batch_size, config.max_positions, heads=config.num_heads)
    require_memory("batch_size", settings.batch_size, weights + per_step, "one training step")
    model = loaded.model
    history: list[dict[str, float]] = []
    started = time.perf_counter()
    threads = torch.get_num_threads()
    # Toy-sized matrices are fastest on one thread, and far slower with threads fighting over busy cores.
    torch.set_num_threads(1)
    try:
        _train_steps(loaded, settings, history, on_checkpoint, description)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    seconds = time.perf_counter() - started
    held_out = evaluate(loaded, settings.eval_examples, settings.seed)
    loaded.metadata["training"] = {"settings": asdict(settings), "seconds": round(seconds, 1)}
    loaded.metadata["held_out"] = held_out
    loaded.metadata["step"] = settings.steps
    return TrainingResult(loaded, held_out, history, seconds)


def _train_steps(
    loaded: ToyModel,
    settings: TrainingSettings,
    history: list[dict[str, float]],
    on_checkpoint: Callable[[int, ToyModel], None] | None,
    description: str | None,
) -> None:
    model = loaded.model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        fresh = ToyTransformer(loaded.config)  # deterministic initial weights for this seed
        model.load_state_dict(fresh.state_dict())
        optimizer = _optimizer(model, settings)
        model.train()
        with progress_bar() as progress:
            task_id = progress.add_task(description or f"training {loaded.task}", total=settings.steps, status="")
            for step in range(settings.steps):
                for group in optimizer.param_groups:
                    group["lr"] = learning_rate_at(step, settings)
                rng = random.Random(f"train:{settings.seed}:{step}")
                batch = loaded.batch_examples(loaded.task_examples(settings.batch_size, rng))
                logits = loaded.forward(batch).logits  # [b, q, vocab]
                labels = batch.inputs["labels"]
                loss = label_loss(logits, labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                if step % 10 == 0 or step == settings.steps - 1:
                    metrics = label_metrics(logits.detach(), labels)
                    history.append({"step": step + 1, "loss": metrics["loss"], "accuracy": metrics["accuracy"]})
                    status = f"loss {metrics['loss']:.3f}  accuracy {metrics['accuracy']:.1%}"
                    progress.update(task_id, status=status)
                progress.advance(task_id)
                every = settings.checkpoint_every
                if on_checkpoint is not None and every and (step + 1) % every == 0 and step + 1 < settings.steps:
                    model.eval()
                    on_checkpoint(step + 1, loaded)
                    model.train()


__all__ = [
    "TaskSettings",
    "TrainingResult",
    "TrainingSettings",
    "build_toy_model",
    "evaluate",
    "learning_rate_at",
    "train_toy_model",
]
