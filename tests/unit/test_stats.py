"""Per-head statistics: every statistic against hand computations, padding, streaming vs full capture, detection."""

from __future__ import annotations

import math

import pytest
import torch

from attnviz.captures.attention_capture import capture_batch
from attnviz.core import AttentionContext, AttentionSite, attend
from attnviz.core import attention as core_attention
from attnviz.models.base import EncodedBatch
from attnviz.models.hf import load_hf_model
from attnviz.stats import (
    PRESETS,
    STATISTIC_NAMES,
    HeadStatistics,
    StatisticsAccumulator,
    Thresholds,
    compute_statistics,
    detect_heads,
)
from attnviz.stats.definitions import STATISTIC_INDEX

MIN = torch.finfo(torch.float32).min
SITE = AttentionSite("self", 0)


# -- an independent reference: one query row at a time, Python floats ----------------------------------------


def row_statistics(
    row: list[float],
    i: int,
    key_length: int,
    causal: bool,
    special: list[bool],
    window: int = 2,
    sink: float | None = None,
):
    """Every statistic of query ``i`` whose weights over the keys it may see are ``row``; None = skipped.

    ``sink``: the row's weight on its head's attention sink (None: the model has none; ``row`` then sums to 1).
    """
    visible = min(i + 1, key_length) if causal else key_length
    row = row[:visible]
    outcomes = row if sink is None else [*row, sink]  # the sink is one more outcome of the softmax
    entropy = -sum(a * math.log(a) for a in outcomes if a > 0)
    distance = sum(a * abs(i - j) for j, a in enumerate(row))
    reach = i if causal else max(i, key_length - 1 - i)
    at = lambda j: row[j] if 0 <= j < len(row) else 0.0
    return {
        "entropy": entropy,
        "normalized_entropy": entropy / math.log(len(outcomes)) if visible > 1 else None,
        "max_weight": max(row),
        "mean_distance": distance,
        "normalized_distance": distance / reach if reach > 0 else None,
        "diagonal": at(i),
        "previous_token": at(i - 1) if i >= 1 else None,
        "local_ratio": sum(a for j, a in enumerate(row) if abs(i - j) <= window),
        "first_token": row[0],
        "special_tokens": sum(a for j, a in enumerate(row) if special[j]),
        "sink_share": 0.0 if sink is None else sink,
    }


def reference_statistics(
    examples, causal: bool, window: int = 2, sinks: bool = False
) -> dict[str, tuple[list[float], list[float]]]:
    """``{statistic: (mean per head, std per head)}`` from full, unpadded ``[h, n, n]`` patterns.

    ``examples``: list of ``(pattern [h, q, k], special flags of the keys)``. ``sinks``: the patterns come from a
    model with attention sinks, each row's sink weight being 1 − the row's sum.
    """
    heads = examples[0][0].shape[0]
    values: dict[str, list[list[float]]] = {name: [[] for _ in range(heads)] for name in STATISTIC_NAMES}
    for pattern, special in examples:
        for head in range(heads):
            for i in range(pattern.shape[1]):
                row = [float(x) for x in pattern[head, i]]
                sink = 1.0 - float(pattern[head, i].double().sum()) if sinks else None
                for name, value in row_statistics(row, i, pattern.shape[2], causal, special, window, sink).items():
                    if value is not None:
                        values[name][head].append(value)
    out = {}
    for name, per_head in values.items():
        means = [sum(v) / len(v) if v else math.nan for v in per_head]
        stds = [
            math.sqrt(max(0.0, sum(x * x for x in v) / len(v) - m * m)) if v else math.nan
            for v, m in zip(per_head, means)
        ]
        out[name] = (means, stds)
    return out


def fake_batch(lengths: list[int], special: list[list[bool]] | None = None) -> EncodedBatch:
    special = special or [[False] * n for n in lengths]
    return EncodedBatch(
        inputs={},
        tokens=[[f"t{i}" for i in range(n)] for n in lengths],
        special=special,
        word_ids=[list(range(n)) for n in lengths],
    )


