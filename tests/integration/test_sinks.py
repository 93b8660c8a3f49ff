"""Attention sinks (gpt-oss's learned ``sinks``, transformers' ``s_aux``) and value head sizes of their own
(multi-head latent attention) against transformers' eager attention, through the public loader.

Tiny seeded models (``sink_models``) with peaked weights: patterns equal eager's to 1e-5, logits to 1e-4, and every
statistic, the sink share included, equals a hand computation from eager's patterns, on torch's operations and on
the fused kernel's tile path.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from sink_models import LATENT_FAMILIES, SINK_FAMILIES, build_sink_model

import attnviz
from attnviz.captures.attention_capture import PatternRecorder
from attnviz.core import AttentionSite, blocks, kernel, kernel_calls
from attnviz.stats import STATISTIC_NAMES, compute_statistics, deferral

TEXTS = ["The cat sat on the mat because it was tired after the long day.", "A dog ran home."]
FAMILIES = SINK_FAMILIES + LATENT_FAMILIES
#: the name under which the tests register gpt-oss's eager attention (sink as one more softmax column), to read
#: granite-with-sliding-window's real weights: its own eager returns weights renormalised without the sink
SINK_REFERENCE = "gpt_oss_eager_reference"


@pytest.fixture(scope="module")
def sink_model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sink_models")
    return {family: build_sink_model(family, root / family) for family in FAMILIES}


def _register_sink_reference() -> str:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    AttentionInterface.register(SINK_REFERENCE, eager_attention_forward)
    AttentionMaskInterface.register(SINK_REFERENCE, eager_mask)
    return SINK_REFERENCE


def eager_reference(path, batch, family):
    """Eager's logits and its real weights per layer ``[b, h, q, k]`` (rows summing to 1 − the sink's weight)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        own = model(**batch.inputs, output_attentions=True, use_cache=False)
        if family != "granite_swa":
            return own.logits, own.attentions
        # granite's eager scales each head's output by 1 − p_sink and returns the weights without it: read the real
        # weights through gpt-oss's formulation (the sink as a softmax column), which gives the same logits
        model.set_attn_implementation(_register_sink_reference())
        sink_column = model(**batch.inputs, output_attentions=True, use_cache=False)
    assert (sink_column.logits - own.logits).abs().max() <= 1e-4
    for renormalised, real in zip(own.attentions, sink_column.attentions):
        for theirs, mine in zip(real_rows(renormalised, batch.lengths), real_rows(real, batch.lengths)):
            torch.testing.assert_close(mine / mine.sum(-1, keepdim=True), theirs, rtol=0, atol=1e-5)
    return own.logits, sink_column.attentions


def real_rows(pattern, lengths):
    """``[(h, n, n)]`` per example: the rows and keys of its real tokens."""
    return [pattern[example, :, :n, :n] for example, n in enumerate(lengths)]


@pytest.mark.parametrize("family", FAMILIES)
def test_patterns_and_logits_equal_eager(family, sink_model_dirs):
    loaded = attnviz.load_model(str(sink_model_dirs[family]))
    batch = loaded.encode(TEXTS)
    logits, attentions = eager_reference(sink_model_dirs[family], batch, family)
    recorder = PatternRecorder()
    with torch.no_grad():
        captured = loaded.forward(batch, loaded.context([recorder]), logits=True)
    assert (captured.logits - logits).abs().max() <= 1e-4
    sums = []
    for layer, expected in enumerate(attentions):
        pattern = recorder.patterns[AttentionSite("self", layer)]
        for mine, theirs in zip(real_rows(pattern, batch.lengths), real_rows(expected, batch.lengths)):
            assert (mine - theirs).abs().max() <= 1e-5
            sums.append(mine.sum(-1))
    sink_mass = 1 - torch.cat([row_sums.flatten() for row_sums in sums])
    if family in SINK_FAMILIES:  # the sinks take a real share of the weight: leaving them out would show
        assert sink_mass.max() > 0.5 and sink_mass.mean() > 0.05
    else:
        assert sink_mass.abs().max() <= 1e-6


def test_gradient_path_takes_the_sinks_too(sink_model_dirs):
    """With gradients (head importance, attribution) the core's differentiable path gives eager's patterns too."""
    loaded = attnviz.load_model(str(sink_model_dirs["gpt_oss"]))
    batch = loaded.encode(TEXTS)
    logits, attentions = eager_reference(sink_model_dirs["gpt_oss"], batch, "gpt_oss")
    recorder = PatternRecorder()
    for parameter in loaded.model.parameters():
        parameter.requires_grad_(True)
    with torch.enable_grad():
        captured = loaded.forward(batch, loaded.context([recorder]), logits=True)
    assert captured.logits.requires_grad and (captured.logits.detach() - logits).abs().max() <= 1e-4
    pattern = recorder.patterns[AttentionSite("self", 1)]
    for mine, theirs in zip(real_rows(pattern, batch.lengths), real_rows(attentions[1], batch.lengths)):
        assert (mine.detach() - theirs).abs().max() <= 1e-5


