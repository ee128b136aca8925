"""A bounded queue in front of the sandbox: wait a little, or be told in time to retry.

At most ``max_concurrency`` requests run; at most ``max_queue`` more wait for a
slot. A request beyond that is refused immediately, and so is one that waited
longer than its own budget (``wait``, see ``SandboxService.free_wait``,
never more than ``queue_timeout``): both become HTTP 504, the one status
verl's client retries (with a growing delay) instead of failing the sample.
Waiting without such a bound would instead run into the client's own read
timeout (compile + run + 10 s for verl), which it does not retry.

A request whose client disconnected while it waited leaves the queue without
running (``ClientGone``): the queue is polled for that every
``DISCONNECT_POLL`` seconds.

Lives on the server's event loop; the counters are touched only between
``await`` points, so they need no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

__all__ = ["DISCONNECT_POLL", "Admission", "ClientGone", "Overloaded"]

DISCONNECT_POLL = 0.25
"""Seconds between checks, while a request waits, that its client is still there."""


class Overloaded(Exception):
    """The server is full; the client should retry later (HTTP 504)."""


class ClientGone(Exception):
    """The client disconnected while its request waited; nothing ran, nobody to answer."""


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
        self.abandoned = 0
        """Requests dropped from the queue because their client disconnected."""

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot."""
        return self.admitted - self.running

    @contextlib.asynccontextmanager
    async def slot(
        self,
        *,
        wait: float | None = None,
        gone: Callable[[], Awaitable[bool]] | None = None,
    ) -> AsyncIterator[None]:
        """Hold a run slot for the body of the ``async with``.

        ``wait`` is the most seconds to wait for one (default, and never more
        than, ``queue_timeout``); ``gone`` tells whether the client has
        disconnected. Raises ``Overloaded`` when the queue is full or the wait
        is over, ``ClientGone`` when the client left first.
        """
        if self.admitted >= self.max_concurrency + self.max_queue:
            raise self.refuse(
                f"the server is at capacity ({self.max_concurrency} running, "
                f"{self.max_queue} queued); retry later"
            )
        self.admitted += 1
        try:
            await self._acquire(self._limit(wait), gone)
            self.running += 1
            try:
                yield
            finally:
                self.running -= 1
                self._slots.release()
        finally:
            self.admitted -= 1

    def _limit(self, wait: float | None) -> float | None:
        if wait is None:
            return self.queue_timeout
        wait = max(0.0, wait)
        return wait if self.queue_timeout is None else min(wait, self.queue_timeout)

    async def _acquire(
        self, limit: float | None, gone: Callable[[], Awaitable[bool]] | None
    ) -> None:
        if not self._slots.locked():  # a slot is free and nobody waits ahead: no await
            await self._slots.acquire()
            return
        if limit is not None and limit <= 0:
            raise self.refuse(
                "every run slot is busy and the request leaves no time to wait; retry later"
            )
        loop = asyncio.get_running_loop()
        deadline = None if limit is None else loop.time() + limit
        acquire = asyncio.ensure_future(self._slots.acquire())
        try:
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                step = remaining if gone is None else DISCONNECT_POLL
                if remaining is not None and step is not None:
                    step = max(0.0, min(step, remaining))
                await asyncio.wait({acquire}, timeout=step)
                if acquire.done():
                    acquire.result()
                    return
                if gone is not None and await gone():
                    self.abandoned += 1
                    raise ClientGone("the client disconnected while its request waited")
                if deadline is not None and loop.time() >= deadline:
                    raise self.refuse(
                        f"no run slot became free within {limit:g} s (the most this "
                        "request may wait); retry later"
                    )
        except BaseException:
            if acquire.done() and not acquire.cancelled() and acquire.exception() is None:
                self._slots.release()  # granted just as we gave up: pass it on
            else:
                acquire.cancel()
            raise

    def refuse(self, reason: str) -> Overloaded:
        """The 504 for a request the server could not serve in time, counted."""
        self.refused += 1
        return Overloaded(reason)

    def metrics(self) -> dict[str, float]:
        """Gauges and counters for ``/v1/metrics``."""
        return {
            "server/running": float(self.running),
            "server/waiting": float(self.waiting),
            "server/refused": float(self.refused),
            "server/abandoned": float(self.abandoned),
            "server/max_concurrency": float(self.max_concurrency),
            "server/max_queue": float(self.max_queue),
        }
