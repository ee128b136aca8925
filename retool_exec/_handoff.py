"""Items handed from any thread to waiters on any event loop, first come first served.

A call runs on the event loop of whoever awaits it (see ``Sandbox.arun_code``),
so the two things calls queue for, a slot of the sandbox's ``max_workers``
and a warm container, are awaited from many loops at once: a training step's
``asyncio.run()``, a server's loop, the sandbox's own loop for sync callers.
``asyncio.Queue`` and ``asyncio.Semaphore`` belong to one loop; ``Handoff``
belongs to none. An item put while a waiter waits goes to the oldest waiter,
on that waiter's own loop; a waiter that gives up (cancelled, timed out, its
loop closed) never swallows an item: what reached it is passed on.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Handoff", "Slots"]

T = TypeVar("T")


class Handoff(Generic[T]):
    """A FIFO of items and a FIFO of waiters, under one lock, usable from any thread."""

    def __init__(self) -> None:
        # Re-entrant: a coroutine collected as garbage while a put holds the lock (the
        # collector runs at any allocation) gives back its slot from the same thread.
        self._lock = threading.RLock()
        self._items: deque[T] = deque()
        self._waiters: deque[asyncio.Future[T]] = deque()
        self._closed: Callable[[], BaseException] | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> None:
        """Give ``item`` to the oldest waiter, or keep it for the next ``get``."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        with self._lock:
            while self._waiters:
                waiter = self._waiters.popleft()
                if waiter.done():  # cancelled while waiting: it left
                    continue
                loop = waiter.get_loop()
                if loop is running:
                    waiter.set_result(item)
                    return
                try:
                    loop.call_soon_threadsafe(self._deliver, waiter, item)
                except RuntimeError:  # that waiter's loop is closed: it will never take it
                    continue
                return
            self._items.append(item)

    def _deliver(self, waiter: asyncio.Future[T], item: T) -> None:
        """On the waiter's loop: give it ``item``, or pass the item on if it left meanwhile."""
        if waiter.done():
            self.put(item)
        else:
            waiter.set_result(item)

    def get_nowait(self) -> T | None:
        """The oldest item, or None when there is none."""
        with self._lock:
            return self._items.popleft() if self._items else None

    async def get(self, timeout: float | None = None) -> T:
        """The oldest item, waiting for one up to ``timeout`` seconds (TimeoutError)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._items:
                return self._items.popleft()
            if self._closed is not None:
                raise self._closed()
            waiter: asyncio.Future[T] = loop.create_future()
            self._waiters.append(waiter)
        try:
            if timeout is None:
                return await waiter
            async with asyncio.timeout(timeout):
                return await waiter
        except BaseException:
            self._leave(waiter)
            raise

    def _leave(self, waiter: asyncio.Future[T]) -> None:
        """A waiter gives up: an item that already reached it goes to the next one."""
        with self._lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                return  # it was still waiting: nothing reached it
        if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            self.put(waiter.result())
        # Otherwise it was cancelled with a delivery on its way: _deliver passes it on.

    def close(self, error: Callable[[], BaseException]) -> None:
        """No item will come any more: every waiter, now and later, gets ``error()``
        instead of waiting out its timeout (items kept so far can still be taken)."""
        with self._lock:
            self._closed = error
            waiters, self._waiters = list(self._waiters), deque()
        for waiter in waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                waiter.get_loop().call_soon_threadsafe(_fail, waiter, error)

    def take_where(self, condition: Callable[[T], bool]) -> list[T]:
        """Remove and return every item ``condition`` holds for (checked under the lock,
        so no ``get`` takes an item while it is looked at)."""
        with self._lock:
            taken = [item for item in self._items if condition(item)]
            for item in taken:
                self._items.remove(item)
            return taken

    def count_where(self, condition: Callable[[T], bool]) -> int:
        """How many items ``condition`` holds for (checked under the lock)."""
        with self._lock:
            return sum(1 for item in self._items if condition(item))


def _fail(waiter: asyncio.Future[T], error: Callable[[], BaseException]) -> None:
    if not waiter.done():
        waiter.set_exception(error())


class Slots:
    """A counting semaphore that callers on any event loop share (``async with slots:``)."""

    def __init__(self, count: int) -> None:
        self._tokens: Handoff[None] = Handoff()
        for _ in range(count):
            self._tokens.put(None)

    @property
    def free(self) -> int:
        return len(self._tokens)

    async def __aenter__(self) -> None:
        await self._tokens.get()

    async def __aexit__(self, *exc_info: object) -> None:
        self._tokens.put(None)
