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
from collections.abc import AsyncIterator, Callable
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
    """A counting semaphore that callers on any event loop share (``async with slots.hold():``).

    Why leases: a call runs on its caller's loop, and a loop closed while a call
    waited in it never resumes that call, so the slot it held never came back and
    every later call waited forever (twenty-third outside check). A slot held from a
    loop that is now closed is taken back whenever a caller has to wait (and every
    ``RECLAIM_POLL`` seconds while it waits); the abandoned call, should its coroutine
    ever be finalized, gives back nothing. Slots are counted, not stored: a count of
    ``2**40`` costs what a count of 2 does.
    """

    RECLAIM_POLL = 0.5

    def __init__(self, count: int) -> None:
        self._lock = threading.Lock()
        self._unissued = count
        self._tokens: Handoff[None] = Handoff()  # slots given back, waiting for a taker
        self._leases: set[_Lease] = set()

    @property
    def free(self) -> int:
        return self._unissued + len(self._tokens)

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Hold one slot for the body of the ``async with``."""
        lease = await self._acquire()
        try:
            yield
        finally:
            self._release(lease)

    async def _acquire(self) -> _Lease:
        lease = _Lease(asyncio.get_running_loop())
        with self._lock:
            if self._unissued > 0:
                self._unissued -= 1
                self._leases.add(lease)
                return lease
        while True:
            self._reclaim_abandoned()
            try:
                await self._tokens.get(timeout=self.RECLAIM_POLL)
            except TimeoutError:
                continue
            with self._lock:
                self._leases.add(lease)
            return lease

    def _release(self, lease: _Lease) -> None:
        with self._lock:
            if lease not in self._leases:
                return  # taken back from a closed loop already
            self._leases.discard(lease)
        self._tokens.put(None)

    def _reclaim_abandoned(self) -> None:
        with self._lock:
            abandoned = [lease for lease in self._leases if lease.loop.is_closed()]
            self._leases.difference_update(abandoned)
        for _lease in abandoned:
            self._tokens.put(None)


class _Lease:
    """One held slot, and the loop of the call that holds it (compared by identity)."""

    __slots__ = ("loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
