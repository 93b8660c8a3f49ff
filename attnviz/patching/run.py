"""Activation patching, ablation and direct logit attribution of every head, on one prompt pair.

Two reference runs (clean and corrupt, one batch of two) record every head's output ``[q, h, d]``
through the core (:class:`~attnviz.core.patching.HeadOutputRecorder`), and the patterns when patterns
are patched. Then each head gets one patched run: the corrupt prompt (denoising; the clean one when
noising) with that head's output from the other run put in. The patched runs are batched, many heads
per batch: row ``i`` of a batch repeats the same prompt and patches head ``i`` only
(:class:`~attnviz.core.patching.HeadPatch`), so the recorded outputs are reused and no clean run is repeated.

Direct logit attribution needs no extra run: head ``h``'s term of the clean logit difference is
``(W_U[answer] − W_U[wrong]) · norm_frozen(W_O^h z_h)`` at the answer position, where ``norm_frozen`` is the
final normalisation with the clean run's own scale held fixed (:mod:`attnviz.models.readout`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from attnviz.common.errors import InputError, ParameterError
from attnviz.common.images import ImageSource
from attnviz.common.progress import progress_bar
from attnviz.common.tokens import display_token
from attnviz.common.wording import plural
from attnviz.core import AttentionContext, AttentionSite
from attnviz.core.patching import HeadOutputRecorder, HeadPatch, HeadReplacement, positions_tensor
from attnviz.core.recorder import PatternRecorder
from attnviz.core.stacks import STACKS
from attnviz.models.base import EncodedBatch, LoadedModel
from attnviz.models.identity import model_identity
from attnviz.patching.choices import ABLATIONS, DIRECTIONS, PATCHED, Ablation, Direction, Patched
from attnviz.patching.result import HeadEffect, PatchResult

#: patched runs per forward pass by default (each row repeats the prompt with one head patched)
DEFAULT_BATCH_SIZE = 32


def patch_heads(
    loaded: LoadedModel,
    *,
    clean: str,
    corrupt: str,
    answer: str,
    wrong: str,
    positions: Literal["all", "last"] | int = "all",
    direction: Direction = "denoising",
    patched: Patched = "output",
    ablate: Ablation | None = None,
    texts: Sequence[str] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_length: int | None = None,
    layers: Sequence[int] | None = None,
    image: ImageSource | None = None,
) -> PatchResult:
    """Which heads make ``answer`` (rather than ``wrong``) the model's next token after ``clean``.

    ``clean``/``corrupt``: two prompts of the same token count that differ where it matters;
    ``answer``/``wrong``: one token each; ``positions``: patch every position, the last one, or one position
    (0-based token index); ``direction``: ``"denoising"`` (corrupt run, clean head output) or ``"noising"``;
    ``patched``: ``"output"`` (the head's output vector) or ``"pattern"`` (its attention pattern);
    ``ablate``: also replace each head's output in the clean run by zero or by its mean over ``texts``
    (``max_length`` caps those); ``layers``: patch the heads of these layers only (default: every layer);
    ``image``: a picture in both prompts, for a vision-language model (its language model's heads are patched).
    Returns a :class:`PatchResult` (every head patched, in model order).
    """
    for name, value in (("clean", clean), ("corrupt", corrupt), ("answer", answer), ("wrong", wrong)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string, got {type(value).__name__} {value!r}")
    texts = _text_list(texts)
    _check_choices(positions, direction, patched, ablate, texts, batch_size)
    if layers is not None:
        layers = _layer_list(layers)
    loaded.check_patching()
    answer_id, answer_token = one_token(loaded, answer, "answer")
    wrong_id, wrong_token = one_token(loaded, wrong, "wrong")
    if answer_id == wrong_id:
        raise InputError(f"the answer and the wrong answer are the same token ({answer_token!r}): give two tokens")
    started = time.perf_counter()
    with loaded.running(), torch.no_grad():
        if image is None:
            pair = loaded.encode([clean, corrupt], max_length=max_length, truncate=False)
        else:  # the same picture in both prompts
            from attnviz.captures.vision_language import vision_language_batch

            pair = vision_language_batch(loaded, [clean, corrupt], [image, image])
        position = aligned_answer_position(loaded, pair)
        patched_positions = _positions(positions, pair.lengths[0], position)
        layout = loaded.layout()  # site -> heads in the weights, in model order
        if layers is not None:
            missing = sorted(set(layers) - {site.layer for site in layout})
            if missing:
                raise ParameterError("layers", f"{{layers}}: the model has no layer {missing[0]}", missing[0])
            layout = {site: count for site, count in layout.items() if site.layer in set(layers)}
        emptied = sorted({site.layer for site, count in layout.items() if count == 0})  # pruned of every head
        layout = {site: count for site, count in layout.items() if count > 0}
        if not layout:
            raise InputError(
                f"{plural(len(emptied), 'layer')} {', '.join(map(str, emptied))} {'has' if len(emptied) == 1 else 'have'} "
                "no heads left (every one was pruned away): there is no head to patch; choose other layers"
            )
        readout = loaded.readout()

        outputs = HeadOutputRecorder()
        patterns = PatternRecorder() if patched == "pattern" else None
        context = AttentionContext(
            observers=[patterns] if patterns is not None else [], site_of=loaded.site_of, head_editor=outputs
        )
        with readout.recording() if readout is not None else contextlib.nullcontext() as record:
            logits = loaded.forward(pair, context, logits=True).logits[:, position]  # [2, vocab]
        clean_diff, corrupt_diff = (logits[:, answer_id] - logits[:, wrong_id]).double().tolist()
        _check_finite([clean_diff, corrupt_diff], "the clean and corrupt runs")
        if abs(clean_diff - corrupt_diff) < 1e-6 * max(1.0, abs(clean_diff)):
            raise InputError(
                f"the clean and corrupt prompts give the same logit difference ({clean_diff:.4g}): there is nothing "
                "for a head to restore; choose a corrupt prompt that changes the answer"
            )

        attribution: dict[AttentionSite, list[float]] = {}
        if readout is not None and record is not None and record.residual is not None:
            residual = record.residual[0, position]  # [width]
            scale = readout.scale(residual)  # [1]
            toward = readout.direction(answer_id, wrong_id)  # [width]
            # an encoder-decoder's logits read the decoder's residual stream: its encoder heads write elsewhere
            read_side = [site for site in layout if not _source_side(site)] or list(layout)
            for site, (weight, _) in loaded.head_output_weights().items():
                if site not in read_side:
                    continue
                heads_here = outputs.outputs[site][0, position]  # [h, d]
                count, dim = heads_here.shape
                per_head = weight.double().view(weight.shape[0], count, dim)  # [width, h, d]
                contributions = torch.einsum("whd,hd->hw", per_head, heads_here.double())  # [h, width]
                attribution[site] = (readout.frozen(contributions, scale) @ toward).tolist()

        heads = [(site, head) for site, count in layout.items() for head in range(count)]
        base, source = (1, 0) if direction == "denoising" else (0, 1)
        sources = {site: outputs.outputs[site][source] for site in layout}  # [q, h, d]
        # an encoder-decoder's decoder and cross-attention heads have decoder queries: every one is patched
        where = {
            site: patched_positions if _source_side(site) else list(range(sources[site].shape[0])) for site in layout
        }
        everywhere = {site: list(range(sources[site].shape[0])) for site in layout}
        if patterns is not None:
            sources = {site: patterns.patterns[site][source].to(loaded.device) for site in layout}  # [h, q, k]
        runs = len(heads) * (2 if ablate else 1)
        with progress_bar() as bar:
            task = bar.add_task(f"patching · {loaded.name}", total=runs, status="")
            patched_diffs = _patched_runs(
                loaded, pair, base, heads, sources, patched, where, position, (answer_id, wrong_id),
                batch_size, lambda done: bar.update(task, advance=done),
            )  # fmt: skip
            ablated_diffs: list[float] | None = None
            source_text = ""
            if ablate is not None:
                replacements, source_text = _ablation_values(loaded, ablate, texts, layout, batch_size, max_length)
                ablated_diffs = _patched_runs(
                    loaded, pair, 0, heads, replacements, "output", everywhere, position,
                    (answer_id, wrong_id), batch_size, lambda done: bar.update(task, advance=done),
                )  # fmt: skip

    _check_finite(patched_diffs + (ablated_diffs or []), "the patched runs")
    reference = corrupt_diff if direction == "denoising" else clean_diff
    identity = model_identity(loaded)
    effects = []
    for index, (site, head) in enumerate(heads):
        number = identity.ids(site.stack, site.layer, layout[site])[head] if identity is not None else head
        effects.append(
            HeadEffect(
                layer=site.layer,
                head=number,
                patched_logit_diff=patched_diffs[index],
                normalized_effect=(patched_diffs[index] - reference) / (clean_diff - corrupt_diff),
                direct_logit_attribution=attribution[site][head] if site in attribution else None,
                ablation_effect=None if ablated_diffs is None else ablated_diffs[index] - clean_diff,
                stack=site.stack,
            )
        )
    return PatchResult(
        model=loaded.name,
        clean=clean,
        corrupt=corrupt,
        answer=answer,
        wrong=wrong,
        answer_token=answer_token,
        wrong_token=wrong_token,
        tokens=pair.tokens[0],
        decoder_tokens=pair.target_tokens[0] if pair.target_tokens is not None else None,
        position=position,
        clean_logit_diff=clean_diff,
        corrupt_logit_diff=corrupt_diff,
        direction=direction,
        patched=patched,
        positions=patched_positions,
        heads=effects,
        ablation=ablate,
        ablation_source=source_text,
        forwards=runs,
        seconds=time.perf_counter() - started,
    )


def _check_choices(positions, direction, patched, ablate, texts, batch_size) -> None:
    if direction not in DIRECTIONS:
        raise ParameterError("direction", f"{{direction}} must be one of {', '.join(DIRECTIONS)}", direction)
    if patched not in PATCHED:
        raise ParameterError("patched", f"{{patched}} must be one of {', '.join(PATCHED)}", patched)
    if ablate is not None and ablate not in ABLATIONS:
        raise ParameterError("ablate", f"{{ablate}} must be one of {', '.join(ABLATIONS)}", ablate)
    if ablate == "mean" and not texts:
        raise ParameterError("texts", "mean ablation needs a corpus to take each head's mean output over: give {texts}")
    if isinstance(positions, bool) or (not isinstance(positions, int) and positions not in ("all", "last")):
        raise ParameterError("positions", "{positions} must be all, last or a token position (0, 1, …)", positions)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise ParameterError("batch_size", f"{{batch_size}} must be a whole number, got {batch_size!r}", batch_size)
    if batch_size < 1:
        raise ParameterError("batch_size", f"{{batch_size}} must be at least 1, got {batch_size}", batch_size)


def _text_list(texts: Sequence[str] | None) -> list[str] | None:
    """``texts`` read once into a list (a generator is fine), each a string; a lone string is refused (its
    characters would be the corpus)."""
    if texts is None:
        return None
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, not one string: give [text]")
    listed = list(texts)
    for text in listed:
        if not isinstance(text, str):
            raise TypeError(f"texts must hold strings, got {type(text).__name__} {text!r}")
    return listed


def _layer_list(layers: Sequence[int]) -> list[int]:
    listed = list(layers)
    if not listed:
        raise ParameterError("layers", "{layers} is empty: give at least one layer, or None for every layer", listed)
    for layer in listed:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise ParameterError("layers", f"{{layers}} must hold layer numbers, got {layer!r}", layer)
    return listed


def _check_finite(values: Sequence[float], what: str) -> None:
    bad = sum(not math.isfinite(value) for value in values)
    if bad:
        raise InputError(
            f"{what} gave {plural(bad, 'logit difference')} that {'is' if bad == 1 else 'are'} not finite (NaN or "
            "infinite): the model's logits overflow or its weights are broken; run it in float32 (--dtype float32) "
            "or check the checkpoint"
        )


def aligned_answer_position(loaded: LoadedModel, pair: EncodedBatch, where: str = "") -> int:
    """The answer position of an encoded clean/corrupt ``pair`` (examples 0 and 1), refused unless both prompts
    have the same token count and the answer at the same position (``where`` prefixes the message)."""
    clean_count, corrupt_count = pair.lengths
    if clean_count != corrupt_count:
        raise InputError(
            f"{where}the clean prompt has {clean_count} tokens and the corrupt prompt {corrupt_count}: each "
            "position of one run is compared with (and patched into) the same position of the other, so give "
            "prompts of the same token count"
        )
    position = loaded.answer_position(pair, 0)
    if loaded.answer_position(pair, 1) != position:
        raise InputError(f"{where}the clean and corrupt prompts must have their answer at the same position")
    return position


def one_token(loaded: LoadedModel, text: str, parameter: str) -> tuple[int, str]:
    ids, tokens = loaded.vocabulary_tokens(text)
    if len(ids) != 1:
        split = " + ".join(f"'{display_token(token)}'" for token in tokens) or "nothing"
        raise ParameterError(
            parameter,
            f"{{{parameter}}} must be one token; {text!r} is {len(ids)} tokens: {split} (a leading space is often "
            "part of a word's token)",
            text,
        )
    return ids[0], tokens[0]


def _positions(positions: Literal["all", "last"] | int, count: int, answer_position: int) -> list[int]:
    if positions == "all":
        return list(range(count))
    if positions == "last":
        return [count - 1]
    if not 0 <= positions < count:
        raise ParameterError(
            "positions", f"{{positions}} {positions} is outside the prompt's {count} tokens (0 … {count - 1})"
        )
    return [int(positions)]


def _repeat(loaded: LoadedModel, batch: EncodedBatch, index: int, count: int) -> EncodedBatch:
    """Example ``index`` of ``batch`` repeated ``count`` times (the inputs of one batch of patched runs)."""
    return EncodedBatch(
        inputs=loaded.repeated_inputs(batch, index, count),
        tokens=[batch.tokens[index]] * count,
        special=[batch.special[index]] * count,
        word_ids=[batch.word_ids[index]] * count,
        truncated=[False] * count,
    )


def _patched_runs(
    loaded: LoadedModel,
    pair: EncodedBatch,
    base: int,
    heads: list[tuple[AttentionSite, int]],
    sources: dict[AttentionSite, Tensor],
    patched: Patched,
    positions: dict[AttentionSite, list[int]],
    position: int,
    tokens: tuple[int, int],
    batch_size: int,
    advance,
) -> list[float]:
    """Logit differences of one run per head: example ``base`` of ``pair`` with that head given ``sources``.

    ``sources[site]``: output patching ``[q, h, d]`` (or ``[1, h, d]``: one vector for every position);
    pattern patching ``[h, q, k]``; ``positions[site]``: the query positions patched there.
    """
    answer_id, wrong_id = tokens
    diffs: list[float] = []
    for start in range(0, len(heads), batch_size):
        chunk = heads[start : start + batch_size]
        patch = HeadPatch()
        for site in dict.fromkeys(site for site, _ in chunk):
            rows = [row for row, (at, _) in enumerate(chunk) if at == site]
            numbers = [chunk[row][1] for row in rows]
            index = torch.as_tensor(numbers, dtype=torch.long)
            values = sources[site]
            where = positions_tensor(positions[site])
            if patched == "pattern":
                change = values[index][:, where]  # [n, p, k]
                patch.replace_pattern(site, HeadReplacement(positions_tensor(rows), index, where, change))
            else:
                chosen = values[:, index] if values.shape[0] == 1 else values[where][:, index]  # [p|1, n, d]
                change = chosen.transpose(0, 1)  # [n, p|1, d]
                patch.replace_output(site, HeadReplacement(positions_tensor(rows), index, where, change))
        context = AttentionContext(site_of=loaded.site_of, head_editor=patch)
        logits = loaded.forward(_repeat(loaded, pair, base, len(chunk)), context, logits=True).logits[:, position]
        diffs.extend((logits[:, answer_id] - logits[:, wrong_id]).double().tolist())
        advance(len(chunk))
    return diffs


def _ablation_values(
    loaded: LoadedModel,
    ablate: Ablation,
    texts: Sequence[str] | None,
    layout: dict[AttentionSite, int],
    batch_size: int,
    max_length: int | None,
) -> tuple[dict[AttentionSite, Tensor], str]:
    """Per site ``[1, h, d]``: what each head's output is replaced by, and a line saying what that is."""
    if ablate == "zero" or not texts:
        zeros = {}
        for site, (weight, _) in loaded.head_output_weights().items():
            if site in layout:  # the layers patched (``layers``), not every layer
                zeros[site] = weight.new_zeros(1, layout[site], weight.shape[1] // layout[site])
        return zeros, "zero ablation (each head's output set to 0)"
    sums: dict[AttentionSite, Tensor] = {}
    counts: dict[AttentionSite, int] = {}
    for start in range(0, len(texts), batch_size):
        batch = loaded.encode(list(texts[start : start + batch_size]), max_length=max_length)
        recorder = HeadOutputRecorder()
        loaded.forward(batch, AttentionContext(site_of=loaded.site_of, head_editor=recorder))
        for site, output in recorder.outputs.items():  # [b, q, h, d]
            lengths = _query_lengths(batch, site).to(output.device)  # [b]
            real = torch.arange(output.shape[1], device=output.device)[None, :] < lengths[:, None]  # [b, q]
            total = (output.double() * real[:, :, None, None]).sum((0, 1))  # [h, d]
            sums[site] = sums[site] + total if site in sums else total
            counts[site] = counts.get(site, 0) + int(real.sum())
    means = {site: (total / counts[site])[None].to(loaded.device) for site, total in sums.items()}  # [1, h, d]
    count = max(counts.values(), default=0)
    return means, f"mean ablation (each head's mean output over {count} positions of {plural(len(texts), 'text')})"


def _source_side(site: AttentionSite) -> bool:
    """Whether the site's queries are the prompt's tokens (not an encoder-decoder's decoder positions)."""
    return STACKS[site.stack].query_side == "source"


def _query_lengths(batch: EncodedBatch, site: AttentionSite) -> Tensor:
    """``[b]`` real query positions of each example at ``site`` (the decoder's for decoder-side queries)."""
    if _source_side(site) or "decoder_attention_mask" not in batch.inputs:
        return torch.as_tensor(batch.lengths)
    return batch.inputs["decoder_attention_mask"].sum(dim=1).cpu()
