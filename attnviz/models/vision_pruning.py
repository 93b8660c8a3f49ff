"""Pruning vision classifiers: how their heads are judged, and the pruned checkpoint with its image processor.

An image classifier (``ViTForImageClassification``, ``DeiTForImageClassification(WithTeacher)``,
``Dinov2ForImageClassification``, ``Dinov2WithRegistersForImageClassification``, the shipped
``toy-odd-patch``) is judged by :class:`PredictionObjective`: how far the masked or pruned model's
class distribution moves from the **unpruned model's own** distribution on the same images. No
labels are needed, so any folder of images of the right kind will do.

* loss: ``KL(p ‖ q) = Σ_c p_c (log p_c − log q_c)`` per image, averaged over images, where ``p``
  is the unpruned model's softmax over classes and ``q`` the judged model's (0 before pruning);
* metric: **agreement**, the share of images whose top class is unchanged (1 before pruning).

The KL divergence is minimal at the unpruned model, so its gradient with respect to a head-mask
variable at ξ = 1 is exactly zero, which makes it useless for Michel et al.'s gradient importance
(as for the representation objective of :mod:`attnviz.models.objective`). Gradient importance
therefore differentiates *random probes of the logits drawn from the Fisher metric*: near ``p``,
``KL ≈ ½ δzᵀ F δz`` with ``F = diag(p) − p pᵀ`` the Fisher information of the softmax in logit
space. With ``A = diag(√p) − p √pᵀ`` one has ``A Aᵀ = F``, so ``r = A n``, ``n ~ N(0, I)`` (seeded),
is a probe with covariance ``F``; ``Σᵢ rᵢ·zᵢ`` over the images then has ξ-gradient
``N(0, Σᵢ ∂zᵢᵀ F ∂zᵢ)``, whose mean absolute value is proportional to the square root of the
second-order (Gauss–Newton) estimate of the KL that removing the head causes. Since
``Σ_c r_c = 0`` the probe reads ``log q`` exactly as it reads the logits (it ignores a shift of all
logits). ``p`` is computed in float64, so a very confident image still gives a non-zero probe.

Towers without a classifier (CLIP, SigLIP) and bare models (``ViTModel``, ``Dinov2Model``) are refused:
without class predictions there is nothing to keep.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnviz.common.errors import ParameterError, UnsupportedModelError
from attnviz.core import AttentionContext
from attnviz.models.base import EncodedBatch, LoadedModel, PrunedCopy
from attnviz.models.objective import MIN_SCORING_UNITS, ProbedObjective

if TYPE_CHECKING:
    from attnviz.models.vision import VisionModel

#: how the class names of transformers' image classifiers end
CLASSIFIER_SUFFIXES = ("ForImageClassification", "ForImageClassificationWithTeacher")


def check_classifier(loaded: VisionModel) -> None:
    """Raise :class:`UnsupportedModelError` unless ``loaded`` is an image classifier whose heads can be masked."""
    architecture = type(loaded.model).__name__
    if not architecture.endswith(CLASSIFIER_SUFFIXES):
        raise UnsupportedModelError(
            f"{loaded.name} ({architecture}) has no classifier: give a *ForImageClassification checkpoint "
            "(attnviz prune judges a vision model's heads by how much its class predictions change)"
        )
    if loaded.fallback:
        raise UnsupportedModelError(
            f"{loaded.name} does not route its attention through attnviz's core, so attnviz cannot mask or prune "
            "its heads"
        )


def class_log_probabilities(loaded: LoadedModel, batch: EncodedBatch, context: AttentionContext) -> Tensor:
    """``[b, classes]`` float64 log-softmax of the classifier's logits on ``batch`` (differentiable)."""
    logits = loaded.forward(batch, context, logits=True).logits  # [b, classes]
    return torch.log_softmax(logits.double(), dim=-1)


def kl_divergence(reference: Tensor, log_q: Tensor) -> Tensor:
    """``[b]`` ``KL(p ‖ q)`` from ``[b, c]`` log-probabilities ``log p`` (``reference``) and ``log q``.

    Classes where ``p`` is exactly 0 contribute 0 (not ``0 · ∞``).
    """
    p = reference.exp()  # [b, c]
    return torch.where(p > 0, p * (reference - log_q), torch.zeros_like(p)).sum(-1)


