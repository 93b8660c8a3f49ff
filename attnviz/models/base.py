"""What every loaded model looks like to the rest of attnviz.

Capture, statistics and pruning only talk to :class:`LoadedModel`: it encodes
texts into an :class:`EncodedBatch` and runs a forward pass with an
:class:`~attnviz.core.AttentionContext`. Hugging Face models
(:mod:`attnviz.models.hf`) and attnviz's toy models implement it.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from attnviz.common.errors import InputError, ModelSpecError, UnsupportedModelError
from attnviz.common.parallel import SINGLE_PROCESS, DataParallel
from attnviz.common.resources import batch_memory, require_memory
from attnviz.core import AttentionContext, AttentionSite
from attnviz.core.weighting import FactorCache
from attnviz.models.encoded_batch import EncodedBatch
from attnviz.models.placement import input_device
from attnviz.models.probing import ProbeBatch

if TYPE_CHECKING:  # the objectives are built on top of this module
    from attnviz.models.identity import HeadIdentity
    from attnviz.models.objective import Objective
    from attnviz.models.readers import ResidualReaders
    from attnviz.models.readout import Readout


#: file that marks a toy checkpoint directory (written by ``attnviz train``)
TOY_MARKER = "attnviz-toy.json"
#: file that marks a physically pruned Hugging Face checkpoint (written by ``attnviz prune``)
PRUNED_MARKER = "attnviz-pruned.json"
#: file that records the toy image task a vision checkpoint was trained on (``attnviz train odd-patch``)
IMAGE_TASK_FILE = "attnviz-image-task.json"


@dataclass(frozen=True)
class PrunedCopy:
    """What :meth:`LoadedModel.remove_heads` made of a model, as :meth:`LoadedModel.save_pruned` writes it."""

    model: LoadedModel  # the smaller model
    removed: Mapping[AttentionSite, Sequence[int]]  # heads removed, in the original model's numbering
    plans: dict | None = None  # the per-site plan remove_heads returned (Hugging Face families)


class LoadedModel(ABC):
    """A model ready for attnviz: encodes text, runs through the attention core."""

    #: what the user typed (or a short name), shown in titles and reports
    name: str
    #: where the weights came from, one line (``named model toy-reverse (/…)``, ``directory ./toy-reverse``);
    #: set by :func:`attnviz.models.specs.load_model`
    source: str = ""
    #: the underlying torch module
    model: nn.Module
    tokenizer: Any  # transformers' tokenizer, or attnviz's toy tokenizer
    #: decoder-only causal LM (queries see only earlier keys)
    causal: bool = False
    #: has encoder, decoder and cross-attention stacks
    encoder_decoder: bool = False
    #: longest input the model accepts (positions), or None when unbounded
    max_length: int | None = None
    #: what the model reads: text (token sequences), images (a vision transformer, see attnviz.models.vision) or audio
    #: (Whisper, attnviz.models.audio)
    modality: Literal["text", "image", "audio"] = "text"
    #: reads a picture inside a text (a vision-language model, :mod:`attnviz.models.vlm`) as well as text alone
    reads_pictures_in_text: bool = False
    #: a pruned model: the original number of each head its weights hold, from its checked pruning record
    #: (:mod:`attnviz.models.pruning_records`); None when the model was not pruned
    head_identity: HeadIdentity | None = None

    _layout: dict[AttentionSite, int] | None = None

    @property
    def device(self) -> torch.device:
        """Where inputs go: the device the model's first module runs on (accelerate's execution device for a
        model dispatched with ``device_map``, whose offloaded weights sit on the meta device between calls)."""
        return input_device(self.model)

    @abstractmethod
    def encode(
        self,
        texts: Sequence[str],
        *,
        targets: Sequence[str] | None = None,
        max_length: int | None = None,
        truncate: bool = True,
    ) -> EncodedBatch:
        """Tokenise ``texts`` (and decoder ``targets``) into a right-padded batch on the model's device."""

    @abstractmethod
    def forward(self, batch: EncodedBatch, context: AttentionContext | None = None, *, logits: bool = False) -> Any:
        """Run the model on ``batch``; every attention call goes through the core with ``context``.

        ``logits``: also project onto the vocabulary where that is a separate step (a Hugging Face LM head);
        models that always compute logits ignore it.
        """

    def token_counts(self, texts: Sequence[str], *, max_length: int | None = None) -> list[int]:
        """Tokens each text encodes to, special tokens included (callers cap them at the length limit).

        This default encodes each text (exact; cheap for small vocabularies); tokenizers count faster.
        """
        return [len(self.encode([text], max_length=max_length).tokens[0]) for text in texts]

    def stacks(self) -> tuple[str, ...]:
        """The attention stacks this model has, in the order they run."""
        return ("encoder", "decoder", "cross") if self.encoder_decoder else ("self",)

    def layout(self) -> dict[AttentionSite, int]:
        """Number of query heads at every attention site, found by a tiny probe forward pass.

        Probing (rather than reading the config) also gets pruned models with
        different head counts per layer right.
        """
        if self._layout is None:
            recorder = _HeadCounter()
            batch = self.probe_batch()
            with torch.no_grad():
                self.forward(batch, AttentionContext(observers=[recorder], site_of=self.site_of))
            for site, keys in recorder.keys.items():
                batch.check_keys_are_tokens(self.name, site, keys)
            self._layout = dict(sorted(recorder.heads.items()))
        return self._layout

    def probe_batch(self) -> EncodedBatch:
        """One tiny input of the model's own modality for a probe forward pass that finds the attention sites.

        A short text (with a short decoder target for encoder-decoder models); vision models give a grey image.
        """
        return self.encode(["attention probe"], targets=["probe"] if self.encoder_decoder else None)

    def num_layers(self, stack: str | None = None) -> int:
        """Layers of ``stack`` as the model numbers them: one past its last attention layer (a hybrid stack numbers
        its layers without attention too, :meth:`attention_layers`)."""
        return max(self.attention_layers(stack), default=-1) + 1

    def attention_layers(self, stack: str | None = None) -> list[int]:
        """The layers of ``stack`` that have attention, in the model's numbering (every layer but in a hybrid
        stack, where recurrent or convolution layers sit between them, e.g. Qwen3-Next, Jamba, Nemotron-H)."""
        stack = stack or self.stacks()[0]
        return sorted(site.layer for site in self.layout() if site.stack == stack)

    def present_layers(self, stack: str | None = None) -> list[int] | None:
        """:meth:`attention_layers` where some layers of ``stack`` lack attention, else None (every layer has it):
        the ``present`` argument of :func:`attnviz.common.selection.resolve_layers`."""
        layers = self.attention_layers(stack)
        return None if layers == list(range(len(layers))) else layers

    def num_heads(self, stack: str | None = None) -> int:
        """Heads per layer of ``stack`` (the largest, if pruning made them differ)."""
        stack = stack or self.stacks()[0]
        return max(h for site, h in self.layout().items() if site.stack == stack)

    def site_of(self, module: nn.Module) -> AttentionSite | None:
        """The site of an attention module (used by the core to name what it observes)."""
        return None

    def own_examples(self, num_examples: int, seed: int) -> EncodedBatch | None:
        """A batch of the model's own data when it has some (a toy model's task), else None.

        Commands measure a model on its own data when the user gives no text; text models have none
        and are measured on a corpus (the shipped one by default).
        """
        return None

    def own_images(self, count: int, seed: int) -> list | None:
        """``count`` images of the model's own task drawn with ``seed`` (a toy vision model), else None."""
        return None

    def own_example_batches(self, num_examples: int, *, batch_size: int, seed: int) -> list[EncodedBatch] | None:
        """``num_examples`` of the model's own data in batches of at most ``batch_size``, or None when it has none.

        Batch ``i`` is :meth:`own_examples` drawn with seed ``seed * 1_000_003 + i``, so the same
        arguments give the same data however often they are drawn.
        """
        if num_examples < 1:
            return None
        first = self.own_examples(min(batch_size, num_examples), seed * 1_000_003)
        if first is None:  # no data of its own (a text model): toy_examples does not apply, nothing to estimate
            return None
        # every batch is held at once: refuse before drawing (or even listing) the rest when they cannot fit
        tokens = self.max_length or max(first.lengths, default=1)
        require_memory("toy_examples", num_examples, batch_memory(num_examples, tokens), "the examples")
        sizes = [min(batch_size, num_examples - start) for start in range(0, num_examples, batch_size)]
        rest = [self.own_examples(size, seed * 1_000_003 + index) for index, size in enumerate(sizes) if index]
        batches = [first, *rest]
        if any(batch is None for batch in batches):
            return None
        return [batch for batch in batches if batch is not None]

    def check_weights(self) -> None:
        """Raise :class:`~attnviz.common.errors.ModelSpecError` where a weight holds NaN or ±inf: every pattern
        reading it would be NaN, which no capture, statistic or figure can show (checked when a model loads)."""
        for name, parameter in self.model.named_parameters():
            if (
                parameter.is_floating_point()
                and parameter.device.type != "meta"
                and not torch.isfinite(parameter).all()
            ):
                raise ModelSpecError(
                    f"the weights of model {self.name!r} hold NaN or infinite values ({name}): the checkpoint is "
                    "damaged or was saved from a diverged run; give a healthy checkpoint"
                )

    @property
    def factor_cache(self) -> FactorCache:
        """The value norms' factors of this model's output projections, kept from one call to the next and reused
        while the weights are unchanged (:class:`attnviz.core.weighting.FactorCache`)."""
        cache = self.__dict__.get("_factor_cache")
        if cache is None:
            cache = self.__dict__["_factor_cache"] = FactorCache()
        return cache

    def head_output_projections(self) -> dict[AttentionSite, Tensor]:
        """Every site's output-projection slice of each query head, ``[h, d, hidden]`` float32 (see
        :func:`attnviz.models.slicing.head_output_slices`): what norm-based weighting multiplies the values by.

        Raises :class:`~attnviz.common.errors.UnsupportedModelError` where the weights are laid out in a way
        attnviz does not know.
        """
        raise UnsupportedModelError(
            f"{self.name}: attnviz cannot find the output projection of each head of this kind of model, so it "
            "cannot weigh attention by value norms; use the plain weights"
        )

    def rotary_frequencies(self) -> Tensor | None:
        """Angular frequency (radians per position) of each rotary pair of head dimensions ``(i, i + d_rot/2)``,
        ``[d_rot / 2]``, for a model with rotary position embeddings; None otherwise."""
        return None

    def with_model(self, model: nn.Module) -> LoadedModel:
        """The same kind of loaded model (same tokenizer and name) around another torch module."""
        raise UnsupportedModelError(f"{self.name}: attnviz cannot rewrap this kind of model")

    def check_head_removal(self) -> None:
        """Raise :class:`~attnviz.common.errors.UnsupportedModelError` unless :meth:`remove_heads` can work here."""
        raise UnsupportedModelError(f"{self.name}: attnviz cannot remove heads from this kind of model")

    def remove_heads(self, removed: Mapping[AttentionSite, Sequence[int]]) -> tuple[LoadedModel, dict | None]:
        """A copy without the heads in ``removed`` (this model is left unchanged), and the per-site plan if any."""
        raise UnsupportedModelError(f"{self.name}: attnviz cannot remove heads from this kind of model")

    def timing_batch(self, tokens: int, *, texts: Sequence[str], seed: int = 0) -> EncodedBatch:
        """One example of ``tokens`` positions (at most the model's maximum length) to time forward passes on.

        Text models cut it from ``texts`` repeated; models with their own vocabulary may draw it with ``seed``.
        """
        return self.encode([" ".join(texts)], max_length=tokens)

    def default_probe_length(self, longest: int) -> int:
        """Random tokens per probe block when none is given: ``longest``, or less where the model reads
        fewer positions (two blocks and two framing tokens must fit)."""
        if self.max_length is not None:
            return max(2, min(longest, (self.max_length - 2) // 2))
        return longest

    def probe_batches(self, length: int, sequences: int, *, seed: int, batch_size: int) -> list[ProbeBatch]:
        """``sequences`` probe sequences of ``length`` random tokens written twice, drawn with ``seed`` from the
        model's own vocabulary, in batches of ``batch_size`` (the probes of :mod:`attnviz.heads.probes`)."""
        raise InputError(f"{self.name}: attnviz cannot build probe sequences for this kind of model")

    def check_generation(self) -> None:
        """Raise :class:`~attnviz.common.errors.UnsupportedModelError` unless the model writes text token by token
        through the attention core (a causal LM or an encoder-decoder model with its language-model head)."""
        raise UnsupportedModelError(
            f"{self.name} cannot write text through attnviz: generation needs a Hugging Face causal LM or "
            "encoder-decoder model"
        )

    # -- causal analysis: patching, ablation and direct logit attribution (attnviz.patching) --------

    def check_patching(self) -> None:
        """Raise :class:`~attnviz.common.errors.UnsupportedModelError` unless attnviz can patch this model's heads
        and read its logits (an encoder-decoder model, or one without a language-model head, is refused)."""
        raise UnsupportedModelError(f"{self.name}: attnviz cannot patch the heads of this kind of model")

    def vocabulary_tokens(self, text: str) -> tuple[list[int], list[str]]:
        """The token ids and token strings ``text`` encodes to on its own, without special tokens."""
        raise UnsupportedModelError(f"{self.name}: attnviz cannot tokenise answers for this kind of model")

    def answer_position(self, batch: EncodedBatch, index: int) -> int:
        """The position of example ``index`` whose logits name the answer: the last token of a causal model,
        the one mask token of an encoder (:class:`~attnviz.common.errors.InputError` when there is none)."""
        if self.causal:
            return batch.lengths[index] - 1
        raise InputError(f"{self.name} is not a causal language model: attnviz cannot tell where its answer is read")

    def repeated_inputs(self, batch: EncodedBatch, index: int, count: int) -> dict[str, Any]:
        """The model inputs of example ``index`` of ``batch``, repeated ``count`` times along the batch: every
        tensor whose first axis is the batch's (others, such as a flag, as they are)."""
        return {
            name: value[index : index + 1].expand(count, *value.shape[1:]).contiguous()
            if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == len(batch)
            else value
            for name, value in batch.inputs.items()
        }

    def head_output_weights(self) -> dict[AttentionSite, tuple[Tensor, Tensor | None]]:
        """Per site: the output projection as applied to the merged heads, ``W`` ``[width, h·d]`` (head ``h`` reads
        columns ``h·d … h·d+d−1``), and its bias ``[width]`` or None: ``residual += W z + b``."""
        raise UnsupportedModelError(f"{self.name}: attnviz cannot find the output projections of this kind of model")

    def readout(self) -> Readout | None:
        """The final normalisation and unembedding (:mod:`attnviz.models.readout`), or None where the logits are not
        ``W_U · norm(residual)`` (then direct logit attribution is not defined)."""
        return None

    def residual_readers(self) -> ResidualReaders:
        """Every layer's readers and writers of the residual stream (:mod:`attnviz.models.readers`): what attribution
        over edges and circuits need. Raises :class:`~attnviz.common.errors.UnsupportedModelError` where the layers
        are not a pre-norm sum of attention and MLP outputs."""
        raise UnsupportedModelError(f"{self.name}: attnviz cannot find circuits in this kind of model")

    # -- pruning: how heads are judged, and the pruned model on disk -------------------------------

    def check_objective(self) -> None:
        """Raise :class:`~attnviz.common.errors.UnsupportedModelError` unless :meth:`objective` can judge these heads."""
        raise UnsupportedModelError(f"{self.name}: attnviz cannot judge the heads of this kind of model")

    def objective(
        self, batches: list[EncodedBatch], *, probes: int = 8, seed: int = 0, parallel: DataParallel = SINGLE_PROCESS
    ) -> Objective:
        """The loss this model's heads are judged by on ``batches`` (see :mod:`attnviz.models.objective`).

        ``probes``, ``seed``: the random output probes of a label-free objective (gradient importance);
        ``parallel``: this process's share of a data-parallel run.
        """
        raise UnsupportedModelError(f"{self.name}: attnviz cannot judge the heads of this kind of model")

    def save_pruned(
        self, directory: str | os.PathLike, pruned: PrunedCopy, *, source: str, transformers_copy: bool = False
    ) -> tuple[Path, Path | None]:
        """Write ``pruned`` (what :meth:`remove_heads` made of this model) to ``directory``, atomically, in a form
        :func:`attnviz.models.specs.load_model` reads back.

        ``source``: the spec this model was loaded from (recorded); ``transformers_copy``: also write a copy
        that plain transformers loads, where the format has one. Returns (the directory, that copy or None).
        """
        raise UnsupportedModelError(f"{self.name}: attnviz cannot save a pruned copy of this kind of model")

    def source_paths(self) -> list[Path]:
        """Files and directories this model was read from (outputs must never overwrite them)."""
        return []

    def running(self) -> contextlib.AbstractContextManager[None]:
        """The model switched onto attnviz's core for the duration of a call that runs it outside :meth:`forward`.

        Models attnviz loaded always are (this does nothing); a model the user wrapped
        (:func:`attnviz.models.wrapped.wrap`) is switched in and restored afterwards.
        """
        return contextlib.nullcontext()

    def context(self, observers: Sequence = (), head_mask=None) -> AttentionContext:
        """An :class:`AttentionContext` whose sites are named for this model."""
        return AttentionContext(observers=list(observers), head_mask=head_mask, site_of=self.site_of)


class _HeadCounter:
    """Observer that records how many heads each site has."""

    def __init__(self) -> None:
        self.heads: dict[AttentionSite, int] = {}
        self.keys: dict[AttentionSite, int] = {}  # the keys each site's pattern spans

    def observe(self, site: AttentionSite, pattern: Tensor, query_start: int) -> None:
        if site is not None:
            self.heads[site] = pattern.shape[1]
            self.keys[site] = max(self.keys.get(site, 0), pattern.shape[-1])


def parameter_count(model: nn.Module) -> int:
    """Number of parameters (tied weights counted once: ``parameters()`` yields a shared tensor once)."""
    return sum(parameter.numel() for parameter in model.parameters())
