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

Once the server begins to shut down (``close``), every request still waiting
is refused at once, and so is every new one (``ShuttingDown``, also a 504):
none of them ran, so a retry is safe, and none waits out the shutdown's grace
period only to be cancelled (``shutdown.py``).

Lives on the server's event loop; the counters are touched only between
``await`` points, so they need no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

__all__ = [
    "DISCONNECT_POLL",
    "SHUTTING_DOWN",
    "Admission",
    "ClientGone",
    "Overloaded",
    "ShuttingDown",
]

DISCONNECT_POLL = 0.25
"""Seconds between checks, while a request waits, that its client is still there."""


class Overloaded(Exception):
    """The server is full; the client should retry later (HTTP 504)."""


class ShuttingDown(Overloaded):
    """The server is shutting down; the request did not run (HTTP 504: retry, elsewhere
    or once the server is back)."""


SHUTTING_DOWN = (
    "the server is shutting down: the request did not run; retry (another server, or "
    "this one once it is back)"
)


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
        self.closing = False
        """Set by ``close``: the server is shutting down and admits nothing more."""
        self._closed: asyncio.Future[None] | None = None
        """Resolved by ``close``; what waiting requests watch besides their slot."""

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
        is over, ``ShuttingDown`` once ``close`` was called (before or during the
        wait), ``ClientGone`` when the client left first.
        """
        if self.closing:
            raise self._shutting_down()
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
        closed = self._closed_future(loop)
        acquire = asyncio.ensure_future(self._slots.acquire())
        try:
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                step = remaining if gone is None else DISCONNECT_POLL
                if remaining is not None and step is not None:
                    step = max(0.0, min(step, remaining))
                watched: set[asyncio.Future[Any]] = {acquire, closed}
                await asyncio.wait(watched, timeout=step, return_when=FIRST_COMPLETED)
                if closed.done():
                    raise self._shutting_down()
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

    def close(self) -> None:
        """Admit nothing more: every request waiting for a slot, and every later one,
        gets ``ShuttingDown`` at once. Requests holding a slot run on. Idempotent."""
        self.closing = True
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def reopen(self) -> None:
        """Admit requests again (an app served anew after a shutdown)."""
        self.closing = False
        self._closed = None

    def _closed_future(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """The future ``close`` resolves, made on the loop the requests wait on."""
        if self._closed is None or self._closed.get_loop() is not loop:
            self._closed = loop.create_future()
            if self.closing:
                self._closed.set_result(None)
        return self._closed

    def _shutting_down(self) -> ShuttingDown:
        self.refused += 1
        return ShuttingDown(SHUTTING_DOWN)

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
