"""What "quality" means when heads are removed: the loss that importance is measured on.

Every :class:`~attnviz.models.base.LoadedModel` says which objective judges it
(:meth:`~attnviz.models.base.LoadedModel.objective`); the three here are (image classifiers have
:class:`~attnviz.models.vision_pruning.PredictionObjective`):

* :class:`LanguageModelObjective` (causal LMs): next-token cross-entropy through
  the model's LM head; the metric is perplexity.
* :class:`~attnviz.toy.task_objective.TaskObjective` (attnviz toy models): the toy task's own loss;
  the metric is task accuracy.
* :class:`RepresentationObjective` (encoders without a task head, e.g. MiniLM):
  there are no labels (likewise for a decoder checkpoint without its LM head),
  so quality is *how little the output changes*: the loss is
  the relative distortion of the final hidden states,
  ``D = Σₜ‖hₜ − h⁰ₜ‖² / Σₜ‖h⁰ₜ‖²`` over all real tokens, where ``h⁰`` are the
  unpruned model's states; the metric is their mean cosine similarity (1 before
  pruning).

``D`` is minimal (0) at the unpruned model, so its gradient with respect to a
head-mask variable at ξ = 1 is exactly zero and useless for Michel et al.'s
gradient importance. For gradient importance the representation objective
therefore differentiates *random linear probes* of the output,
``Σₜ rₜ·hₜ`` with ``rₜ ~ N(0, I)`` (seeded): ``E|∂/∂ξₕ Σₜ rₜ·hₜ|`` is
proportional to ``‖∂h/∂ξₕ‖``, how strongly head ``h`` moves the output, whose
square is the second-order (Gauss–Newton) estimate of the distortion that
removing the head causes.

Every objective works on a fixed list of batches and returns *sums* and *counts*
per batch, so that the mean over the whole data set is exact however it is
batched.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnviz.common.errors import ParameterError, UnsupportedModelError
from attnviz.common.parallel import SINGLE_PROCESS, DataParallel
from attnviz.core import AttentionContext, HeadMask
from attnviz.models.base import EncodedBatch, LoadedModel

#: Fewest loss-bearing units (predicted tokens, tokens, or task examples) worth scoring heads on.
MIN_SCORING_UNITS = 8


@dataclass(frozen=True)
class Quality:
    """How good a (possibly masked or pruned) model is on an objective's data."""

    loss: float  # the objective's mean loss (lower is better)
    metric: float  # the objective's metric (perplexity, accuracy, cosine similarity or agreement)
    metric_name: str  # "perplexity", "accuracy", "cosine_similarity", "agreement" or "loss"
    higher_is_better: bool  # whether a larger metric is better

    @property
    def score(self) -> float:
        """Higher-is-better quality for minimum-score comparisons (1/perplexity for perplexity)."""
        if self.higher_is_better:
            return self.metric
        return 1.0 / self.metric if self.metric > 0 else math.inf


def at_least_float32(tensor: Tensor) -> Tensor:
    """Half-precision tensors as float32 (losses are summed in float32 or better); others unchanged."""
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