def accumulate(batch: EncodedBatch, pattern: torch.Tensor, causal: bool, block: int | None = None, window: int = 2):
    """Feed one ``[b, h, q, k]`` pattern to a fresh accumulator (in query blocks of ``block``)."""
    accumulator = StatisticsAccumulator(causal=causal, local_window=window)
    accumulator.begin_batch(batch)
    block = block or pattern.shape[2]
    for start in range(0, pattern.shape[2], block):
        accumulator.observe(SITE, pattern[:, :, start : start + block], start)
    return HeadStatistics.from_accumulator(accumulator, "hand")


def assert_matches_reference(stats: HeadStatistics, reference, site=SITE, atol=1e-6):
    numbers = stats.sites[site]
    for name, (means, stds) in reference.items():
        index = STATISTIC_INDEX[name]
        got_mean = numbers.mean[index].tolist()
        got_std = numbers.std[index].tolist()
        for head, (expected, got) in enumerate(zip(means, got_mean)):
            if math.isnan(expected):
                assert math.isnan(got), (name, head)
            else:
                assert got == pytest.approx(expected, abs=atol), (name, head, got, expected)
        for head, (expected, got) in enumerate(zip(stds, got_std)):
            if not math.isnan(expected):
                assert got == pytest.approx(expected, abs=max(atol, 1e-5)), (name, "std", head)


# -- hand-made patterns ---------------------------------------------------------------------------------------------


def causal_example():
    """Two examples (lengths 3 and 2, the second padded to 3), two heads, causal rows."""
    pattern = torch.zeros(2, 2, 3, 3)
    pattern[0, 0] = torch.tensor([[1.0, 0, 0], [0.25, 0.75, 0], [0.2, 0.3, 0.5]])
    pattern[0, 1] = torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [0.9, 0.05, 0.05]])
    pattern[1, 0] = torch.tensor([[1.0, 0, 0], [0.6, 0.4, 0], [0.3, 0.3, 0.4]])  # row 2 is a padding query
    pattern[1, 1] = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.1, 0.1, 0.8]])  # row 2 is a padding query
    return fake_batch([3, 2]), pattern


def test_causal_statistics_by_hand():
    batch, pattern = causal_example()
    stats = accumulate(batch, pattern, causal=True)
    m = lambda name: stats.matrix(name)[0].tolist()

    # Head 0 counts 5 queries: example 0 rows 0-2, example 1 rows 0-1 (row 2 is padding).
    h_a = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.5623
    h_b = -(0.2 * math.log(0.2) + 0.3 * math.log(0.3) + 0.5 * math.log(0.5))  # 1.0297
    h_c = -(0.6 * math.log(0.6) + 0.4 * math.log(0.4))  # 0.6730
    assert m("entropy")[0] == pytest.approx((0 + h_a + h_b + 0 + h_c) / 5, abs=1e-6)
    # Normalised by ln(i+1), not ln(3); single-key queries (i = 0) are skipped.
    assert m("normalized_entropy")[0] == pytest.approx(
        (h_a / math.log(2) + h_b / math.log(3) + h_c / math.log(2)) / 3, abs=1e-6
    )
    assert m("max_weight")[0] == pytest.approx((1 + 0.75 + 0.5 + 1 + 0.6) / 5, abs=1e-6)
    # distances: row1 0.25·1; row2 0.2·2 + 0.3·1; ex1 row1 0.6·1
    assert m("mean_distance")[0] == pytest.approx((0 + 0.25 + 0.7 + 0 + 0.6) / 5, abs=1e-6)
    # divided by the farthest reachable key (i): queries with i = 0 skipped
    assert m("normalized_distance")[0] == pytest.approx((0.25 / 1 + 0.7 / 2 + 0.6 / 1) / 3, abs=1e-6)
    assert m("diagonal")[0] == pytest.approx((1 + 0.75 + 0.5 + 1 + 0.4) / 5, abs=1e-6)
    assert m("previous_token")[0] == pytest.approx((0.25 + 0.3 + 0.6) / 3, abs=1e-6)  # i = 0 has none
    assert m("local_ratio")[0] == pytest.approx(1.0, abs=1e-6)  # every key is within ±2
    assert m("first_token")[0] == pytest.approx((1 + 0.25 + 0.2 + 1 + 0.6) / 5, abs=1e-6)
    assert m("special_tokens")[0] == 0.0
    # Head 1: first-token heavy.
    assert m("first_token")[1] == pytest.approx((1 + 1 + 0.9 + 1 + 0.5) / 5, abs=1e-6)
    # standard deviation of max weight of head 0, by hand
    values = [1, 0.75, 0.5, 1, 0.6]
    mean = sum(values) / 5
    assert stats.std_matrix("max_weight")[0, 0] == pytest.approx(
        math.sqrt(sum((v - mean) ** 2 for v in values) / 5), abs=1e-6
    )
    assert_matches_reference(
        stats, reference_statistics([(pattern[0], [False] * 3), (pattern[1, :, :2, :2], [False] * 2)], causal=True)
    )


