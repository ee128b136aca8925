"""A bounded queue in front of the sandbox: wait a little, or be told at once to retry.

At most ``max_concurrency`` requests run; at most ``max_queue`` more wait for a
slot. A request beyond that is refused immediately, and so is one that waited
longer than ``queue_timeout``: both become HTTP 504, the one status verl's
client retries (with a growing delay) instead of failing the sample. Waiting
without bound would instead run into the client's own read timeout
(compile + run + 10 s for verl), which it does not retry.

Lives on the server's event loop; the counters are touched only between
``await`` points, so they need no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["Admission", "Overloaded"]


class Overloaded(Exception):
    """The server is full; the client should retry later (HTTP 504)."""


class Admission:
    """Counts requests in and out, and hands out run slots."""

    def __init__(
        self, *, max_concurrency: int, max_queue: int, queue_timeout: float | None
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be at least 0, got {max_queue}")
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self._slots = asyncio.Semaphore(max_concurrency)
        self.admitted = 0
        """Requests holding or waiting for a slot."""
        self.running = 0
        """Requests holding a slot."""
        self.refused = 0
        """Requests answered 504 so far."""

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot."""
        return self.admitted - self.running

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a run slot for the body of the ``async with``, or raise ``Overloaded``."""
        if self.admitted >= self.max_concurrency + self.max_queue:
            self.refused += 1
            raise Overloaded(
                f"the server is at capacity ({self.max_concurrency} running, "
                f"{self.max_queue} queued); retry later"
            )
        self.admitted += 1
        try:
            try:
                async with asyncio.timeout(self.queue_timeout):
                    await self._slots.acquire()
            except TimeoutError as exc:
                self.refused += 1
                raise Overloaded(
                    f"no run slot became free within {self.queue_timeout:g} s; retry later"
                ) from exc
            self.running += 1
            try:
                yield
            finally:
                self.running -= 1
                self._slots.release()
        finally:
            self.admitted -= 1

    def metrics(self) -> dict[str, float]:
        """Gauges and counters for ``/v1/metrics``."""
        return {
            "server/running": float(self.running),
            "server/waiting": float(self.waiting),
            "server/refused": float(self.refused),
            "server/max_concurrency": float(self.max_concurrency),
            "server/max_queue": float(self.max_queue),
        }
