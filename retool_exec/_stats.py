"""Cumulative sandbox health metrics, safe to update from many threads.

The seed's ``SandboxStats`` counts from worker threads without a lock and can
lose counts; this one counts under a lock, and a call's ``record`` never waits
for it (``SandboxStats.record``). The four seed keys of ``metrics()`` keep their
names and formulas exactly.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque

from retool_exec._models import ExecResult, Outcome

__all__ = ["SandboxStats"]

_LATENCY_WINDOW = 10_000


class SandboxStats:
    """Counters over every recorded result; ``metrics()`` is what a trainer logs."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # (reentrant: see ``LoopThread._gate``)
        self.calls = 0
        self.successes = 0
        self.errors = 0
        self.timeouts = 0
        self.latency_total = 0.0
        self.ooms = 0
        self.sandbox_errors = 0
        self.queue_wait_total = 0.0
        self._recent: deque[float] = deque(maxlen=_LATENCY_WINDOW)
        self._pending: deque[ExecResult] = deque()

    def record(self, result: ExecResult) -> None:
        """Count one result, classified the seed's way (timeout, else exit 0, else error).

        Never waits for the lock: the result is queued (``deque.append`` is atomic) and
        counted now if the lock is free, else by whoever holds it, as it lets go. Why: a
        signal handler that closed the sandbox while its thread was in ``metrics()``
        waited for a call's end, whose ``record`` waited for that thread's lock: the
        process hung (the review of the thirty-third red-team round)."""
        self._pending.append(result)
        self._count_pending()

    def _count_pending(self) -> None:
        """Count what is queued, unless another holds the lock (it counts it as it lets go:
        each holder looks again after its release, so nothing queued stays uncounted)."""
        while self._pending and self._lock.acquire(blocking=False):
            try:
                self._count_queued()
            finally:
                self._lock.release()

    def _count_queued(self) -> None:
        """Under the lock: count every queued result (one at a time: a signal handler of
        this thread may count the rest meanwhile)."""
        while True:
            try:
                result = self._pending.popleft()
            except IndexError:
                return
            self.calls += 1
            self.latency_total += result.latency
            self.queue_wait_total += result.queue_wait
            self._recent.append(result.latency)
            if result.timed_out:
                self.timeouts += 1
            elif result.returncode == 0:
                self.successes += 1
            else:
                self.errors += 1
            if result.outcome is Outcome.OOM:
                self.ooms += 1
            elif result.outcome is Outcome.SANDBOX_ERROR:
                self.sandbox_errors += 1

    def metrics(self) -> dict[str, float]:
        """The seed's four rates first, then the added keys (all ``sandbox/...``)."""
        try:
            return self._metrics()
        finally:
            self._count_pending()

    def _metrics(self) -> dict[str, float]:
        with self._lock:
            self._count_queued()
            calls = max(self.calls, 1)
            recent = sorted(self._recent)
            return {
                "sandbox/success_rate": self.successes / calls,
                "sandbox/error_rate": self.errors / calls,
                "sandbox/timeout_rate": self.timeouts / calls,
                "sandbox/latency": self.latency_total / calls,
                "sandbox/oom_rate": self.ooms / calls,
                "sandbox/sandbox_error_rate": self.sandbox_errors / calls,
                "sandbox/latency_p50": _quantile(recent, 0.50),
                "sandbox/latency_p95": _quantile(recent, 0.95),
                "sandbox/queue_wait": self.queue_wait_total / calls,
                "sandbox/calls": float(self.calls),
            }


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    if len(sorted_values) == 1:
        return sorted_values[0]
    return statistics.quantiles(sorted_values, n=100, method="inclusive")[round(q * 100) - 1]
