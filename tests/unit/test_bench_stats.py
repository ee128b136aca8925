"""The benchmark's arithmetic: percentiles, throughput, ratios, and how calls are planned."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retool_exec.bench.backends import parse_backends
from retool_exec.bench.runner import cell_calls
from retool_exec.bench.stats import (
    percentile,
    ratio,
    steady_throughput,
    summarize,
    throughput,
)
from retool_exec.bench.workloads import WORKLOADS, select_workloads

_BY_NAME = {w.name: w for w in WORKLOADS}


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0, 1.0), (25, 1.75), (50, 2.5), (75, 3.25), (100, 4.0), (95, 3.85), (99, 3.97)],
)
def test_percentile_interpolates_linearly_like_numpy(q: float, expected: float) -> None:
    # numpy.percentile([1, 2, 3, 4], q) with its default method="linear".
    assert percentile([4.0, 1.0, 3.0, 2.0], q) == pytest.approx(expected)


def test_percentile_of_one_value_is_that_value() -> None:
    assert percentile([0.25], 50) == 0.25
    assert percentile([0.25], 99) == 0.25


def test_percentile_of_nothing_is_nan() -> None:
    assert math.isnan(percentile([], 50))


def test_percentile_of_odd_count_median_is_middle_value() -> None:
    assert percentile([5.0, 1.0, 9.0], 50) == 5.0


@pytest.mark.parametrize("q", [-1, 100.5])
def test_percentile_rejects_out_of_range(q: float) -> None:
    with pytest.raises(ValueError, match="percentile"):
        percentile([1.0], q)


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=50))
def test_percentiles_are_ordered_and_bounded(values: list[float]) -> None:
    p50, p95, p99 = (percentile(values, q) for q in (50, 95, 99))
    assert min(values) <= p50 <= p95 <= p99 <= max(values)


def test_percentile_does_not_reorder_its_input() -> None:
    values = [3.0, 1.0, 2.0]
    percentile(values, 50)
    assert values == [3.0, 1.0, 2.0]


def test_summarize_reports_every_statistic() -> None:
    summary = summarize([0.1, 0.2, 0.3, 0.4])
    assert summary.count == 4
    assert summary.p50 == pytest.approx(0.25)
    assert summary.mean == pytest.approx(0.25)
    assert (summary.min, summary.max) == (0.1, 0.4)


def test_summarize_of_nothing_is_nan_not_an_error() -> None:
    summary = summarize([])
    assert summary.count == 0
    assert math.isnan(summary.p50)
    assert math.isnan(summary.mean)


def test_throughput_is_calls_per_second() -> None:
    assert throughput(16, 2.0) == 8.0
    assert math.isnan(throughput(5, 0.0))


def test_ratio_divides_by_the_baseline() -> None:
    assert ratio(0.01, 0.04) == pytest.approx(0.25)
    assert ratio(80.0, 40.0) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("value", "baseline"), [(None, 1.0), (1.0, None), (1.0, 0.0), (math.nan, 1.0), (1.0, math.nan)]
)
def test_ratio_is_none_when_it_means_nothing(value: float | None, baseline: float | None) -> None:
    assert ratio(value, baseline) is None


def test_steady_throughput_skips_the_prewarmed_burst() -> None:
    # Four warm containers answer at once, then one call every 0.5 s.
    finish = [0.01, 0.01, 0.02, 0.02, 0.52, 1.02, 1.52, 2.02]
    assert steady_throughput(finish, skip=4) == pytest.approx(4 / 2.0)
    # Without the skip the burst inflates the figure.
    assert steady_throughput(finish, skip=0) > 3.0


def test_steady_throughput_does_not_depend_on_order() -> None:
    finish = [0.0, 1.0, 2.0, 3.0]
    shuffled = finish[:]
    random.Random(1).shuffle(shuffled)
    assert steady_throughput(shuffled, skip=1) == steady_throughput(finish, skip=1)


def test_steady_throughput_needs_two_points_after_the_skip() -> None:
    assert math.isnan(steady_throughput([0.1, 0.2], skip=2))


def test_cell_calls_are_whole_batches_of_at_least_calls() -> None:
    fast = _BY_NAME["print"]
    assert cell_calls(fast, 1, calls=40, slow_rounds=2) == 40
    assert cell_calls(fast, 16, calls=40, slow_rounds=2) == 48
    assert cell_calls(fast, 64, calls=40, slow_rounds=2) == 64


def test_slow_workloads_get_a_fixed_number_of_batches() -> None:
    slow = _BY_NAME["sleep"]
    assert slow.slow
    assert cell_calls(slow, 1, calls=40, slow_rounds=2) == 2
    assert cell_calls(slow, 16, calls=40, slow_rounds=2) == 32


def test_parse_backends_accepts_the_headline_invocation() -> None:
    assert parse_backends("local,docker") == ("local", "docker")
    assert parse_backends(" local , docker-fresh ") == ("local", "docker-fresh")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("local,dokcer", "unknown backend"),
        ("local,local", "twice"),
        ("docker,docker-reuse", "same backend"),
        ("", "at least one"),
    ],
)
def test_parse_backends_rejects_mistakes(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_backends(text)


def test_select_workloads_keeps_table_order_and_rejects_unknown() -> None:
    assert [w.name for w in select_workloads(["sympy", "print"])] == ["print", "sympy"]
    with pytest.raises(ValueError, match="unknown workload"):
        select_workloads(["pirnt"])
