"""Statistics by query position against transformers' eager attention patterns, computed by hand."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers
from cli_helpers import run_cli

from attnviz.core import AttentionSite
from attnviz.core import attention as core_attention
from attnviz.stats import compute as stats_compute
from attnviz.stats import compute_statistics
from attnviz.stats.by_position import POSITION_METRICS, auto_bucket_size

LONG = (
    "The old lighthouse keeper climbed the narrow stairs every evening, lit the great lamp, and watched "
    "the ships pass slowly along the rocky coast until the first grey light of morning came over the sea."
)
SHORT = "A dog ran through the park and barked at every bird it saw."


def eager_by_position(directory, token_ids: list[list[int]], bucket_size: int, causal: bool) -> dict:
    """``{site: [M, h, B]}`` float64 from eager patterns of a LEFT-padded batch, by hand.

    Each text's queries and keys are its real tokens, renumbered from its first real token
    (position 0), so the left padding must not leak into any value.
    """
    config = transformers.AutoConfig.from_pretrained(directory)
    model = getattr(transformers, config.architectures[0]).from_pretrained(directory, attn_implementation="eager")
    model.eval()
    width = max(len(ids) for ids in token_ids)
    pads = [width - len(ids) for ids in token_ids]
    input_ids = torch.tensor([[0] * pad + ids for pad, ids in zip(pads, token_ids)])  # [b, n] left padding
    attention_mask = torch.tensor([[0] * pad + [1] * len(ids) for pad, ids in zip(pads, token_ids)])
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # each text's positions start at 0
    with torch.no_grad():
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            output_attentions=True,
            use_cache=False,
        )
    buckets = -(-width // bucket_size)
    result = {}
    for layer, attention in enumerate(out.attentions):  # each [b, h, n, n]
        sums = torch.zeros(len(POSITION_METRICS), attention.shape[1], buckets, dtype=torch.float64)
        counts = torch.zeros(buckets, dtype=torch.float64)
        for example, pad in enumerate(pads):
            pattern = attention[example, :, pad:, pad:].double()  # [h, L, L] real queries and keys only
            length = pattern.shape[-1]
            position = torch.arange(length, dtype=torch.float64)
            offset = position[:, None] - position[None, :]  # [L, L] i − j
            entropy = -(pattern * pattern.clamp(min=1e-300).log()).sum(-1)  # [h, L]
            values = torch.stack(
                [
                    pattern[..., 0],  # sink: the first real token
                    entropy,
                    (pattern * offset.abs()).sum(-1),
                    (pattern * (offset.abs() <= 15)).sum(-1),
                ]
            )  # [M, h, L]
            if causal:  # the causal stack never looks ahead
                assert float((pattern * (offset < 0)).sum()) < 1e-6
            index = torch.arange(length) // bucket_size
            sums.index_add_(2, index, values)
            counts.index_add_(0, index, torch.ones(length, dtype=torch.float64))
        result[AttentionSite("self", layer)] = sums / counts
    return result


@pytest.mark.parametrize("path", ["kernel", "torch"])
@pytest.mark.parametrize("family", ["llama", "bert"])
def test_by_position_equals_eager_on_a_left_padded_batch(family, path, tiny_model_dirs, monkeypatch):
    from attnviz.core.kernel import prepare_kernel
    from attnviz.models.hf import load_hf_model

    if path == "kernel" and not prepare_kernel():
        pytest.skip("the fused kernel is not available here")
    if path == "torch":
        monkeypatch.setattr(stats_compute, "prepare_kernel", lambda: False)
    # blocks of a few queries: buckets are filled across blocks and blocks across buckets
    monkeypatch.setattr(core_attention, "BLOCK_ELEMENTS", 8 * 64 * 5)
    loaded = load_hf_model(str(tiny_model_dirs[family]), name=family, device="cpu")
    batch = loaded.encode([LONG, SHORT])
    token_ids = [ids[:length] for ids, length in zip(batch.inputs["input_ids"].tolist(), batch.lengths)]
    assert batch.lengths[0] >= 40 and batch.lengths[1] < 20  # several buckets; the short text stops early
    bucket_size = 6

    stats = compute_statistics(loaded, [LONG, SHORT], by_position=True, bucket_size=bucket_size, progress=False)
    reference = eager_by_position(tiny_model_dirs[family], token_ids, bucket_size, causal=loaded.causal)

    positions = stats.by_position
    assert positions.bucket_size == bucket_size
    assert positions.bucket_starts == list(range(0, batch.lengths[0], bucket_size))
    assert set(positions.sites) == set(reference)
    for site, expected in reference.items():
        mine = positions.sites[site]  # [M, h, B]
        assert mine.shape == expected.shape
        difference = (mine - expected).abs().max().item()
        assert difference <= 1e-5, (site, difference)
        # queries per bucket: both texts fill the first buckets, only the long one the rest
        counts = positions.counts[site]
        assert counts[0] == 2 * bucket_size and counts[-1] == batch.lengths[0] - positions.bucket_starts[-1]
    # bucket 0 holds query 0, which sees only itself in a causal stack: sink mass 1 there is averaged in
    assert (positions.curves("sink_mass") <= 1.0 + 1e-6).all()
    # the whole-input means are untouched by the extra reduction
    plain = compute_statistics(loaded, [LONG, SHORT], progress=False)
    for site in plain.sites:
        assert torch.allclose(plain.sites[site].mean, stats.sites[site].mean, atol=1e-6, equal_nan=True)
    assert plain.by_position is None


def test_default_bucket_size_follows_the_length():
    assert [auto_bucket_size(n) for n in (10, 512, 1024, 2048, 4096, 8192, 8193)] == [16, 16, 32, 64, 128, 256, 512]


def test_cli_json_and_csv_carry_the_curves(tiny_model_dirs, tmp_path, capsys):
    directory = tiny_model_dirs["llama"]
    data = tmp_path / "long.txt"
    data.write_text(LONG + "\n" + SHORT + "\n")
    json_path, csv_path, plot = tmp_path / "s.json", tmp_path / "s.csv", tmp_path / "s.png"
    result = run_cli(
        capsys,
        "stats",
        directory,
        "--data",
        data,
        "--by-position",
        "--bucket-size",
        "8",
        "--json",
        json_path,
        "--csv",
        csv_path,
        "--plot",
        plot,
        "--no-table",
    )
    assert result.exit_code == 0, result.stderr
    record = json.loads(json_path.read_text())
    section = record["by_position"]
    assert section["bucket_size"] == 8 and section["recent_tokens"] == 16
    starts = section["bucket_starts"]
    assert starts[:3] == [0, 8, 16]
    assert len(section["heads"]) == 2 * 8  # 2 layers × 8 heads
    head = section["heads"][0]
    assert {"stack", "layer", "head", *POSITION_METRICS, "queries"} <= set(head)
    assert all(len(head[name]) == len(starts) for name in POSITION_METRICS)
    # the JSON equals the library's values
    loaded_stats = compute_statistics(
        __import__("attnviz.models.hf", fromlist=["load_hf_model"]).load_hf_model(str(directory), device="cpu"),
        [LONG, SHORT],
        by_position=True,
        bucket_size=8,
        progress=False,
    )
    expected = loaded_stats.by_position.sites[AttentionSite("self", 0)]
    for index, name in enumerate(POSITION_METRICS):
        assert head[name] == pytest.approx(expected[index, 0].tolist(), abs=1e-6)
    # the long-format CSV next to --csv: one row per head and bucket
    rows = (tmp_path / "s.by-position.csv").read_text().splitlines()
    assert rows[0].split(",") == [
        "model",
        "stack",
        "layer",
        "head",
        "bucket_start",
        "bucket_end",
        "queries",
        *POSITION_METRICS,
    ]
    assert len(rows) == 1 + 16 * len(starts)
    first = rows[1].split(",")
    assert float(first[7]) == pytest.approx(head["sink_mass"][0], abs=1e-6)
    assert plot.is_file() and (tmp_path / "s.by-position.png").is_file()
    assert "s.by-position.csv" in result.stdout and "s.by-position.png" in result.stdout


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--by-position", "--bucket-size", "0"], "--bucket-size"),
        (["--by-position", "--bucket-size", "-5"], "--bucket-size"),
        (["--by-position", "--bucket-size", "2.5"], "--bucket-size"),
        (["--by-position", "--bucket-size", "many"], "--bucket-size"),
        (["--bucket-size", "8"], "--by-position"),
        (["--by-position", "--csv", "-"], "--csv"),
    ],
)
def test_bad_bucket_sizes_are_one_error_line_and_write_nothing(tiny_model_dirs, tmp_path, capsys, extra, fragment):
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli(
        capsys,
        "stats",
        tiny_model_dirs["llama"],
        "--text",
        SHORT,
        "--json",
        out / "s.json",
        "--plot",
        out / "s.png",
        *extra,
    )
    assert result.exit_code != 0
    assert "Traceback" not in result.stdout + result.stderr
    errors = result.error_lines()
    assert len(errors) == 1, result.stderr
    assert fragment in errors[0], errors[0]
    assert list(out.iterdir()) == []


def test_a_huge_bucket_size_is_one_bucket_and_a_tiny_one_at_length_is_refused(tiny_model_dirs, tmp_path, capsys):
    from attnviz.common.errors import ParameterError
    from attnviz.models.hf import load_hf_model
    from attnviz.stats import by_position

    loaded = load_hf_model(str(tiny_model_dirs["llama"]), device="cpu")
    stats = compute_statistics(loaded, [LONG, SHORT], by_position=True, bucket_size=10**30, progress=False)
    assert stats.by_position.bucket_starts == [0]
    one = stats.by_position.sites[AttentionSite("self", 1)]  # [M, h, 1]: the whole-input means
    assert torch.allclose(one[1, :, 0], stats.sites[AttentionSite("self", 1)].mean[0], atol=1e-6)
    assert torch.allclose(one[0, :, 0], stats.sites[AttentionSite("self", 1)].mean[8], atol=1e-6)
    # buckets are bounded (memory): too many for the input is refused before the model runs
    original = by_position.MAX_BUCKETS
    try:
        by_position.MAX_BUCKETS = 4
        with pytest.raises(ParameterError, match="bucket_size"):
            compute_statistics(loaded, [LONG], by_position=True, bucket_size=2, progress=False)
    finally:
        by_position.MAX_BUCKETS = original
    assert not math.isnan(float(one[2, 0, 0]))


@pytest.mark.slow
def test_smollm2_first_bucket_sink_mass_at_1024_tokens_equals_eager():
    """A real model at length: the first bucket's sink mass against eager patterns (≤ 1e-4)."""
    from attnviz.models.specs import load_model

    loaded = load_model("smollm2", device="cpu")
    text = " ".join([LONG, SHORT] * 40)
    stats = compute_statistics(loaded, [text], by_position=True, max_length=1024, progress=False)
    batch = loaded.encode([text], max_length=1024)
    length = batch.lengths[0]
    assert length == 1024
    size = stats.by_position.bucket_size
    assert size == auto_bucket_size(1024) == 32
    path = loaded.model.config._name_or_path
    eager = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        out = eager.model(**batch.inputs, output_attentions=True, use_cache=False)
    position = torch.arange(length, dtype=torch.float64)
    offset = (position[:, None] - position[None, :]).abs()  # [n, n] |i − j|
    bucket = torch.arange(length) // size
    queries = torch.bincount(bucket).double()  # [B]
    for layer, attention in enumerate(out.attentions):  # each [1, h, n, n]
        pattern = attention[0].double()  # [h, n, n]
        expected = attention[0, :, :size, 0].double().mean(-1)  # [h] mean over the first bucket's queries
        mine = stats.by_position.sites[AttentionSite("self", layer)]  # [M, h, B]
        assert (mine[0, :, 0] - expected).abs().max().item() <= 1e-4, layer
        # every bucket and metric too (distance: float32 sums of weights × positions, so relative)
        values = torch.stack(
            [
                pattern[..., 0],
                -(pattern * pattern.clamp(min=1e-300).log()).sum(-1),
                (pattern * offset).sum(-1),
                (pattern * (offset <= 15)).sum(-1),
            ]
        )  # [M, h, n]
        reference = torch.zeros_like(mine).index_add_(2, bucket, values) / queries
        for index, tolerance in ((0, 1e-4), (1, 1e-4), (3, 1e-4)):
            assert (mine[index] - reference[index]).abs().max().item() <= tolerance, (layer, index)
        assert ((mine[2] - reference[2]).abs() / reference[2].clamp(min=1)).max().item() <= 1e-5, layer