class PredictionObjective(ProbedObjective):
    """KL divergence from the unpruned classifier's own class distribution; metric agreement (module docstring)."""

    loaded: VisionModel  # built by VisionModel.objective

    kind = "prediction"
    metric_name = "agreement"
    higher_is_better = True
    unit_name = "images"

    def keep_references(self) -> None:
        # The unpruned model's log-probabilities, [b, classes] float64, for the batches this process handles
        # (its probes: Fisher probes of the logits per batch, see the module docstring).
        self.references = {
            index: class_log_probabilities(self.loaded, self.batches[index], self.loaded.context()).detach()
            for index in self.local_indices()
        }

    def _units(self, batch: EncodedBatch) -> int:
        return len(batch)

    def check_enough_data(self, what: str = "scoring data") -> None:
        """Refuse fewer than :data:`MIN_SCORING_UNITS` images, naming the image parameter."""
        units = self.total_units()
        if units < MIN_SCORING_UNITS:
            parameter = "eval_images" if what.startswith("evaluation") else "images"
            more = f"{{{parameter}}}" + (" or draw more with {toy_examples}" if self.loaded.image_task else "")
            raise ParameterError(
                parameter,
                f"the {what} has only {units} image{'s' if units != 1 else ''} to judge heads on; at least "
                f"{MIN_SCORING_UNITS} are needed: give more images with {more}",
            )

    def batch_loss(self, index: int, context: AttentionContext) -> tuple[Tensor, int]:
        log_q = class_log_probabilities(self.loaded, self.batches[index], context)  # [b, c]
        kl = kl_divergence(self.references[index], log_q)  # [b]
        return kl.sum(), kl.shape[0]

    def gradient_losses(self, index: int, context: AttentionContext) -> list[Tensor]:
        log_q = class_log_probabilities(self.loaded, self.batches[index], context)  # [b, c]
        p = self.references[index].exp()  # [b, c] float64
        root = p.sqrt()  # [b, c]
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        losses = []
        for _ in range(self.probes):
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p.device)  # [b, c]
            scaled = root * noise  # [b, c]: diag(√p) n
            probe = scaled - p * scaled.sum(-1, keepdim=True)  # [b, c]: A n = diag(√p) n − p (√p·n), covariance F
            losses.append((probe * log_q).sum() / self.total_units())
        return losses

    def batch_quality(self, index: int, context: AttentionContext) -> tuple[float, float, int]:
        log_q = class_log_probabilities(self.loaded, self.batches[index], context)  # [b, c]
        reference = self.references[index]  # [b, c]
        kl = kl_divergence(reference, log_q)  # [b]
        agree = log_q.argmax(-1) == reference.argmax(-1)  # [b]
        return float(kl.sum()), float(agree.sum()), kl.shape[0]


def random_image_batch(loaded: VisionModel, seed: int) -> EncodedBatch:
    """One 224×224 image of seeded random pixels, through ``loaded``'s image processor (the latency input)."""
    from PIL import Image as PILImage

    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (224, 224, 3), generator=generator, dtype=torch.uint8)  # [H, W, rgb]
    return loaded.encode_images([PILImage.fromarray(pixels.numpy(), "RGB")])


def save_pruned_vision_model(
    original: VisionModel,
    directory: str | os.PathLike,
    pruned: PrunedCopy,
    *,
    source: str,
    transformers_copy: bool = False,
) -> tuple[Path, Path | None]:
    """Write a pruned vision classifier in the format of :mod:`attnviz.models.pruned_format`.

    The directory gets the image processor (``preprocessor_config.json``) in place of a tokenizer, and,
    for a toy trained on an image task, that task's marker (so the pruned toy can still draw examples).
    Its weights keep transformers' in-memory names (``save_original_format=False``), which the loader
    reads back tensor by tensor; the masked-weights copy is an ordinary checkpoint in the original format.
    """
    from attnviz.models.pruned_format import save_pruned_copy

    extra_files = {}
    if original.image_task is not None:
        from attnviz.models.base import IMAGE_TASK_FILE

        record = {"task": original.image_task, "pruned_from": source}
        extra_files[IMAGE_TASK_FILE] = json.dumps(record, indent=2) + "\n"
    return save_pruned_copy(
        directory,
        pruned,
        source=source,
        original=original,
        transformers_copy=transformers_copy,
        preprocessor=original.processor,
        save_options={"save_original_format": False},
        extra_files=extra_files,
    )