class Objective(ABC):
    """A loss over a fixed list of batches, evaluated through the attention core."""

    #: what the loss is, as the prune report names it ("language_model", "task", "representation")
    kind: str
    #: name of the metric reported before and after pruning
    metric_name: str
    #: whether a larger metric is better
    higher_is_better: bool
    #: what one loss unit is ("predicted tokens", "tokens", "examples")
    unit_name: str

    def __init__(
        self, loaded: LoadedModel, batches: Sequence[EncodedBatch], *, parallel: DataParallel = SINGLE_PROCESS
    ):
        self.loaded = loaded
        self.batches = list(batches)
        #: this process's share of a data-parallel run: every process holds every batch, and the
        #: passes over them (:meth:`evaluate`, :meth:`loss`, gradient importance) each run over
        #: :meth:`local_indices` and sum across processes
        self.parallel = parallel
        self._total_units: int | None = None
        self._local_indices: list[int] | None = None

    def local_indices(self) -> list[int]:
        """Indices of the batches this process handles (all of them in a single process)."""
        if self._local_indices is None:
            costs = [len(batch) * max(batch.lengths, default=0) for batch in self.batches]  # padded tokens
            self._local_indices = self.parallel.shard(costs)
        return self._local_indices

    # -- per batch --------------------------------------------------------------------------

    @abstractmethod
    def batch_loss(self, index: int, context: AttentionContext) -> tuple[Tensor, int]:
        """(sum of the loss over batch ``index``'s units, number of units); differentiable."""

    def gradient_losses(self, index: int, context: AttentionContext) -> list[Tensor]:
        """Scalars whose gradients with respect to the head mask measure importance on batch ``index``.

        Each is normalised by the data set's total unit count, so summing them
        over batches gives the gradient of the data set's mean loss. Several
        entries are independent estimates whose absolute gradients are averaged.
        """
        total, _ = self.batch_loss(index, context)
        return [total / self.total_units()]

    @abstractmethod
    def batch_quality(self, index: int, context: AttentionContext) -> tuple[float, float, int]:
        """(loss sum, metric sum, units) of batch ``index``, from one forward pass, without gradients."""

    def finish_metric(self, metric_sum: float, loss_mean: float, units: int) -> float:
        """The data set's metric from the summed per-batch values (a mean by default)."""
        return metric_sum / max(units, 1)

    # -- over all batches -------------------------------------------------------------------

    def units(self, index: int) -> int:
        """Loss units of batch ``index``."""
        return self._units(self.batches[index])

    @abstractmethod
    def _units(self, batch: EncodedBatch) -> int: ...

    def total_units(self) -> int:
        """Loss units over all batches."""
        if self._total_units is None:
            self._total_units = sum(self._units(batch) for batch in self.batches)
        return self._total_units

    def check_enough_data(self, what: str = "scoring data") -> None:
        """Raise :class:`InputError` when there is too little to score or evaluate on."""
        units = self.total_units()
        if units < MIN_SCORING_UNITS:
            raise ParameterError(
                "texts",
                f"the {what} has only {units} {self.unit_name} to score on; at least {MIN_SCORING_UNITS} "
                "are needed: give more or longer text with {texts}",
            )

    def evaluate(self, head_mask: HeadMask | None = None, progress=None) -> Quality:
        """Mean loss and metric over all batches with ``head_mask`` applied (no gradients).

        ``progress``: called once per batch (to advance a progress bar).
        """
        loss_sum, metric_sum, units = 0.0, 0.0, 0
        context = self.loaded.context(head_mask=head_mask)
        with torch.no_grad():
            for index in self.local_indices():
                batch_loss, batch_metric, count = self.batch_quality(index, context)
                loss_sum += batch_loss
                metric_sum += batch_metric
                units += count
                if progress is not None:
                    progress()
        loss_sum, metric_sum, unit_sum = self.parallel.sum_numbers([loss_sum, metric_sum, units])
        units = int(unit_sum)
        loss = loss_sum / max(units, 1)
        return Quality(loss, self.finish_metric(metric_sum, loss, units), self.metric_name, self.higher_is_better)

    def loss(self, head_mask: HeadMask | None = None) -> float:
        """Mean loss over all batches with ``head_mask`` applied (no gradients)."""
        loss_sum, units = 0.0, 0
        context = self.loaded.context(head_mask=head_mask)
        with torch.no_grad():
            for index in self.local_indices():
                total, count = self.batch_loss(index, context)
                loss_sum += float(total)
                units += count
        loss_sum, unit_sum = self.parallel.sum_numbers([loss_sum, units])
        return loss_sum / max(unit_sum, 1.0)

    def for_model(self, loaded: LoadedModel) -> Objective:
        """The same objective and data on another model (e.g. the physically pruned copy)."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.loaded = loaded
        return clone


class LanguageModelObjective(Objective):
    """Next-token cross-entropy of a causal LM, over every non-padding position; metric perplexity."""

    kind = "language_model"
    metric_name = "perplexity"
    higher_is_better = False
    unit_name = "predicted tokens"

    def __init__(
        self, loaded: LoadedModel, batches: Sequence[EncodedBatch], *, parallel: DataParallel = SINGLE_PROCESS
    ):
        super().__init__(loaded, batches, parallel=parallel)
        if not has_lm_head(loaded):
            raise UnsupportedModelError(
                f"{loaded.name} is a causal model without a language-modelling head, so its loss cannot be "
                "computed: give a *ForCausalLM checkpoint"
            )

    def _units(self, batch: EncodedBatch) -> int:
        return sum(max(length - 1, 0) for length in batch.lengths)

    def batch_loss(self, index: int, context: AttentionContext) -> tuple[Tensor, int]:
        batch = self.batches[index]
        logits = self.loaded.forward(batch, context, logits=True).logits  # [b, t, vocab]
        input_ids = batch.inputs["input_ids"]
        valid = batch.inputs["attention_mask"][:, 1:].bool()  # [b, t-1]: position t+1 is a real token
        targets = input_ids[:, 1:]  # [b, t-1]
        vocab = logits.shape[-1]
        nll = torch.nn.functional.cross_entropy(
            at_least_float32(logits[:, :-1]).reshape(-1, vocab),  # [b·(t-1), vocab]
            targets.reshape(-1),  # [b·(t-1)]
            reduction="none",
        ).view_as(targets)  # [b, t-1]
        return (nll * valid).sum(), int(valid.sum())

    def batch_quality(self, index: int, context: AttentionContext) -> tuple[float, float, int]:
        total, count = self.batch_loss(index, context)
        return float(total), 0.0, count  # perplexity is exp(mean loss): see finish_metric

    def finish_metric(self, metric_sum: float, loss_mean: float, units: int) -> float:
        return math.exp(min(loss_mean, 700.0))


class ProbedObjective(Objective):
    """An objective whose gradient importance differentiates seeded random probes of the output.

    Its loss is minimal (0) at the unpruned model, so its own gradient there is useless; each
    subclass says what its probes are.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        batches: Sequence[EncodedBatch],
        *,
        probes: int = 8,
        seed: int = 0,
        parallel: DataParallel = SINGLE_PROCESS,
    ):
        super().__init__(loaded, batches, parallel=parallel)
        #: random output probes per batch for gradient importance
        self.probes = probes
        #: seed of the probes
        self.seed = seed
        with torch.no_grad():
            self.keep_references()

    @abstractmethod
    def keep_references(self) -> None:
        """Keep what the unpruned model outputs on the batches, which the loss compares against (no gradient)."""