def hand_statistics(attentions, batch, sinks: bool) -> dict[str, torch.Tensor]:
    """``{statistic: [layer, head]}`` means over every real query, from eager's real weights, float64, one row at a
    time as the definitions say (with ``sinks``, the sink's weight ``s = 1 − Σ_j A_ij`` is one more outcome of the
    entropy)."""
    per_layer = []
    for pattern in attentions:
        values: dict[str, list[list[float]]] = {name: [[] for _ in range(pattern.shape[1])] for name in STATISTIC_NAMES}
        for example, n in enumerate(batch.lengths):
            special = batch.special[example]
            for head in range(pattern.shape[1]):
                for i in range(n):
                    row = pattern[example, head, i, : i + 1].double()
                    sink = float(1 - row.sum()) if sinks else 0.0
                    entropy = float(-torch.special.xlogy(row, row).sum()) - (sink * math.log(sink) if sink > 0 else 0)
                    distance = float((row * (i - torch.arange(i + 1))).sum())
                    got = {
                        "entropy": entropy,
                        "max_weight": float(row.max()),
                        "mean_distance": distance,
                        "diagonal": float(row[i]),
                        "local_ratio": float(row[max(0, i - 2) :].sum()),
                        "first_token": float(row[0]),
                        "special_tokens": float(sum(row[j] for j in range(i + 1) if special[j])),
                        "sink_share": sink,
                    }
                    if i >= 1:
                        outcomes = i + 1 + (1 if sinks else 0)  # the keys, and the sink where there is one
                        got |= {
                            "normalized_entropy": entropy / math.log(outcomes),
                            "normalized_distance": distance / i,
                            "previous_token": float(row[i - 1]),
                        }
                    for name, value in got.items():
                        values[name][head].append(value)
        per_layer.append({name: [sum(v) / len(v) for v in heads] for name, heads in values.items()})
    return {name: torch.tensor([layer[name] for layer in per_layer], dtype=torch.float64) for name in STATISTIC_NAMES}


@pytest.fixture(scope="module")
def loaded_kernel():
    if not kernel.prepare_kernel() or not kernel_calls.block_kernel_applies(
        torch.zeros(1, 1, 1, 1), torch.zeros(1), None
    ):
        pytest.skip("the fused kernel is not available here")
    return kernel


@pytest.mark.parametrize("family", FAMILIES)
def test_statistics_equal_a_hand_computation_on_torch_and_in_kernel_tiles(
    family, sink_model_dirs, loaded_kernel, monkeypatch
):
    loaded = attnviz.load_model(str(sink_model_dirs[family]))
    batch = loaded.encode(TEXTS)
    _, attentions = eager_reference(sink_model_dirs[family], batch, family)
    expected = hand_statistics(attentions, batch, sinks=family in SINK_FAMILIES)
    tiles = []
    original = blocks.attend_rows_
    monkeypatch.setattr(blocks, "attend_rows_", lambda *arguments: tiles.append(1) or original(*arguments))
    in_tiles = compute_statistics(loaded, TEXTS, progress=False)
    assert len(tiles) == 2  # both layers ran tile by tile in the fused kernel, no pattern written
    with kernel.kernel_suspended():
        on_torch = compute_statistics(loaded, TEXTS, progress=False)
    assert len(tiles) == 2
    monkeypatch.setattr(deferral, "DEFERRED_DEVICES", ("cuda", "cpu"))  # the layers kept, then reduced together
    kept = compute_statistics(loaded, TEXTS, progress=False)
    assert len(tiles) == 4
    for stats in (in_tiles, on_torch, kept):
        for name in STATISTIC_NAMES:
            torch.testing.assert_close(stats.matrix(name), expected[name], rtol=0, atol=1e-5, msg=name)
    if family in SINK_FAMILIES:
        assert in_tiles.matrix("sink_share").min() > 0.01
    else:
        assert (in_tiles.matrix("sink_share") == 0).all()


def test_the_sink_share_in_json_and_in_the_table_only_where_there_are_sinks(sink_model_dirs, capsys, tmp_path):
    """``stats --json`` holds every head's sink share; the terminal table has its column only for a sink model."""
    import json

    from cli_helpers import run_cli

    from attnviz.stats import detect_heads
    from attnviz.stats.tables import head_rows, head_table

    record = tmp_path / "stats.json"
    run_cli(capsys, "stats", str(sink_model_dirs["gpt_oss"]), "--text", TEXTS[0], "--json", str(record))
    heads = json.loads(record.read_text())["heads"]
    loaded = attnviz.load_model(str(sink_model_dirs["gpt_oss"]))
    stats = compute_statistics(loaded, TEXTS[:1], progress=False)
    shares = stats.matrix("sink_share")
    assert [head["sink_share"] for head in heads] == pytest.approx(shares.flatten().tolist(), abs=1e-6)
    for family, shown in (("gpt_oss", True), ("deepseek_v2", False)):
        loaded = attnviz.load_model(str(sink_model_dirs[family]))
        stats = compute_statistics(loaded, TEXTS[:1], progress=False)
        table = head_table(stats, head_rows(stats, detect_heads(stats)))
        headers = [str(column.header) for column in table.columns]
        assert ("sinkw" in headers) == shown
