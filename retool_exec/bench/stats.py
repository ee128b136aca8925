"""The arithmetic of the benchmark: percentiles, throughput and ratios (pure, no I/O).

Kept apart so it is unit-tested on its own: a wrong percentile would make
every table wrong and nobody would notice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Summary", "percentile", "ratio", "steady_throughput", "summarize", "throughput"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks.

    The same definition as numpy's default (``method="linear"``): for sorted
    values ``v`` the rank is ``(n - 1) * q / 100``. Empty input is NaN.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    fraction = rank - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def throughput(calls: int, seconds: float) -> float:
    """Calls per second; NaN when nothing was timed."""
    if seconds <= 0:
        return math.nan
    return calls / seconds


def ratio(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline``, or None when either is missing, NaN, or the baseline is 0."""
    if value is None or baseline is None:
        return None
    if math.isnan(value) or math.isnan(baseline) or baseline == 0:
        return None
    return value / baseline


def steady_throughput(finish_times: Sequence[float], skip: int) -> float:
    """Calls/s between the ``skip``-th and the last completion (a drained pool's rate).

    The first ``skip`` calls are served by containers that were already warm, so
    they finish in a burst that says nothing about the sustained rate.
    """
    ordered = sorted(finish_times)
    if len(ordered) - skip < 2:
        return math.nan
    start = ordered[skip - 1] if skip > 0 else ordered[0]
    counted = len(ordered) - skip if skip > 0 else len(ordered) - 1
    return throughput(counted, ordered[-1] - start)


@dataclass(frozen=True, slots=True)
class Summary:
    """Latency statistics of one set of calls, in seconds."""

    count: int
    p50: float
    p95: float
    p99: float
    mean: float
    min: float
    max: float


def summarize(latencies: Sequence[float]) -> Summary:
    """p50/p95/p99/mean/min/max of ``latencies`` (NaN for an empty list)."""
    if not latencies:
        nan = math.nan
        return Summary(0, nan, nan, nan, nan, nan, nan)
    return Summary(
        count=len(latencies),
        p50=percentile(latencies, 50),
        p95=percentile(latencies, 95),
        p99=percentile(latencies, 99),
        mean=math.fsum(latencies) / len(latencies),
        min=min(latencies),
        max=max(latencies),
    )
