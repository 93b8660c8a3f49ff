"""Which launch the GPU tile kernel gets (attnviz.core.triton_launch): the fastest of the candidates, timed once per
kind of call and kept on disk for later processes.

A clock that reads the launch's label stands for the GPU's timer (each launch "takes" a planted time), so which
launch wins is known. The kernel itself runs on CPU tensors through Triton's interpreter: the call's result must be
the chosen launch's, equal to attention from the definition.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported (tests/conftest.py sets it too)

import pytest
import torch

from attnviz.core.triton_launch import (
    CANDIDATE_LAUNCHES,
    DEFAULT_LAUNCH,
    LaunchConfig,
    LaunchTuner,
    call_kind,
    may_time,
    tuning_enabled,
)

FAST, MIDDLE, SLOW = LaunchConfig(32, 16), LaunchConfig(16, 32), LaunchConfig(16, 16)
#: planted milliseconds of each launch
PLANTED = {DEFAULT_LAUNCH.label: 5.0, SLOW.label: 3.0, FAST.label: 1.0, MIDDLE.label: 2.0}


class PlantedClock:
    """A launcher and a clock: ``launch`` records the launch it is given (or fails for those in ``failing``), and
    the clock runs a call and says it took the planted time of the launch that call ran."""

    def __init__(self, planted=PLANTED, failing: tuple[LaunchConfig, ...] = ()):
        self.planted = dict(planted)
        self.failing = {launch.label for launch in failing}
        self.ran: list[str] = []  # every launch run
        self.timed: list[str] = []  # the launch of every timed call

    def launch(self, config: LaunchConfig) -> None:
        if config.label in self.failing:
            raise RuntimeError(f"out of resources: {config.label}")
        self.ran.append(config.label)

    def __call__(self, call) -> float:
        before = len(self.ran)
        call()
        self.timed.append(self.ran[before])
        return self.planted[self.ran[before]]


def kind_of(queries=1000, keys=1000, dtype=torch.float32, statistics=True, shown="causal"):
    query = torch.zeros(1, 4, queries, 8, dtype=dtype)  # [b, h, q, d]
    key = torch.zeros(1, 2, keys, 8, dtype=dtype)  # [b, kvh, k, d]
    return call_kind(query, key, 16, statistics=statistics, keys_shown=shown)


def tuner_with(path, clock):
    return LaunchTuner(path, clock, (SLOW, FAST, MIDDLE))


def test_the_fastest_launch_is_chosen_and_kept_for_later_processes(tmp_path):
    path = tmp_path / "cache" / "gpu-launches.json"
    clock = PlantedClock()
    tuner = tuner_with(path, clock)
    assert tuner.launch_for(kind_of(), clock.launch) == FAST
    # the fallback first, then every other candidate once
    assert clock.timed == [DEFAULT_LAUNCH.label, SLOW.label, FAST.label, MIDDLE.label]
    record = next(iter(json.loads(path.read_text(encoding="utf-8")).values()))
    assert record["launch"]["block_m"] == 32 and record["launch"]["block_n"] == 16
    assert record["milliseconds"] == PLANTED
    # the same kind again: nothing timed, in this process or in another one reading the file
    assert tuner.launch_for(kind_of(), clock.launch) == FAST
    later_clock = PlantedClock()
    later = tuner_with(path, later_clock)
    assert later.known(kind_of()) == FAST
    assert later.launch_for(kind_of(), later_clock.launch) == FAST
    assert later_clock.timed == [] and len(clock.timed) == 4


def test_lengths_are_rounded_so_a_corpus_is_timed_a_few_times():
    assert kind_of(1000, 1000) == kind_of(1024, 1024)
    assert kind_of(1000, 1000) != kind_of(1025, 1025)
    assert kind_of() != kind_of(dtype=torch.bfloat16)
    assert kind_of() != kind_of(statistics=False)
    assert kind_of() != kind_of(shown="causal+padding")
    assert kind_of(1000).queries == 1024 and kind_of(1000).programs == 4


def test_each_kind_is_timed_on_its_own_and_the_file_keeps_both(tmp_path):
    path = tmp_path / "gpu-launches.json"
    clock = PlantedClock()
    assert tuner_with(path, clock).launch_for(kind_of(2048, 2048), clock.launch) == FAST
    # another process, with the first kind already on disk, where another launch is the fastest
    other_clock = PlantedClock({**PLANTED, MIDDLE.label: 0.5})
    other = tuner_with(path, other_clock)
    assert other.launch_for(kind_of(8192, 8192), other_clock.launch) == MIDDLE
    assert other.known(kind_of(2048, 2048)) == FAST
    records = json.loads(path.read_text(encoding="utf-8"))
    assert sorted(record["kind"]["queries"] for record in records.values()) == [2048, 8192]


def test_a_launch_that_fails_is_left_out_and_the_fallbacks_failure_is_raised(tmp_path):
    clock = PlantedClock(failing=(FAST,))
    tuner = tuner_with(tmp_path / "launches.json", clock)
    assert tuner.launch_for(kind_of(), clock.launch) == MIDDLE
    assert tuner.timings[kind_of()][FAST.label] is None
    broken = PlantedClock(failing=(DEFAULT_LAUNCH,))
    with pytest.raises(RuntimeError, match="out of resources"):
        tuner_with(tmp_path / "other.json", broken).launch_for(kind_of(), broken.launch)


def test_an_unreadable_file_is_timed_again_and_an_unwritable_cache_only_costs_timing(tmp_path):
    path = tmp_path / "gpu-launches.json"
    path.write_text("{not json", encoding="utf-8")
    clock = PlantedClock()
    assert tuner_with(path, clock).launch_for(kind_of(), clock.launch) == FAST
    assert len(clock.timed) == 4
    assert len(json.loads(path.read_text(encoding="utf-8"))) == 1  # rewritten whole
    blocked = tmp_path / "a-file"
    blocked.write_text("", encoding="utf-8")
    clock = PlantedClock()
    assert tuner_with(blocked / "gpu-launches.json", clock).launch_for(kind_of(), clock.launch) == FAST
    assert sorted(os.listdir(tmp_path)) == ["a-file", "gpu-launches.json"]  # no temporary left behind


def test_timing_is_for_cuda_devices_and_can_be_turned_off(monkeypatch):
    assert not may_time(torch.device("cpu"), 1 << 30)
    monkeypatch.setenv("ATTNVIZ_GPU_TUNING", "0")
    assert not tuning_enabled()
    monkeypatch.setenv("ATTNVIZ_GPU_TUNING", "1")
    assert tuning_enabled()
    assert CANDIDATE_LAUNCHES[0] == DEFAULT_LAUNCH and len(set(CANDIDATE_LAUNCHES)) == len(CANDIDATE_LAUNCHES)


class WatchedTuner(LaunchTuner):
    """Tells its clock which launch each timed call runs (the kernel's own launcher does not say)."""

    def launch_for(self, kind, launch, fallback=DEFAULT_LAUNCH):
        clock = self.clock
        assert isinstance(clock, PlantedClock)

        def watched(config):
            clock.launch(config)
            launch(config)

        return super().launch_for(kind, watched, fallback)


def test_the_kernel_runs_with_the_chosen_launch_and_gives_attention(tmp_path):
    """Through Triton's interpreter: the tuner times the real kernel's launches, the call's result is attention, and
    a second call of the same kind is not timed."""
    pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")
    from attnviz.core.triton_rows import attend_rows_triton, interpreting

    if not interpreting():
        pytest.skip("TRITON_INTERPRET=0: this test runs the kernel on CPU tensors")
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 2, 40, 16, generator=generator)  # [b, h, q, d]
    key, value = (torch.randn(1, 1, 40, 16, generator=generator) for _ in range(2))  # one key/value head
    output = torch.full((1, 40, 2, 16), float("nan"))  # [b, q, h, dv]
    clock = PlantedClock()
    tuner = WatchedTuner(tmp_path / "gpu-launches.json", clock, (SLOW, FAST, MIDDLE))
    attend_rows_triton(query, key, value, 0.25, output, causal=True, tuner=tuner)
    assert clock.timed == [DEFAULT_LAUNCH.label, SLOW.label, FAST.label, MIDDLE.label]
    assert list(tuner.chosen.values()) == [FAST]
    hidden = torch.ones(40, 40, dtype=torch.bool).triu(1)
    logits = query.double() @ key.double().transpose(-1, -2) * 0.25  # [b, h, q, k]
    expected = (torch.softmax(logits.masked_fill(hidden, -torch.inf), -1) @ value.double()).transpose(1, 2)
    assert (output.double() - expected).abs().max() < 1e-5
    # bit for bit the chosen launch's result (the default's and the others' tiles round differently)
    alone = {config: torch.empty_like(output) for config in (FAST, MIDDLE, DEFAULT_LAUNCH)}
    for config, result in alone.items():
        attend_rows_triton(query, key, value, 0.25, result, causal=True, launch=config)
    assert torch.equal(output, alone[FAST])
    assert not torch.equal(output, alone[MIDDLE]) and not torch.equal(output, alone[DEFAULT_LAUNCH])
    output.fill_(float("nan"))
    attend_rows_triton(query, key, value, 0.25, output, causal=True, tuner=tuner)
    assert len(clock.timed) == 4  # the same kind: not timed again
    assert torch.equal(output, alone[FAST])


