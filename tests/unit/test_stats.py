"""SandboxStats: the seed's classification and metric formulas, and no lost counts."""

from __future__ import annotations

import threading

import pytest

from retool_exec import ExecResult, Outcome, SandboxStats

SUCCESS = ExecResult(True, "5\n", "", 0, False, 0.03)
RUNTIME_ERROR = ExecResult(False, "", "Traceback ...", 1, False, 0.03)
TIMEOUT = ExecResult(False, "", "", None, True, 30.0)

SEED_KEYS = [
    "sandbox/success_rate",
    "sandbox/error_rate",
    "sandbox/timeout_rate",
    "sandbox/latency",
]
EXTRA_KEYS = [
    "sandbox/oom_rate",
    "sandbox/sandbox_error_rate",
    "sandbox/latency_p50",
    "sandbox/latency_p95",
    "sandbox/queue_wait",
]


def test_empty_stats_have_zero_counters() -> None:
    stats = SandboxStats()
    assert (stats.calls, stats.successes, stats.errors, stats.timeouts) == (0, 0, 0, 0)
    assert stats.latency_total == 0.0


def test_empty_stats_metrics_are_zero() -> None:
    metrics = SandboxStats().metrics()
    for key in SEED_KEYS + EXTRA_KEYS:
        assert metrics[key] == 0.0


def test_metrics_start_with_the_four_seed_keys_in_order() -> None:
    assert list(SandboxStats().metrics())[:4] == SEED_KEYS


def test_metrics_has_the_extra_keys() -> None:
    metrics = SandboxStats().metrics()
    for key in EXTRA_KEYS:
        assert key in metrics
    assert all(key.startswith("sandbox/") for key in metrics)
    assert all(isinstance(value, float) for value in metrics.values())


def test_seed_classification() -> None:
    stats = SandboxStats()
    stats.record(SUCCESS)
    stats.record(RUNTIME_ERROR)
    stats.record(TIMEOUT)
    assert (stats.calls, stats.successes, stats.errors, stats.timeouts) == (3, 1, 1, 1)
    assert stats.latency_total == pytest.approx(30.06)


def test_timed_out_counts_as_timeout_even_with_returncode_zero() -> None:
    stats = SandboxStats()
    stats.record(ExecResult(False, "", "", 0, True, 1.0))
    assert (stats.successes, stats.errors, stats.timeouts) == (0, 0, 1)


def test_returncode_zero_counts_as_success_even_when_not_ok() -> None:
    # The seed classifies by returncode, not by ok.
    stats = SandboxStats()
    stats.record(ExecResult(False, "", "", 0, False, 1.0))
    assert (stats.successes, stats.errors, stats.timeouts) == (1, 0, 0)


def test_signal_oom_and_sandbox_error_count_as_errors() -> None:
    stats = SandboxStats()
    stats.record(ExecResult(False, "", "", -11, False, 1.0))
    stats.record(ExecResult(False, "", "", -9, False, 1.0, outcome=Outcome.OOM))
    stats.record(ExecResult(False, "", "", None, False, 1.0))
    assert (stats.successes, stats.errors, stats.timeouts) == (0, 3, 0)
    metrics = stats.metrics()
    assert metrics["sandbox/oom_rate"] == pytest.approx(1 / 3)
    assert metrics["sandbox/sandbox_error_rate"] == pytest.approx(1 / 3)


def test_seed_formulas() -> None:
    stats = SandboxStats()
    for _ in range(3):
        stats.record(SUCCESS)
    stats.record(RUNTIME_ERROR)
    stats.record(TIMEOUT)
    metrics = stats.metrics()
    assert metrics["sandbox/success_rate"] == 3 / 5
    assert metrics["sandbox/error_rate"] == 1 / 5
    assert metrics["sandbox/timeout_rate"] == 1 / 5
    assert metrics["sandbox/latency"] == stats.latency_total / 5
    assert metrics["sandbox/latency"] == pytest.approx((3 * 0.03 + 0.03 + 30.0) / 5)


def test_single_call_formulas() -> None:
    stats = SandboxStats()
    stats.record(RUNTIME_ERROR)
    metrics = stats.metrics()
    assert metrics["sandbox/success_rate"] == 0.0
    assert metrics["sandbox/error_rate"] == 1.0
    assert metrics["sandbox/latency"] == 0.03
    assert metrics["sandbox/latency_p50"] == 0.03
    assert metrics["sandbox/latency_p95"] == 0.03


def test_latency_quantiles() -> None:
    stats = SandboxStats()
    for i in range(1, 101):
        stats.record(ExecResult(True, "", "", 0, False, float(i)))
    metrics = stats.metrics()
    assert metrics["sandbox/latency_p50"] == pytest.approx(50.5)
    assert 94.0 <= metrics["sandbox/latency_p95"] <= 96.0


def test_queue_wait_is_a_mean() -> None:
    stats = SandboxStats()
    stats.record(ExecResult(True, "", "", 0, False, 1.0, queue_wait=0.5))
    stats.record(ExecResult(True, "", "", 0, False, 1.0, queue_wait=0.0))
    assert stats.metrics()["sandbox/queue_wait"] == pytest.approx(0.25)


def test_concurrent_records_lose_nothing() -> None:
    stats = SandboxStats()
    results = [SUCCESS, RUNTIME_ERROR, TIMEOUT]
    start = threading.Barrier(32)

    def worker(index: int) -> None:
        start.wait()
        for i in range(500):
            stats.record(results[(index + i) % 3])
            if i % 100 == 0:
                stats.metrics()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stats.calls == 16000
    assert stats.successes + stats.errors + stats.timeouts == stats.calls
    expected = [sum(1 for n in range(32) for i in range(500) if (n + i) % 3 == k) for k in range(3)]
    assert [stats.successes, stats.errors, stats.timeouts] == expected


def test_handlers_and_threads_reading_while_others_record_see_one_moment_and_lose_nothing() -> None:
    """A call's ``record`` no longer waits for the lock; a signal handler that read the
    stats while its thread was counting added the queue to totals the thread had half
    read (a success rate of 2001), or could count one result over another (the review of
    the thirty-third red-team round). Every read is of one moment, and every result is
    counted once."""
    import signal

    stats = SandboxStats()
    ok = ExecResult(True, "", "", 0, False, 0.5)
    bad: list[dict[str, float]] = []

    def read(*_: object) -> None:
        metrics = stats.metrics()
        if metrics["sandbox/success_rate"] > 1 or metrics["sandbox/latency"] > 0.5 + 1e-9:
            bad.append(metrics)

    def recorder() -> None:
        for _ in range(10_000):
            stats.record(ok)

    previous = signal.signal(signal.SIGALRM, read)
    signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)  # (slower than a read: no nesting)
    try:
        threads = [threading.Thread(target=recorder) for _ in range(3)]
        for thread in threads:
            thread.start()
        mine = 0
        while any(thread.is_alive() for thread in threads):
            read()
            stats.record(ok)
            mine += 1
        for thread in threads:
            thread.join()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not bad, bad[:3]
    assert stats.calls == stats.successes == 30_000 + mine
    assert stats.metrics()["sandbox/calls"] == stats.calls
    assert stats.errors == stats.timeouts == 0
