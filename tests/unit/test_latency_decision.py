"""The latency decision rule of ``attnviz prune`` (``attnviz.prune.cost.compare_latencies``) on synthetic timings."""

from __future__ import annotations

import math
import random

import pytest

from attnviz.prune.cost import SMALLEST_DIFFERENCE, Timings, compare_latencies, sign_test


def test_sign_test_matches_the_binomial_tail_by_hand():
    # 9 of 10 one way: 2 · (C(10,9) + C(10,10)) / 2^10 = 22 / 1024
    assert sign_test(9, 10) == pytest.approx(22 / 1024)
    assert sign_test(1, 10) == pytest.approx(22 / 1024)  # two-sided: the other way is as extreme
    assert sign_test(5, 10) == 1.0
    assert sign_test(0, 0) == 1.0


def test_a_steady_speed_up_is_conclusive_and_measured_on_the_fastest_rounds():
    before = [100.0, 101.0, 100.5, 102.0, 100.2, 101.5, 100.1, 100.8, 101.2, 100.4]
    after = [value * 0.9 for value in before]
    comparison = compare_latencies(before, after)
    assert comparison.conclusive
    assert comparison.change == pytest.approx(-0.1)
    assert comparison.before.range == (100.0, 102.0) and comparison.after.range == pytest.approx((90.0, 91.8))
    assert comparison.sign_test_p == pytest.approx(2 / 1024)  # all 10 rounds agree


def test_noise_from_a_busy_machine_is_rarely_called_a_difference():
    """The same model timed twice under heavy, random interference (up to four times the work per pass)."""
    generator = random.Random(0)

    def loaded_passes() -> list[float]:
        return [50.0 * (1 + 3 * generator.random() ** 2) for _ in range(10)]

    comparisons = [compare_latencies(loaded_passes(), loaded_passes()) for _ in range(500)]
    false_alarms = sum(comparison.conclusive for comparison in comparisons)
    # the fastest-of-10 times alone differ by more than 2 % in most of these pairs
    assert sum(abs(comparison.change) >= SMALLEST_DIFFERENCE for comparison in comparisons) > 250
    assert false_alarms / 500 < 0.02


def test_a_spike_on_one_side_does_not_make_a_slowdown():
    """One pass of the pruned model caught a burst of load: the fastest rounds still say 'faster'."""
    before = [100.0 + index for index in range(10)]
    after = [90.0 + index for index in range(10)]
    after[3] = 900.0
    comparison = compare_latencies(before, after)
    assert comparison.change < 0
    assert comparison.conclusive  # 9 of 10 rounds agree, 10 % is above the noise


def test_a_difference_smaller_than_the_smallest_is_never_named():
    before = [100.0] * 10
    after = [99.0] * 10  # 1 % faster in every round: real, but too small to call
    comparison = compare_latencies(before, after)
    assert not comparison.conclusive and comparison.change == pytest.approx(-0.01)


def test_rounds_that_disagree_are_inconclusive_even_when_the_fastest_differ():
    before = [100.0, 140.0, 100.0, 140.0, 100.0, 140.0, 100.0, 140.0, 100.0, 140.0]
    after = [140.0, 80.0, 140.0, 100.0, 140.0, 100.0, 140.0, 100.0, 140.0, 100.0]
    comparison = compare_latencies(before, after)
    assert comparison.change == pytest.approx(-0.2)
    assert not comparison.conclusive  # half the rounds say slower


def test_noise_is_the_median_above_the_fastest():
    assert Timings((10.0, 11.0, 15.0)).noise == pytest.approx(0.1)
    assert math.isinf(Timings((0.0, 1.0, 2.0)).noise)
    with pytest.raises(ValueError):
        compare_latencies([1.0], [1.0, 2.0])
