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
from typing import Any, NamedTuple

from retool_exec._models import ExecResult, Outcome

__all__ = ["SandboxStats"]

_LATENCY_WINDOW = 10_000


class _Totals(NamedTuple):
    """Every count at one moment: replaced whole, so a reader never mixes two moments
    (a signal handler of the reading thread may count meanwhile)."""

    calls: int = 0
    successes: int = 0
    errors: int = 0
    timeouts: int = 0
    latency_total: float = 0.0
    ooms: int = 0
    sandbox_errors: int = 0
    queue_wait_total: float = 0.0

    def counting(self, result: ExecResult) -> _Totals:
        """These totals with ``result`` counted, the seed's way (timeout, else exit 0,
        else error)."""
        timed_out = result.timed_out
        succeeded = not timed_out and result.returncode == 0
        return _Totals(
            calls=self.calls + 1,
            successes=self.successes + succeeded,
            errors=self.errors + (not timed_out and not succeeded),
            timeouts=self.timeouts + timed_out,
            latency_total=self.latency_total + result.latency,
            ooms=self.ooms + (result.outcome is Outcome.OOM),
            sandbox_errors=self.sandbox_errors + (result.outcome is Outcome.SANDBOX_ERROR),
            queue_wait_total=self.queue_wait_total + result.queue_wait,
        )


def _total(name: str) -> Any:
    def read(self: SandboxStats) -> Any:
        return getattr(self.totals(), name)

    read.__name__ = name
    return property(read, doc=f"The ``{name}`` so far (every recorded result counted).")


class SandboxStats:
    """Counters over every recorded result; ``metrics()`` is what a trainer logs."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # (reentrant: a signal handler of its holder)
        self._totals = _Totals()
        self._recent: deque[float] = deque(maxlen=_LATENCY_WINDOW)
        self._pending: deque[ExecResult] = deque()
        self._counting = False

    calls = _total("calls")
    successes = _total("successes")
    errors = _total("errors")
    timeouts = _total("timeouts")
    latency_total = _total("latency_total")
    ooms = _total("ooms")
    sandbox_errors = _total("sandbox_errors")
    queue_wait_total = _total("queue_wait_total")

    def record(self, result: ExecResult) -> None:
        """Count one result.

        Never waits for the lock: the result is queued (``deque.append`` is atomic) and
        what is queued is counted now if the lock is free; readers count the rest first.
        Why: a signal handler that closed the sandbox while its thread was in
        ``metrics()`` waited for a call's end, whose ``record`` waited for that thread's
        lock: the process hung (the review of the thirty-third red-team round)."""
        self._pending.append(result)
        if self._lock.acquire(blocking=False):
            try:
                self._count_queued()
            finally:
                self._lock.release()

    def totals(self) -> _Totals:
        """Every count, with every result recorded before this call in it."""
        with self._lock:
            self._count_queued()
            return self._totals

    def _count_queued(self) -> None:
        """Under the lock: count the results queued as it starts (no more: a thread that
        records does not go on counting what others keep queueing). A signal handler of
        the thread already counting does not count too (the two would each add to the
        same old totals, and a result would be lost): the outer count takes it."""
        if self._counting:
            return
        self._counting = True
        try:
            for _ in range(len(self._pending)):
                result = self._pending.popleft()
                self._recent.append(result.latency)
                self._totals = self._totals.counting(result)
        finally:
            self._counting = False

    def metrics(self) -> dict[str, float]:
        """The seed's four rates first, then the added keys (all ``sandbox/...``)."""
        with self._lock:
            self._count_queued()
            totals, recent = self._totals, sorted(self._recent)
        calls = max(totals.calls, 1)
        return {
            "sandbox/success_rate": totals.successes / calls,
            "sandbox/error_rate": totals.errors / calls,
            "sandbox/timeout_rate": totals.timeouts / calls,
            "sandbox/latency": totals.latency_total / calls,
            "sandbox/oom_rate": totals.ooms / calls,
            "sandbox/sandbox_error_rate": totals.sandbox_errors / calls,
            "sandbox/latency_p50": _quantile(recent, 0.50),
            "sandbox/latency_p95": _quantile(recent, 0.95),
            "sandbox/queue_wait": totals.queue_wait_total / calls,
            "sandbox/calls": float(totals.calls),
        }


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    if len(sorted_values) == 1:
        return sorted_values[0]
    return statistics.quantiles(sorted_values, n=100, method="inclusive")[round(q * 100) - 1]
