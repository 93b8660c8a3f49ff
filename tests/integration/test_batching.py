"""The one token-count batcher (attnviz.models.batching), throughput fields, --device-map and half-precision accumulation."""

from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.common.errors import InputError
from attnviz.models.batching import plan_batches, token_batches, token_lengths

TEXTS = [
    "A short one.",
    "The cat sat on the mat because it was tired after the long day in the sun.",
    "Dogs bark.",
    "Attention heads attend to tokens in surprisingly regular ways, as the statistics show.",
    "Hi.",
    "Paris is the capital of France.",
    "One more sentence of medium length for the batcher.",
]


def test_plan_sorts_longest_first_and_keeps_padded_tokens_within_the_budget():
    lengths = [5, 40, 3, 33, 2, 9, 12]
    plan = plan_batches(lengths, max_tokens=60, max_examples=None)
    assert [i for batch in plan for i in batch] == [1, 3, 6, 5, 0, 2, 4]  # longest first, each once
    for batch in plan:
        assert len(batch) * lengths[batch[0]] <= 60 or len(batch) == 1
        assert lengths[batch[0]] == max(lengths[i] for i in batch)
    assert plan == [[1], [3], [6, 5, 0, 2, 4]]  # 40 | 33 (2×40 > 60) | 5×12 = 60 fits
    assert plan_batches([12, 9, 5, 3, 2], max_tokens=60, max_examples=None) == [[0, 1, 2, 3, 4]]
    assert plan_batches([12, 9, 5, 3, 2], max_tokens=59, max_examples=None) == [[0, 1, 2, 3], [4]]


def test_plan_limits_examples_and_isolates_examples_longer_than_the_budget():
    assert plan_batches([3, 3, 3, 3, 3], max_tokens=None, max_examples=2) == [[0, 1], [2, 3], [4]]
    assert plan_batches([100, 2, 2], max_tokens=10, max_examples=8) == [[0], [1, 2]]
    with pytest.raises(InputError):
        plan_batches([1], max_tokens=0)
    with pytest.raises(InputError):
        plan_batches([1], max_examples=0)


def test_stats_and_prune_share_the_batcher(minilm):
    from attnviz.prune.judging import text_batches

    lengths = token_lengths(minilm, TEXTS)
    assert lengths == [len(minilm.encode([text]).tokens[0]) for text in TEXTS]  # exact token counts
    batches = list(token_batches(minilm, TEXTS, max_tokens=48, max_examples=None))
    pruning = text_batches(minilm, TEXTS, batch_size=None, max_tokens_per_batch=48)
    assert [b.tokens for b in batches] == [b.tokens for b in pruning]
    for batch in batches:
        padded = batch.inputs["input_ids"].shape
        assert padded[0] * padded[1] <= 48 or padded[0] == 1
    assert [length for batch in batches for length in batch.lengths] == sorted(lengths, reverse=True)


def test_statistics_do_not_depend_on_the_batching_and_report_throughput(minilm):
    from attnviz.stats import compute_statistics

    by_count = compute_statistics(minilm, TEXTS, batch_size=3, progress=False)
    by_tokens = compute_statistics(minilm, TEXTS, batch_size=None, max_tokens_per_batch=40, progress=False)
    for name in by_count.names:
        assert torch.allclose(by_count.matrix(name), by_tokens.matrix(name), atol=1e-5, equal_nan=True), name
    assert by_tokens.num_tokens == sum(token_lengths(minilm, TEXTS)) and by_tokens.num_examples == len(TEXTS)
    assert by_tokens.seconds > 0
    assert by_tokens.tokens_per_second == pytest.approx(by_tokens.num_tokens / by_tokens.seconds)


def test_half_precision_statistics_accumulate_in_float64(tiny_model_dirs):
    from attnviz.models.specs import load_model
    from attnviz.stats import StatisticsAccumulator
    from attnviz.stats.result import HeadStatistics

    exact = load_model(str(tiny_model_dirs["llama"]), device="cpu")
    half = load_model(str(tiny_model_dirs["llama"]), device="cpu", dtype="bfloat16")
    results = []
    for loaded in (exact, half):
        accumulator = StatisticsAccumulator(causal=True)
        batch = loaded.encode(TEXTS[:4])
        accumulator.begin_batch(batch)
        with torch.no_grad():
            loaded.forward(batch, loaded.context([accumulator]))
        assert all(totals.dtype == torch.float64 for totals in accumulator.totals.values())
        results.append(HeadStatistics.from_accumulator(accumulator, loaded.name))
    assert next(half.model.parameters()).dtype == torch.bfloat16
    for name in ("entropy", "max_weight", "first_token", "previous_token"):
        # bfloat16 keeps 8 bits of mantissa: the patterns differ by ~1e-2, the statistics likewise
        assert torch.allclose(results[0].matrix(name), results[1].matrix(name), atol=5e-2), name


def test_device_map_auto_on_a_cpu_machine_means_cpu(tiny_model_dirs, minilm):
    from attnviz.models.specs import load_model, resolve_device_map

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: device_map auto spreads over it (see the GPU test)")
    assert resolve_device_map("auto") is None and resolve_device_map(None) is None
    with pytest.raises(InputError, match="unknown device map"):
        resolve_device_map("balanced")
    mapped = load_model("minilm", device_map="auto")
    assert mapped.device.type == "cpu"
    batch = minilm.encode(TEXTS[:2])
    with torch.no_grad():
        expected = minilm.forward(batch).last_hidden_state
        got = mapped.forward(batch).last_hidden_state
    assert torch.equal(expected, got)


def test_cli_device_map_and_max_tokens_per_batch(tiny_model_dirs, tmp_path, capsys):
    out = tmp_path / "stats.json"
    args = ["stats", str(tiny_model_dirs["bert"]), "--text", "The cat sat.", "--text", "Dogs bark at night."]
    result = run_cli(capsys, *args, "--device-map", "auto", "--max-tokens-per-batch", "16", "--json", out)
    assert result.exit_code == 0, result.stderr
    record = json.loads(out.read_text())
    assert record["num_examples"] == 2 and record["tokens_per_second"] > 0 and record["seconds"] > 0
    assert "tokens/s" in result.stdout + result.stderr
    bad = run_cli(capsys, *args, "--device-map", "balanced")
    assert_clean_error(bad, "auto")
    bad = run_cli(capsys, *args, "--max-tokens-per-batch", "0")
    assert_clean_error(bad, "--max-tokens-per-batch")
    capture_path = tmp_path / "c.safetensors"
    result = run_cli(
        capsys, "capture", "The cat sat.", "-m", tiny_model_dirs["bert"], "--device-map", "auto", "-o", capture_path
    )
    assert result.exit_code == 0, result.stderr
    captured = AttentionCapture.load(capture_path)  # on CPU, auto places the whole model on the CPU
    assert captured.tokens == ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]
    assert captured.num_layers() == 2 and captured.layer(0).shape == (4, 6, 6)  # [head, query, key]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_map_auto_on_gpu_with_bfloat16_statistics(tiny_model_dirs):
    from attnviz.models.specs import load_model
    from attnviz.stats import compute_statistics

    reference = compute_statistics(load_model(str(tiny_model_dirs["llama"]), device="cpu"), TEXTS, progress=False)
    mapped = load_model(str(tiny_model_dirs["llama"]), device_map="auto", dtype="bfloat16")
    assert mapped.device.type == "cuda"
    stats = compute_statistics(mapped, TEXTS, progress=False)
    for name in ("entropy", "max_weight", "first_token"):
        assert torch.allclose(reference.matrix(name), stats.matrix(name), atol=5e-2), name
