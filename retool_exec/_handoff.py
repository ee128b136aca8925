"""Items handed from any thread to waiters on any event loop, first come first served.

A call runs on the event loop of whoever awaits it (see ``Sandbox.arun_code``),
so the two things calls queue for, a slot of the sandbox's ``max_workers``
and a warm container, are awaited from many loops at once: a training step's
``asyncio.run()``, a server's loop, the sandbox's own loop for sync callers.
``asyncio.Queue`` and ``asyncio.Semaphore`` belong to one loop; ``Handoff``
belongs to none. An item put while a waiter waits goes to the oldest waiter,
on that waiter's own loop; a waiter that gives up (cancelled, timed out) never
swallows an item: what reached it is passed on.

A loop can also be closed, or dropped, while a call in it holds an item or has
one on its way to it: it never resumes that call (twenty-third and
twenty-fourth outside checks). So whoever hands out items records, at the
moment of the hand-off, the loop it goes to (``on_handoff``; weakly, so a
dropped loop can be collected), and takes back what is held from a loop that
is closed or gone (``abandoned``) whenever a caller waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

__all__ = ["RECLAIM_POLL", "Handoff", "LoopRef", "Slots", "abandoned", "collect_stalled"]

T = TypeVar("T")

LoopRef = Callable[[], "asyncio.AbstractEventLoop | None"]
"""A weak reference to an event loop (``weakref.ref(loop)``)."""

RECLAIM_POLL = 0.5
"""Seconds between looks, while a caller waits, for what callers on loops that are closed
or gone still hold."""
STALLED_COLLECT_AFTER = 2.0
"""Seconds a caller waits before a holder on a loop that is alive but not running makes
the garbage collector run: a loop dropped without ``close()`` is found only by it."""
STALLED_COLLECT_EVERY = 10.0
"""At most one such collection per this many seconds, process-wide."""


def abandoned(loop: LoopRef | None) -> bool:
    """Whether what a caller on ``loop`` holds is lost to it: the loop is closed or gone."""
    if loop is None:
        return False
    alive = loop()
    return alive is None or alive.is_closed()


class _Collections:
    """When the last stalled-loop collection ran (``collect_stalled``), process-wide."""

    lock = threading.Lock()
    last = 0.0


def _stalled(ref: LoopRef) -> bool:
    """Whether the loop is alive but neither running nor closed (holding no reference to
    it once it returns: the collection that follows must be able to free it)."""
    loop = ref()
    return loop is not None and not loop.is_closed() and not loop.is_running()


def collect_stalled(loops: Iterable[LoopRef], waited: float) -> None:
    """Collect garbage once a caller has waited ``STALLED_COLLECT_AFTER`` seconds while a
    holder's loop is alive but not running (at most every ``STALLED_COLLECT_EVERY`` s).

    Why: a loop stopped with a call in flight and then dropped (``asyncio.wait`` with
    a timeout, the loop never closed) holds its slot and container until the collector
    finalizes it (``BaseEventLoop.__del__`` closes it), and that may take long in a
    process that allocates little. A loop stopped and kept is not collected, and keeps
    what it holds: its caller may run it again."""
    if waited < STALLED_COLLECT_AFTER or not any(_stalled(ref) for ref in loops):
        return
    with _Collections.lock:
        if time.monotonic() - _Collections.last < STALLED_COLLECT_EVERY:
            return
        _Collections.last = time.monotonic()
    gc.collect()


class Handoff(Generic[T]):
    """A FIFO of items and a FIFO of waiters, under one lock, usable from any thread."""

    def __init__(
        self, on_handoff: Callable[[T, asyncio.AbstractEventLoop | None], None] | None = None
    ) -> None:
        # Re-entrant: a coroutine collected as garbage while a put holds the lock (the
        # collector runs at any allocation) gives back its slot from the same thread.
        self._lock = threading.RLock()
        self._on_handoff = on_handoff
        """Told, under the lock, where an item goes: a waiter's loop, or None (kept)."""
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
                    self._handed(item, loop)
                    waiter.set_result(item)
                    return
                try:
                    loop.call_soon_threadsafe(self._deliver, waiter, item)
                except RuntimeError:  # that waiter's loop is closed: it will never take it
                    continue
                self._handed(item, loop)  # on its way: a loop closed first never takes it
                return
            self._handed(item, None)
            self._items.append(item)

    def _handed(self, item: T, loop: asyncio.AbstractEventLoop | None) -> None:
        if self._on_handoff is not None:
            self._on_handoff(item, loop)

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

    async def get(
        self, timeout: float | None = None, *, between: Callable[[float], None] | None = None
    ) -> T:
        """The oldest item, waiting for one up to ``timeout`` seconds (TimeoutError).

        ``between(waited)`` is called every ``RECLAIM_POLL`` seconds of the wait, the
        waiter keeping its place in the queue (the owner takes back what callers on
        closed loops hold then)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._items:
                return self._items.popleft()
            if self._closed is not None:
                raise self._closed()
            waiter: asyncio.Future[T] = loop.create_future()
            self._waiters.append(waiter)
        began = loop.time()
        try:
            while True:
                left = None if timeout is None else began + timeout - loop.time()
                if left is not None and left <= 0:
                    raise TimeoutError
                step = left if between is None else min(RECLAIM_POLL, left or RECLAIM_POLL)
                await asyncio.wait((waiter,), timeout=step)
                if waiter.done():
                    return waiter.result()
                if between is not None:
                    between(loop.time() - began)
        except BaseException:
            waiter.cancel()  # a delivery on its way passes the item on (``_deliver``)
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

    Each held slot is a lease naming its caller's loop, recorded when the slot is
    handed over: one held from a loop that is closed or gone is taken back while a
    caller waits (checked every ``RECLAIM_POLL`` s), and never given back twice.
    Slots are counted, not stored: a count of ``2**40`` costs what a count of 2 does
    (``max_workers=2**40`` froze the first call).
    """

    def __init__(self, count: int) -> None:
        # Re-entrant: an abandoned call collected as garbage while the lock is held (the
        # collector runs at any allocation) gives back its lease from the same thread.
        self._lock = threading.RLock()
        self._free = count
        self._held: set[_Lease] = set()
        self._waiting: deque[_Lease] = deque()
        self._last_reclaim = 0.0

    @property
    def free(self) -> int:
        return self._free

    def hold(self) -> _Held:
        """Hold one slot for the body of an ``async with``."""
        return _Held(self)

    async def acquire(self) -> _Lease:
        """A slot, waiting for one in turn; give it back with ``release``."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free > 0 and not self._waiting:
                self._free -= 1
                lease = _Lease(loop)
                self._held.add(lease)
                return lease
            future: asyncio.Future[None] = loop.create_future()
            lease = _Lease(loop, future)
            self._waiting.append(lease)
        # One timer, not a timed wait: a wait with a timeout cost the calls at 16 callers
        # 3% of their throughput in the benchmark.
        poll = loop.call_later(RECLAIM_POLL, self._poll, lease, loop.time())
        try:
            await future
            return lease
        except BaseException:
            with contextlib.suppress(RuntimeError):  # its loop closed: finalized as garbage
                future.cancel()
            self._give_up(lease)
            raise
        finally:
            with contextlib.suppress(RuntimeError):
                poll.cancel()  # a later one finds the wait over and stops

    def _poll(self, lease: _Lease, began: float) -> None:
        """On the waiter's loop, every ``RECLAIM_POLL`` s: look for slots held from loops
        that are closed or gone (at most once a poll for all waiters together).

        Every waiter looks, not only the first in line: the first may itself be on a loop
        that stopped, whose timer never fires, and then nobody looked (a step that
        gathered more calls than ``max_workers`` and was dropped stopped every later
        call; twenty-fifth outside check)."""
        future = lease.future() if lease.future is not None else None
        loop = lease.loop()
        if future is None or future.done() or loop is None:
            return
        now = time.monotonic()
        if now - self._last_reclaim >= RECLAIM_POLL:
            self._last_reclaim = now
            self._reclaim_abandoned(loop.time() - began)
        if not future.done():  # not kept on the lease: it holds its loop, strongly
            loop.call_later(RECLAIM_POLL, self._poll, lease, began)

    def release(self, lease: _Lease) -> None:
        """Give a slot back (once: a lease taken back from a closed loop is ignored)."""
        with self._lock:
            if lease not in self._held:
                return
            self._held.discard(lease)
            self._hand_on()

    def _give_up(self, lease: _Lease) -> None:
        """A waiter left: out of the queue, or, if its slot was on its way, passed on."""
        with self._lock:
            if lease in self._waiting:
                self._waiting.remove(lease)
                return
        self.release(lease)

    def _hand_on(self) -> None:
        """Under the lock: a slot freed goes to the first waiter still there, else is free."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        while self._waiting:
            lease = self._waiting.popleft()
            loop = lease.loop()
            future = lease.future() if lease.future is not None else None
            if loop is None or future is None or future.done():
                continue  # gone, or gave up
            self._held.add(lease)  # recorded before it is on its way
            if loop is running:
                future.set_result(None)
                return
            try:
                loop.call_soon_threadsafe(_wake, future)
            except RuntimeError:  # closed: it never takes it
                self._held.discard(lease)
                continue
            return
        self._free += 1

    def _reclaim_abandoned(self, waited: float) -> None:
        with self._lock:
            held = list(self._held)
        collect_stalled((lease.loop for lease in held), waited)
        with self._lock:
            for lease in list(self._waiting):  # waiters on loops closed or gone: left
                if abandoned(lease.loop):
                    self._waiting.remove(lease)
            for lease in list(self._held):
                if abandoned(lease.loop):
                    self._held.discard(lease)
                    self._hand_on()


class _Lease:
    """One slot held or asked for, and the loop of its caller (both weakly)."""

    __slots__ = ("future", "loop")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[None] | None = None
    ) -> None:
        self.loop: LoopRef = weakref.ref(loop)
        self.future = None if future is None else weakref.ref(future)


class _Held:
    """``async with slots.hold():`` (a class, not a generator: it is on every call's path)."""

    __slots__ = ("_lease", "_slots")

    def __init__(self, slots: Slots) -> None:
        self._slots = slots
        self._lease: _Lease | None = None

    async def __aenter__(self) -> None:
        self._lease = await self._slots.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        if self._lease is not None:
            self._slots.release(self._lease)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