def test_bidirectional_statistics_with_special_tokens_and_padding_by_hand():
    """[CLS] a b [SEP] and [CLS] c [SEP] + padding: special-token mass, distances normalised by max(i, n−1−i)."""
    torch.manual_seed(0)
    special = [[True, False, False, True], [True, False, True]]
    batch = fake_batch([4, 3], special)
    scores = torch.randn(2, 3, 4, 4)
    scores[1, :, :, 3] = -math.inf  # padding key of example 1
    pattern = torch.softmax(scores, dim=-1)
    pattern[1, :, 3] = torch.tensor([0.7, 0.1, 0.1, 0.1])  # a padding query row must not count
    stats = accumulate(batch, pattern, causal=False)

    row = pattern[1, 0, 1, :3].tolist()  # example 1, head 0, query 1 ('c')
    assert row_statistics(row, 1, 3, False, special[1])["special_tokens"] == pytest.approx(row[0] + row[2])
    assert row_statistics(row, 1, 3, False, special[1])["normalized_distance"] == pytest.approx((row[0] + row[2]) / 1)
    assert_matches_reference(
        stats, reference_statistics([(pattern[0], special[0]), (pattern[1, :, :3, :3], special[1])], causal=False)
    )
    # The first token ([CLS]) is a special token: special mass ≥ first-token mass.
    assert (stats.matrix("special_tokens") >= stats.matrix("first_token") - 1e-7).all()


@pytest.mark.parametrize("causal", [True, False])
def test_blocks_and_key_prefixes_give_the_same_statistics(causal):
    """Query blocks, and causal blocks cut to the keys they can see, change nothing."""
    torch.manual_seed(3)
    lengths = [7, 5, 2]
    batch = fake_batch(lengths, [[j in (0, n - 1) for j in range(n)] for n in lengths])
    scores = torch.randn(3, 4, 7, 7)
    for example, n in enumerate(lengths):
        scores[example, :, :, n:] = -math.inf
        if causal:
            scores[example] = scores[example].masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), -math.inf)
    pattern = torch.softmax(scores, dim=-1)
    whole = accumulate(batch, pattern, causal)
    blocked = accumulate(batch, pattern, causal, block=3)
    for name in STATISTIC_NAMES:
        torch.testing.assert_close(blocked.matrix(name), whole.matrix(name), atol=1e-6, rtol=0)
    if causal:  # what the core hands a prefix-accepting observer: block [s, e) with keys [0, e)
        accumulator = StatisticsAccumulator(causal=True)
        accumulator.begin_batch(batch)
        for start in range(0, 7, 3):
            stop = min(start + 3, 7)
            accumulator.observe(SITE, pattern[:, :, start:stop, :stop].contiguous(), start)
        prefix = HeadStatistics.from_accumulator(accumulator, "hand")
        for name in STATISTIC_NAMES:
            torch.testing.assert_close(prefix.matrix(name), whole.matrix(name), atol=1e-6, rtol=0)
    examples = [(pattern[e, :, :n, :n], [j in (0, n - 1) for j in range(n)]) for e, n in enumerate(lengths)]
    assert_matches_reference(whole, reference_statistics(examples, causal))


