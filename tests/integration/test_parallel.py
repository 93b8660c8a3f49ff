"""Data-parallel statistics and importance: torchrun with two CPU processes against one process.

Each test launches ``torchrun --standalone --nproc-per-node 2 -m attnviz ...`` as a
subprocess (gloo on CPU) and the same command in one process, and compares the JSON
field by field, counts exactly: by default (each process takes its share of the cores) every
statistic to 1e-6 relative; with ``ATTNVIZ_THREADS_PER_PROCESS=match`` (as many threads as one
process) to 1e-9.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from cli_helpers import CliResult, run_cli

from attnviz.common.parallel import SINGLE_PROCESS, DataParallel, launched_by_torchrun

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "sample_data" / "corpus.txt"
#: fields that measure the run, not the data
TIMING_FIELDS = {"seconds", "tokens_per_second", "latency_before_ms", "latency_after_ms", "output", "speedup"}


def _run(args: list[str], *, processes: int, cwd: Path, env: dict[str, str] | None = None) -> CliResult:
    result = run_cli(None, *args, subprocess=True, processes=processes, cwd=cwd, env=env)
    assert result.exit_code == 0, result.stderr[-3000:]
    return result


def _compare(one, many, path: str = "", rel: float = 1e-9) -> int:
    """Assert ``one == many`` field by field (floats to ``rel``); returns how many numbers were compared."""
    if isinstance(one, dict):
        assert one.keys() == many.keys(), path
        return sum(_compare(one[key], many[key], f"{path}.{key}", rel) for key in one if key not in TIMING_FIELDS)
    if isinstance(one, list):
        assert len(one) == len(many), path
        return sum(_compare(a, b, f"{path}[{i}]", rel) for i, (a, b) in enumerate(zip(one, many)))
    if isinstance(one, float) and isinstance(many, float):
        assert math.isclose(one, many, rel_tol=rel, abs_tol=1e-12), f"{path}: {one} vs {many}"
        return 1
    assert one == many, f"{path}: {one!r} vs {many!r}"
    return 1


def _corpus(tmp_path: Path, lines: int = 18) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(CORPUS.read_text().splitlines()[:lines]) + "\n")
    return path


# -- planning and sharding (no processes) ---------------------------------------------------------------


def test_shard_gives_every_item_to_exactly_one_process_balanced_by_cost():
    costs = [50, 3, 20, 20, 7, 1, 90, 4]
    shards = [DataParallel(rank, 3).shard(costs) for rank in range(3)]
    assert sorted(i for shard in shards for i in shard) == list(range(len(costs)))
    loads = [sum(costs[i] for i in shard) for shard in shards]
    assert loads == [90, 53, 52]  # greedy, most costly first: 90 | 50+3 | 20+20+7+4+1
    assert SINGLE_PROCESS.shard(costs) == list(range(len(costs)))
    assert DataParallel(5, 8).shard([1, 2]) == []  # more processes than items: some get none


def test_single_process_sum_is_the_local_value_in_float64():
    import torch

    (summed,) = SINGLE_PROCESS.sum([torch.tensor([1.5, 2.0], dtype=torch.float32)])
    assert summed.dtype == torch.float64 and summed.tolist() == [1.5, 2.0]
    assert SINGLE_PROCESS.sum_numbers([3, 4.5]) == [3.0, 4.5]
    assert not launched_by_torchrun() or os.environ.get("WORLD_SIZE") == "1"


class _SecondOfTwo(DataParallel):
    """Rank 1 of 2 without a process group: every collective returns this process's own values."""

    def sum(self, tensors):
        return SINGLE_PROCESS.sum(tensors)


def test_from_main_passes_the_main_process_numbers_and_checks_their_count():
    assert SINGLE_PROCESS.from_main([1.5, 2], 2) == [1.5, 2.0]
    assert _SecondOfTwo(1, 2).from_main(None, 3) == [0.0, 0.0, 0.0]  # adds zeros to the main's numbers
    with pytest.raises(ValueError, match="2 numbers"):
        _SecondOfTwo(0, 2).from_main([1.0], 2)


def test_only_the_main_process_times_and_checks_the_pruned_model(tiny_models, monkeypatch):
    """A second process scores its share but leaves latency and the masked-vs-pruned check to rank 0."""
    from attnviz.common.texts import default_corpus_path, read_examples
    from attnviz.prune import PruneConfig, pipeline

    def refuse(*args, **kwargs):
        raise AssertionError("a process other than rank 0 ran a forward pass for timing or checking")

    monkeypatch.setattr(pipeline, "measure_latency", refuse)
    monkeypatch.setattr(pipeline, "forward_output", refuse)
    config = PruneConfig(count=2, importance="entropy", batch_size=1, latency_repeats=1, latency_tokens=8)
    texts = read_examples(default_corpus_path())[:6]
    outcome = pipeline.prune_model(tiny_models["llama"], config, texts=texts, parallel=_SecondOfTwo(1, 2))
    assert (outcome.report.latency_before_ms, outcome.report.max_abs_diff) == (0.0, 0.0)  # rank 0's, summed in
    assert outcome.report.heads_after == outcome.report.heads_before - 2