def test_encoder_decoder_stacks_and_empty_buckets(tiny_model_dirs):
    """BART: every stack is measured; the decoder (one start token per text) leaves later buckets empty (NaN)."""
    from attnviz.models.hf import load_hf_model

    loaded = load_hf_model(str(tiny_model_dirs["bart"]), device="cpu")
    stats = compute_statistics(loaded, [LONG, SHORT], by_position=True, bucket_size=8, progress=False)
    positions = stats.by_position
    assert {site.stack for site in positions.sites} == {"encoder", "decoder", "cross"}
    decoder = positions.sites[AttentionSite("decoder", 0)]  # [M, h, B]
    assert positions.counts[AttentionSite("decoder", 0)][0] == 2
    assert decoder[:, :, 1:].isnan().all() and not decoder[:, :, 0].isnan().any()
    # a decoder start token sees only itself: all its weight is on the first token, within 15, at distance 0
    assert torch.allclose(decoder[0, :, 0], torch.ones(decoder.shape[1], dtype=torch.float64))
    assert torch.allclose(decoder[2, :, 0], torch.zeros(decoder.shape[1], dtype=torch.float64))
    encoder = positions.sites[AttentionSite("encoder", 1)]  # every bucket of the longer text has queries
    assert not encoder.isnan().any()
    assert (encoder[1] <= math.log(max(len(ids) for ids in loaded.encode([LONG]).tokens)) + 1e-6).all()  # ≤ ln n