def test_local_window_option():
    batch = fake_batch([5])
    pattern = torch.full((1, 1, 5, 5), 0.2)  # uniform, bidirectional
    for window, expected in [(0, 0.2), (1, (2 + 3 + 3 + 3 + 2) * 0.2 / 5), (4, 1.0)]:
        stats = accumulate(batch, pattern, causal=False, window=window)
        assert stats.matrix("local_ratio")[0, 0] == pytest.approx(expected, abs=1e-6)
        assert stats.local_window == window


def test_matrix_is_nan_where_a_layer_has_fewer_heads():
    batch = fake_batch([3])
    accumulator = StatisticsAccumulator(causal=False)
    accumulator.begin_batch(batch)
    accumulator.observe(AttentionSite("self", 0), torch.full((1, 4, 3, 3), 1 / 3), 0)
    accumulator.observe(AttentionSite("self", 1), torch.full((1, 2, 3, 3), 1 / 3), 0)  # a pruned layer
    stats = HeadStatistics.from_accumulator(accumulator, "pruned")
    matrix = stats.matrix("entropy")
    assert matrix.shape == (2, 4) and matrix.dtype == torch.float64  # the precision the sums were kept in
    assert torch.isnan(matrix[1, 2:]).all()
    torch.testing.assert_close(matrix[0], torch.full((4,), math.log(3), dtype=torch.float64), rtol=0, atol=1e-6)


# -- through a model: padding invariance, streaming == full capture ----------------------------------------------

SENTENCES = [
    "The cat sat on the mat because it was tired.",
    "Short one.",
    "A much longer sentence, with commas and a question: does it work at all, really?",
    "Yes.",
]


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2"])
def test_padding_invariance(family, tiny_model_dirs):
    """A sentence's statistics do not depend on what it is padded with: batch of 4 == four batches of 1."""
    loaded = load_hf_model(str(tiny_model_dirs[family]), name=family)
    together = compute_statistics(loaded, SENTENCES, batch_size=4, progress=False)
    alone = compute_statistics(loaded, SENTENCES, batch_size=1, progress=False)
    assert together.num_tokens == alone.num_tokens == sum(loaded.encode(SENTENCES).lengths)
    for name in STATISTIC_NAMES:
        torch.testing.assert_close(together.matrix(name), alone.matrix(name), atol=2e-6, rtol=0)
        torch.testing.assert_close(together.std_matrix(name), alone.std_matrix(name), atol=2e-5, rtol=0)


@pytest.mark.parametrize("family", ["bert", "llama", "t5"])
def test_streaming_equals_statistics_from_full_capture(family, tiny_model_dirs, monkeypatch):
    """Streamed in small query blocks (causal blocks without their future) == computed from stored patterns."""
    loaded = load_hf_model(str(tiny_model_dirs[family]), name=family)
    monkeypatch.setattr(core_attention, "BLOCK_ELEMENTS", 64)  # a few queries per block
    streamed = compute_statistics(loaded, SENTENCES, batch_size=3, progress=False)
    captures = capture_batch(loaded, SENTENCES)  # encoder-decoder: the decoder gets its start token, as above
    assert set(streamed.sites) == {
        AttentionSite(stack, layer) for stack, layers in captures[0].patterns.items() for layer in range(len(layers))
    }
    for site in streamed.sites:
        causal = (loaded.causal and site.stack == "self") or site.stack == "decoder"
        examples = [
            (
                capture.patterns[site.stack][site.layer],
                capture.target_special if site.stack == "decoder" else capture.special,
            )
            for capture in captures
        ]
        assert_matches_reference(streamed, reference_statistics(examples, causal), site=site, atol=2e-6)
    assert streamed.num_examples == len(SENTENCES)


# -- detection: planted heads --------------------------------------------------------------------------------------


