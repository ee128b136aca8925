"""A private event loop in a daemon thread, where a Sandbox's backend lives.

Training loops call ``asyncio.run()`` once per step, so a sandbox outlives
many event loops; anything async it holds (pools, background refills,
semaphores) would be bound to a dead loop. Running the backend on one
long-lived loop of its own makes the sandbox indifferent to how many loops
its callers create, and lets the sync API share the same code path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread"]

T = TypeVar("T")
R = TypeVar("R")


class LoopThread:
    """Owns an event loop running forever in a daemon thread until ``stop()``."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        # Reentrant: a signal handler of the caller's thread may close the sandbox while
        # that thread holds the gate, handing a call over (it hung for ever: thirty-third
        # red-team round). Python runs handlers between the thread's own steps, so the
        # handler's hand-over comes whole before or after the other's ``schedule()``.
        self._gate = threading.RLock()
        self._accepting = True
        self._kept: set[asyncio.Task[object]] = set()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            self._wind_down()

    def _wind_down(self) -> None:
        """Every piece of work handed over ends (cancelled) before the loop closes.

        Work handed over just before the stop is still in the loop's queue: it
        is let in (so its caller hears back) and then cancelled like the rest,
        until no task is left. Nothing can be handed over after the gate shuts,
        so no caller waits on a loop that will never run its work.
        """
        if self._accepting:  # stopped other than by ``stop()``, which shuts the gate itself
            with self._gate:
                self._accepting = False
        self.loop.run_until_complete(asyncio.sleep(0))  # let in what was already handed over
        while pending := asyncio.all_tasks(self.loop):
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()

    def _hand_over(self, coro: Coroutine[Any, Any, object], schedule: Callable[[], R]) -> R:
        """``schedule()`` ``coro`` on the loop, unless the loop is stopping.

        Then RuntimeError, and ``coro`` is closed (never awaited, no warning).
        """
        with self._gate:
            if not self._accepting:
                coro.close()
                raise RuntimeError("the sandbox's event loop has stopped")
            return schedule()

    @property
    def in_loop_thread(self) -> bool:
        """True when called from the loop's own thread (where blocking would deadlock)."""
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop from any thread (RuntimeError once it is stopping)."""
        return self._hand_over(coro, lambda: asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def run_from_other_loop(
        self,
        coro: Coroutine[Any, Any, T],
        *,
        shielded: bool = False,
        abandoned: Callable[[T], Coroutine[Any, Any, object]] | None = None,
    ) -> T:
        """Await ``coro`` on this loop from another running event loop.

        One wake-up each way and nothing else: ``asyncio.wrap_future(submit(...))``
        also makes a concurrent future, takes its lock and chains it to a second
        future, ~35 us of CPU more per call (100 -> 65 us a round trip, measured).
        Cancelling the awaiting task cancels ``coro``'s task here, unless ``shielded``
        (a close, once handed over, runs to its end: cancelled before its first step it
        never began). ``abandoned(result)`` runs here on a result the cancelled caller
        will never see, whenever ``coro`` ends with one: a session opened for a caller
        that gave up is closed (it stayed open, in no table, until its TTL: the review
        of the twenty-eighth red-team round).
        """
        caller = asyncio.get_running_loop()
        outcome: asyncio.Future[T] = caller.create_future()
        started: list[asyncio.Task[T]] = []

        def deliver(task: asyncio.Task[T]) -> None:  # in the caller's loop
            if outcome.done():
                return
            if task.cancelled():
                outcome.cancel()
            elif (error := task.exception()) is not None:
                outcome.set_exception(error)
            else:
                outcome.set_result(task.result())

        def finished(task: asyncio.Task[T]) -> None:  # in this loop
            if not task.cancelled():
                task.exception()  # retrieved here, so an abandoned outcome logs nothing
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed
                caller.call_soon_threadsafe(deliver, task)

        def start() -> None:  # in this loop
            task = self.loop.create_task(coro)
            started.append(task)
            task.add_done_callback(finished)

        def settle(task: asyncio.Task[T]) -> None:  # in this loop: its caller is gone
            if abandoned is not None and not task.cancelled() and task.exception() is None:
                self._keep(abandoned(task.result()))

        def cancel() -> None:  # in this loop, after start (same queue, FIFO)
            for task in started:
                task.add_done_callback(settle)  # (at once if it has ended)
                if not shielded:
                    task.cancel()

        self._hand_over(coro, lambda: self.loop.call_soon_threadsafe(start))
        try:
            return await outcome
        except asyncio.CancelledError:
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(cancel)
            raise

    def _keep(self, work: Coroutine[Any, Any, object]) -> None:
        """Run ``work`` as a task of this loop, referenced until it ends."""
        task = self.loop.create_task(work)
        self._kept.add(task)
        task.add_done_callback(self._kept.discard)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the loop (cancelling what still runs) and wait for the thread.

        The gate is shut here, in the stopping thread, not by the loop as it winds down:
        a thread that stops the loop while it holds the gate (a signal handler's close
        during a hand-over) would wait for a loop waiting for the gate."""
        with self._gate:
            self._accepting = False
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            if not self.in_loop_thread:
                self._thread.join(timeout)