@pytest.mark.parametrize(
    ("environment", "threads"),
    [
        ({}, 4),  # 8 cores, 2 processes on this node: 4 each
        ({"OMP_NUM_THREADS": "1"}, 4),  # torchrun's own default, read as unset
        ({"OMP_NUM_THREADS": "3"}, 3),  # the user's word
        ({"ATTNVIZ_THREADS_PER_PROCESS": "1"}, 1),
        ({"ATTNVIZ_THREADS_PER_PROCESS": "match"}, 8),  # as one process: bit-identical statistics
    ],
)
def test_each_process_takes_its_share_of_the_cores(monkeypatch, environment, threads):
    from attnviz.common import parallel

    monkeypatch.setattr(parallel, "physical_cores", lambda: 8)
    for name in ("OMP_NUM_THREADS", "ATTNVIZ_THREADS_PER_PROCESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert parallel.cpu_threads_per_process() == threads


def test_a_bad_thread_count_is_refused(monkeypatch):
    from attnviz.common import parallel
    from attnviz.common.errors import DistributedError

    monkeypatch.setenv("ATTNVIZ_THREADS_PER_PROCESS", "lots")
    with pytest.raises(DistributedError, match="positive integer, e.g. 1, or 'match'"):
        parallel.cpu_threads_per_process()


# -- torchrun against one process ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stats_runs(tiny_model_dirs, tmp_path_factory):
    """The same ``attnviz stats`` (a causal GQA model and a BERT encoder) with two processes and with one."""
    work = tmp_path_factory.mktemp("parallel-stats")
    corpus = _corpus(work)
    models = [str(tiny_model_dirs["llama"]), str(tiny_model_dirs["bert"])]
    outputs = {}
    for processes in (2, 1):
        out = work / f"stats-{processes}.json"
        args = ["stats", *models, "--data", str(corpus), "--batch-size", "3", "--no-table", "--json", str(out)]
        outputs[processes] = (_run(args, processes=processes, cwd=work), json.loads(out.read_text()))
    return outputs


def test_torchrun_stats_equal_one_process(stats_runs):
    (_, one), (_, two) = stats_runs[1], stats_runs[2]
    assert len(one) == len(two) == 2
    compared = _compare(one, two, rel=1e-6)  # each process on its share of the cores: float32 rounding
    heads = sum(len(record["heads"]) for record in one)
    assert heads == 2 * 8 + 2 * 4
    assert compared > heads * 20  # every statistic and its std of every head was compared
    for record in one:
        assert record["num_examples"] == 18
        assert record["tokens_per_second"] == pytest.approx(record["num_tokens"] / record["seconds"], rel=1e-2)


def test_torchrun_stats_only_rank_zero_prints_and_writes(stats_runs):
    result, _ = stats_runs[2]
    assert result.stdout.count("stats-2.json") == 1  # one process printed the written path
    assert result.stderr.count("(2 processes)") == 2  # one throughput line per model, from rank 0 only
    assert "Traceback" not in result.stderr


def test_torchrun_gradient_importance_equals_one_process(tiny_model_dirs, tmp_path):
    corpus = _corpus(tmp_path, lines=14)
    reports = {}
    for processes in (2, 1):
        out, report = tmp_path / f"pruned-{processes}", tmp_path / f"report-{processes}.json"
        args = [
            "prune",
            str(tiny_model_dirs["llama"]),
            "--count",
            "3",
            "--importance",
            "gradient",
            "--data",
            str(corpus),
            "--batch-size",
            "2",
            "--out",
            str(out),
            "--json",
            str(report),
            "--no-transformers-copy",
            "--latency-repeats",
            "1",
            "--latency-tokens",
            "8",
        ]
        # as many threads per process as one process uses: the numbers agree bit for bit
        _run(args, processes=processes, cwd=tmp_path, env={"ATTNVIZ_THREADS_PER_PROCESS": "match"})
        reports[processes] = json.loads(report.read_text())
    one, two = reports[1], reports[2]
    scores = [item["score"] for item in one["importance"]]
    assert len(scores) == 2 * 8 and all(score > 0 for score in scores)
    _compare(one, two)  # importance scores, heads removed, perplexity before and after