def planted_patterns(length: int, causal: bool, others: int = 3, seed: int = 0) -> torch.Tensor:
    """``[h, n, n]``: diagonal, uniform, collapsed on the first token, previous-token, then random heads."""
    visible = torch.ones(length, length, dtype=torch.bool)
    if causal:
        visible = visible.tril()
    eye = torch.eye(length)
    uniform = visible.float() / visible.float().sum(-1, keepdim=True)
    first = torch.zeros(length, length)
    first[:, 0] = 1.0
    previous = torch.zeros(length, length)
    previous[0, 0] = 1.0
    previous[torch.arange(1, length), torch.arange(length - 1)] = 1.0
    generator = torch.Generator().manual_seed(seed)
    random_scores = 2.5 * torch.randn(others, length, length, generator=generator)
    random = torch.softmax(random_scores.masked_fill(~visible, -math.inf), dim=-1)
    return torch.cat([torch.stack([eye, uniform, first, previous]), random])  # [h, n, n]


PLANTED = {0: {"diagonal"}, 1: {"unfocused"}, 2: {"collapsed", "first-token-sink"}, 3: {"previous-token"}}


@pytest.mark.parametrize("causal", [True, False])
def test_planted_heads_are_flagged_through_the_core(causal):
    """Planted heads run through attend() (as a custom pattern function) with the accumulator watching."""
    length, heads = 24, 7
    planted = planted_patterns(length, causal)  # [h, n, n]

    def pattern_fn(query, key, mask, start):
        return planted[None, :, start : start + query.shape[2]].expand(query.shape[0], -1, -1, -1).clone()

    batch = fake_batch([length, length])
    accumulator = StatisticsAccumulator(causal=causal)
    accumulator.begin_batch(batch)
    q = torch.randn(2, heads, length, 8)
    attend(q, q, q, pattern_fn=pattern_fn, site=SITE, context=AttentionContext(observers=[accumulator]))
    stats = HeadStatistics.from_accumulator(accumulator, "planted")
    detection = detect_heads(stats)
    flags = [set(f) for f in detection.flags[SITE]]
    # The diagonal and previous-token heads also put all weight on one key each: collapsed, by definition.
    assert flags[0] == {"diagonal", "collapsed"}
    assert flags[1] == {"unfocused"}
    assert flags[2] == {"collapsed", "first-token-sink"}
    assert flags[3] == {"previous-token", "collapsed"}
    for head in range(4, heads):
        assert flags[head] == set(), (head, flags[head], stats.matrix("normalized_entropy")[0, head])
    assert {site_head for site_head in detection.flagged("unfocused")} == {(SITE, 1)}


def test_seed_preset_depends_on_length_and_normalized_does_not():
    """The literal rule calls a 2-key uniform head collapsed; normalised thresholds call it unfocused at any length."""
    for length in (2, 64):
        batch = fake_batch([length])
        pattern = planted_patterns(length, causal=False, others=0)[None]  # [1, 4, n, n]
        stats = accumulate(batch, pattern, causal=False)
        uniform_normalized = detect_heads(stats, PRESETS["normalized"]).flags[SITE][1]
        uniform_absolute = detect_heads(stats, PRESETS["absolute"]).flags[SITE][1]
        assert "unfocused" in uniform_normalized if length == 64 else "unfocused" not in uniform_normalized
        if length == 2:
            # entropy ln 2 = 0.69 < 1.0 nats: the absolute rule says collapsed; max weight 0.5 is not < 0.3
            assert "collapsed" in uniform_absolute and "unfocused" not in uniform_absolute
            assert "collapsed" not in uniform_normalized
        else:
            assert "unfocused" in uniform_absolute and "collapsed" not in uniform_absolute
        assert "collapsed" in detect_heads(stats, PRESETS["absolute"]).flags[SITE][2]  # first-token: entropy 0


def test_thresholds_validate_ranges():
    from attnviz.common.errors import InputError

    with pytest.raises(InputError, match="threshold collapsed_max_weight"):
        Thresholds(collapsed_max_weight=1.5)
    with pytest.raises(InputError, match="threshold first_token_min"):
        Thresholds().override(first_token_min=-0.1)
    with pytest.raises(InputError, match="nats"):
        Thresholds(collapsed_entropy=-1.0)
    assert Thresholds().override(diagonal_min=0.7).diagonal_min == 0.7