class TwoProcesses:
    """A stand-in for a data-parallel run of two processes that saw the same data: sums double."""

    distributed = True

    def sum(self, tensors):
        return [2 * tensor.detach().double().cpu() for tensor in tensors]


def test_merge_across_processes_keeps_the_means_and_doubles_the_counts(tiny_model_dirs):
    from attnviz.models.hf import load_hf_model
    from attnviz.stats.accumulator import StatisticsAccumulator
    from attnviz.stats.by_position import PositionSums

    loaded = load_hf_model(str(tiny_model_dirs["llama"]), device="cpu")
    batch = loaded.encode([LONG, SHORT])
    accumulator = StatisticsAccumulator(causal=True, by_position=PositionSums(8, max(batch.lengths)))
    accumulator.begin_batch(batch)
    with torch.no_grad():
        loaded.forward(batch, loaded.context([accumulator]))
    alone = accumulator.by_position.result()
    accumulator.merge_across(TwoProcesses(), loaded.layout())
    merged = accumulator.by_position.result()
    for site in alone.sites:
        assert torch.allclose(alone.sites[site], merged.sites[site], equal_nan=True)
        assert torch.equal(2 * alone.counts[site], merged.counts[site])


def test_figure_draws_one_line_per_layer_and_the_mean(tiny_model_dirs):
    from attnviz.models.hf import load_hf_model
    from attnviz.render.position_plots import position_figure

    loaded = load_hf_model(str(tiny_model_dirs["llama"]), device="cpu")
    stats = compute_statistics(loaded, [LONG, SHORT], by_position=True, bucket_size=8, progress=False)
    figure = position_figure([stats])
    panels = [ax for ax in figure.axes if ax.get_title()]
    assert [ax.get_title().split(" (")[0] for ax in panels] == [
        "sink mass",
        "entropy",
        "mean attention distance",
        "recent share",
    ]
    positions = stats.by_position
    for ax, name in zip(panels, POSITION_METRICS):
        lines = ax.get_lines()
        assert len(lines) == 2 + 1  # two layers, then every head in black
        for layer, line in enumerate(lines[:2]):
            assert list(line.get_xdata()) == positions.bucket_starts
            assert line.get_ydata() == pytest.approx(positions.layer_means(name)[layer].tolist(), abs=1e-6)
    assert any(ax.get_label() == "<colorbar>" for ax in figure.axes)