class SteppingEvent:
    """Stands for ``torch.cuda.Event`` on a machine without a GPU: records a clock that the calls advance."""

    now = 0.0

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.at = None

    def record(self) -> None:
        self.at = SteppingEvent.now

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: SteppingEvent) -> float:
        return end.at - self.at


@pytest.mark.parametrize(("call_ms", "calls", "measured"), [(2.0, 4, 2.0), (10.0, 2, 10.0), (0.5, 6, 0.5)])
def test_the_gpu_clock_warms_up_then_repeats_short_calls(monkeypatch, call_ms, calls, measured):
    """One run to compile, one timed, and up to four more where that one took under 5 ms."""
    from attnviz.core.triton_launch import gpu_milliseconds

    monkeypatch.setattr(torch.cuda, "Event", SteppingEvent)
    made = []

    def call():
        made.append(1)
        SteppingEvent.now += call_ms

    assert gpu_milliseconds(call) == pytest.approx(measured)
    assert len(made) == calls


@pytest.mark.parametrize("candidate", CANDIDATE_LAUNCHES[1:], ids=lambda launch: launch.label)
@pytest.mark.parametrize("shown", ["causal+padding", "window+sinks"])
def test_every_candidate_computes_what_the_default_launch_computes(candidate, shown):
    """A GPU may choose any candidate: each must give the default's output, summary and carriers' sums. 150 queries
    make partial blocks of 128 and 64 rows; padding, a window, sinks and grouped heads exercise every run of tiles."""
    pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")
    from attnviz.core.kernel_calls import RowSummary
    from attnviz.core.triton_rows import attend_rows_triton, interpreting

    if not interpreting():
        pytest.skip("TRITON_INTERPRET=0: this test runs the kernel on CPU tensors")
    batch, heads, kv_heads, length, size = 2, 4, 2, 150, 32
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(batch, heads, length, size, generator=generator) * 2  # [b, h, q, d]
    key, value = (torch.randn(batch, kv_heads, length, size, generator=generator) * 2 for _ in range(2))
    key_weights = torch.rand(batch, heads, length, generator=generator)
    if shown == "causal+padding":
        where = {"causal": True, "key_start": torch.tensor([0, 37]), "key_stop": torch.tensor([150, 150])}
    else:  # keys less than 40 away on either side, and each head's sink
        where = {"window": 40, "sinks": torch.randn(heads, generator=generator)}
    results = []
    for launch in (DEFAULT_LAUNCH, candidate):
        output = torch.empty(batch, length, heads, size)  # [b, q, h, dv]
        summary = RowSummary(torch.empty(RowSummary.buffer_shape(batch, heads, length, 1, 2)), (0, 100))
        weighted, sink_share = torch.empty(batch, heads, length), torch.zeros(batch, heads, length)
        attend_rows_triton(
            query, key, value, size**-0.5, output, summary=summary, key_weights=key_weights, weighted=weighted,
            sink_share=sink_share, launch=launch, **where,
        )  # fmt: skip
        results.append((output, summary.values, weighted, sink_share))
    for default, other in zip(*results, strict=True):  # float32 sums in another order (distances reach ~150)
        torch.testing.assert_close(other, default, rtol=2e-6, atol=2e-6)


def test_the_shared_tuner_follows_the_cache_folder(monkeypatch, tmp_path):
    """One tuner per cache folder: setting ATTNVIZ_CACHE (or XDG_CACHE_HOME) moves where launches are kept."""
    from attnviz.core.triton_launch import shared_tuner

    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "één"))
    first = shared_tuner()
    assert first.path == tmp_path / "één" / "gpu-launches.json" and shared_tuner() is first
    monkeypatch.delenv("ATTNVIZ_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert shared_tuner().path == tmp_path / "xdg" / "attnviz" / "gpu-launches.json"
