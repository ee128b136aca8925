"""Warm containers: kept started in the background so a call rarely waits for one.

Two policies, both complete:

- ``fresh``: a container serves exactly one call, then is destroyed; it never
  returns to the ready set.
- ``reuse``: a container serves up to K calls; after each, the agent resets
  and verifies it (no process left, scratch dirs and IPC emptied); any doubt
  retires it.

The pool never holds a lock while starting or removing a container: those
run as background tasks on the loop that started the pool (its home), and
``acquire`` waits on a ``Handoff``. Calls take and give back containers from
any event loop (a call runs on its caller's loop); whatever changes what is
alive (retiring, detaching, refilling) is done on the home loop. The number
of containers alive (ready + busy + starting) never exceeds ``size``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from retool_exec._handoff import Handoff
from retool_exec.backends.docker.containers import ContainerFactory, SandboxContainer

__all__ = ["PoolUnavailableError", "WarmPool"]

log = logging.getLogger(__name__)

_RESTART_BACKOFF = (0.5, 1.0, 2.0, 5.0)


class PoolUnavailableError(Exception):
    """No container became ready in time; carries the last start failure as its cause."""


class WarmPool:
    """A bounded set of started containers for one backend (made on its home loop)."""

    def __init__(
        self, factory: ContainerFactory, *, size: int, reuse: bool, max_calls: int
    ) -> None:
        self.factory = factory
        self.size = size
        self.reuse = reuse
        self.max_calls = max_calls
        self._home = asyncio.get_running_loop()
        self._ready: Handoff[SandboxContainer] = Handoff()
        self._alive = 0
        self._failures = 0
        self._last_error: BaseException | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._members: set[SandboxContainer] = set()  # started and not yet retired or detached
        self._closed = False
        self.started_containers = 0

    @property
    def ready_count(self) -> int:
        """Containers in the ready set (a reused one possibly still confirming its reset)."""
        return len(self._ready)

    def count_ready(self, condition: Callable[[SandboxContainer], bool]) -> int:
        """Ready containers ``condition`` holds for, checked while no call can take them."""
        return self._ready.count_where(condition)

    async def start(self, timeout: float) -> None:
        """Fill the pool and wait until every container is ready (or one failed to start)."""
        self._refill()
        deadline = time.monotonic() + timeout
        while len(self._ready) < self.size:
            if self._last_error is not None:
                raise PoolUnavailableError(
                    f"a sandbox container failed to start: {self._last_error}"
                ) from self._last_error
            if time.monotonic() > deadline:
                raise PoolUnavailableError(f"the pool was not ready within {timeout:.0f}s")
            await asyncio.sleep(0.02)

    async def acquire(self, timeout: float) -> SandboxContainer:
        """A ready container, waiting (up to ``timeout``) when the pool is drained."""
        if self._closed:
            raise PoolUnavailableError("the pool is closed")
        if self._alive < self.size:
            self._on_home(self._refill)
        container = self._ready.get_nowait()  # the common case: no waiting, no timer
        if container is not None:
            return container
        try:
            return await self._ready.get(timeout)
        except TimeoutError as exc:
            raise PoolUnavailableError(
                f"no sandbox container became ready within {timeout:.0f}s"
                + (f"; last start failure: {self._last_error}" if self._last_error else "")
            ) from (self._last_error or exc)

    def release(self, container: SandboxContainer) -> None:
        """Return a container after a call (from any loop); only a reusable one goes back.

        A reused container goes back before its reset is confirmed: whoever
        takes it next reads the confirmation first (``container.reset_due``).
        """
        container.calls += 1
        if self.reuse and not self._closed and container.calls < self.max_calls:
            self._ready.put(container)
        else:
            self.retire(container)

    def requeue(self, container: SandboxContainer) -> None:
        """Put back a container taken but not used (its reset is still running)."""
        if self._closed:
            self.retire(container)
        else:
            self._ready.put(container)

    def detach(self, container: SandboxContainer) -> None:
        """Hand a container over for good (to a session family) and start its replacement."""
        self._on_home(self._detach_here, container)

    def retire(self, container: SandboxContainer) -> None:
        """Destroy a container in the background and start its replacement (from any loop)."""
        if self._closed:  # the closing pool removes the container; its stream goes now
            container.channel.close()
        self._on_home(self._retire_here, container)

    def _detach_here(self, container: SandboxContainer) -> None:
        self._members.discard(container)
        self._alive -= 1
        self._refill()

    def _retire_here(self, container: SandboxContainer) -> None:
        self._members.discard(container)
        self._alive -= 1
        self._spawn(self.factory.destroy(container))
        self._refill()

    def _on_home(self, step: Callable[..., None], *args: Any) -> None:
        """Run ``step`` on the home loop: now if this is it, else as its next callback.

        A home loop that is closed has closed the pool too (its containers are
        swept by label), so a step that cannot reach it has nothing left to do.
        """
        try:
            here = asyncio.get_running_loop() is self._home
        except RuntimeError:
            here = False
        if here:
            step(*args)
        else:
            with contextlib.suppress(RuntimeError):
                self._home.call_soon_threadsafe(step, *args)

    def _refill(self) -> None:
        while not self._closed and self._alive < self.size:
            self._alive += 1
            self._spawn(self._start_one())

    async def _start_one(self) -> None:
        try:
            container = await self.factory.create()
        except asyncio.CancelledError:
            self._alive -= 1
            raise
        except Exception as exc:
            self._alive -= 1
            self._last_error = exc
            self._failures += 1
            delay = _RESTART_BACKOFF[min(self._failures, len(_RESTART_BACKOFF)) - 1]
            log.warning("sandbox container failed to start (%s); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            self._refill()
            return
        self._failures = 0
        self._last_error = None
        self.started_containers += 1
        if self._closed:
            await self.factory.destroy(container)
            return
        self._members.add(container)
        self._ready.put(container)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop refilling, destroy every container, wait for background work."""
        self._closed = True
        while (container := self._ready.get_nowait()) is not None:
            self._retire_here(container)
        # Starts in flight are awaited, not cancelled: a cancelled start could leave
        # a container that its docker-py thread creates after we stopped looking.
        while pending := [t for t in self._tasks if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)
        await self.factory.remove_pool_containers()
        for container in self._members:  # busy ones, their calls on other loops
            container.channel.close()
        self._members.clear()