# -- export ------------------------------------------------------------------------------------------------------


def test_json_and_csv_follow_the_contract(tmp_path):
    import csv
    import json

    from attnviz.stats import stats_record, write_csv, write_json

    batch, pattern = causal_example()
    stats = accumulate(batch, pattern, causal=True)
    detection = detect_heads(stats)
    record = stats_record(stats, detection, "normalized")
    path = write_json(tmp_path / "s.json", record)
    loaded = json.loads(path.read_text())
    for key, kind in [
        ("model", str),
        ("num_layers", int),
        ("num_heads", int),
        ("num_examples", int),
        ("num_tokens", int),
        ("thresholds", dict),
        ("heads", list),
    ]:
        assert isinstance(loaded[key], kind), key
    assert (loaded["num_layers"], loaded["num_heads"], loaded["num_examples"], loaded["num_tokens"]) == (1, 2, 2, 5)
    head = loaded["heads"][0]
    contract = [
        "layer",
        "head",
        "entropy",
        "entropy_std",
        "normalized_entropy",
        "max_weight",
        "mean_distance",
        "diagonal",
        "previous_token",
        "local_ratio",
        "first_token",
        "special_tokens",
        "flags",
    ]
    assert all(key in head for key in contract)
    assert head["max_weight"] == pytest.approx((1 + 0.75 + 0.5 + 1 + 0.6) / 5, abs=1e-6)
    assert loaded["thresholds"]["collapsed_max_weight"] == 0.9 and loaded["thresholds"]["preset"] == "normalized"
    assert loaded["heads"][1]["flags"] == list(detection.flags[SITE][1])

    rows = list(csv.DictReader((tmp_path / "s.csv").open() if write_csv(tmp_path / "s.csv", record) else []))
    assert len(rows) == 2
    assert float(rows[0]["max_weight"]) == pytest.approx(head["max_weight"])
    assert rows[1]["flags"] == ";".join(detection.flags[SITE][1])


class LogEntropyAccumulator(StatisticsAccumulator):
    """The same accumulator, refusing the scores: entropy from −Σ A log A."""

    accepts_scores = False


@pytest.mark.parametrize("masked_value", [MIN, -math.inf])
@pytest.mark.parametrize("sharpness", [1.0, 40.0])
def test_entropy_from_scores_equals_entropy_from_logarithms(masked_value, sharpness):
    # The core hands StatisticsAccumulator the softmax input; H = lse − Σ A s must equal −Σ A ln A,
    # with padding, a causal mask (MIN or −inf), and near one-hot rows (large scores).
    torch.manual_seed(3)
    lengths = [7, 4]
    q, k, v = torch.randn(2, 3, 7, 8) * sharpness, torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    mask = torch.zeros(2, 1, 7, 7).masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), masked_value)
    mask[1, :, :, 4:] = masked_value
    results = {}
    for cls in (StatisticsAccumulator, LogEntropyAccumulator):
        accumulator = cls(causal=True)
        accumulator.begin_batch(fake_batch(lengths))
        attend(q, k, v, mask=mask, site=SITE, context=AttentionContext(observers=[accumulator]))
        results[cls] = HeadStatistics.from_accumulator(accumulator, "hand")
    from_scores, from_logs = results.values()
    for name in STATISTIC_NAMES:
        assert not from_scores.matrix(name).isnan().any() or name == "normalized_entropy", name
        torch.testing.assert_close(from_scores.matrix(name), from_logs.matrix(name), atol=1e-5, rtol=0, equal_nan=True)
        torch.testing.assert_close(
            from_scores.std_matrix(name), from_logs.std_matrix(name), atol=2e-5, rtol=0, equal_nan=True
        )
    if sharpness > 1:  # the sharp case really is near one-hot
        assert float(from_logs.matrix("max_weight").mean()) > 0.8