class RepresentationObjective(ProbedObjective):
    """Label-free: distortion of the final hidden states relative to the unpruned model (see module docstring)."""

    kind = "representation"
    metric_name = "cosine_similarity"
    higher_is_better = True
    unit_name = "tokens"

    def keep_references(self) -> None:
        # The unpruned model's final hidden states, one [b, t, e] tensor per batch.
        loaded = self.loaded
        self.references = [self._hidden(index, loaded.context()).detach() for index in range(len(self.batches))]
        energy = sum(float((ref**2).sum(-1)[self._valid(i)].sum()) for i, ref in enumerate(self.references))
        #: mean squared norm of a reference token state: the distortion's denominator
        self.mean_energy = max(energy / max(self.total_units(), 1), 1e-12)

    def _units(self, batch: EncodedBatch) -> int:
        return sum(batch.lengths)

    def _valid(self, index: int) -> Tensor:
        return self.batches[index].inputs["attention_mask"].bool()  # [b, t]

    def _hidden(self, index: int, context: AttentionContext) -> Tensor:
        outputs = self.loaded.forward(self.batches[index], context)
        hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]
        return at_least_float32(hidden)  # [b, t, e]

    def batch_loss(self, index: int, context: AttentionContext) -> tuple[Tensor, int]:
        hidden = self._hidden(index, context)  # [b, t, e]
        valid = self._valid(index)  # [b, t]
        squared_error = ((hidden - self.references[index]) ** 2).sum(-1)  # [b, t]
        return (squared_error * valid).sum() / self.mean_energy, int(valid.sum())

    def gradient_losses(self, index: int, context: AttentionContext) -> list[Tensor]:
        hidden = self._hidden(index, context)  # [b, t, e]
        valid = self._valid(index).to(hidden.dtype)[..., None]  # [b, t, 1]
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        scale = self.total_units() * math.sqrt(self.mean_energy)
        losses = []
        for _ in range(self.probes):
            probe = torch.randn(hidden.shape, generator=generator).to(hidden.device)  # [b, t, e]
            losses.append((probe * valid * hidden).sum() / scale)
        return losses

    def batch_quality(self, index: int, context: AttentionContext) -> tuple[float, float, int]:
        hidden = self._hidden(index, context)  # [b, t, e]
        valid = self._valid(index)  # [b, t]
        reference = self.references[index]  # [b, t, e]
        squared_error = ((hidden - reference) ** 2).sum(-1)  # [b, t]
        cosine = torch.nn.functional.cosine_similarity(hidden, reference, dim=-1)  # [b, t]
        return float(squared_error[valid].sum()) / self.mean_energy, float(cosine[valid].sum()), int(valid.sum())


def has_lm_head(loaded: LoadedModel) -> bool:
    """Whether ``loaded`` can produce next-token logits (a ``*ForCausalLM`` / ``*LMHeadModel`` checkpoint)."""
    return getattr(loaded.model, "get_output_embeddings", lambda: None)() is not None
