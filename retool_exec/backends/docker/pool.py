"""Warm containers: kept started in the background so a call rarely waits for one.

Two policies, both complete:

- ``fresh``: a container serves exactly one call, then is destroyed; it never
  returns to the ready set.
- ``reuse``: a container serves up to K calls; after each, the agent resets
  and verifies it (no process left, scratch dirs and IPC emptied) and says so
  on the container's stream; any doubt retires it. The pool reads that verdict
  when the next call takes the container, before the call sends it anything
  (``acquire``): no loop is woken for it while the container is idle.

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
import hmac
import logging
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from retool_exec._handoff import Handoff, abandoned, collect_stalled
from retool_exec.backends.docker.containers import ContainerFactory, SandboxContainer
from retool_exec.backends.docker.host_cgroup import TOLERANCE as HOST_MEMORY_TOLERANCE
from retool_exec.backends.docker.protocol import ProtocolError

__all__ = ["PoolUnavailableError", "WarmPool"]

log = logging.getLogger(__name__)

_RESTART_BACKOFF = (0.5, 1.0, 2.0, 5.0)

RESET_CONFIRMATION_LIMIT = 3.0
"""Seconds after its call a reuse container has to confirm its reset, if a call draws it
then; past them it is retired and replaced. A reset takes ~1 ms, and the agent bounds
the work a call can leave it (1 s of file removal, 1,000 SysV ids per kind) and reports
the container unclean past that: a gVisor reset made long by SysV ids and files kept the
next caller of a one-container pool waiting 5.9-11.5 s for a 1 s call under the old 10 s
(finding 40). This is the backstop for anything else; kept well above a reset's time
when 64 callers share 2 cores, where retiring healthy containers would cost far more."""
RESET_PATIENCE = 0.02
"""Seconds a call that drew a still-resetting container waits for it before it lets the
other ready containers go first (a reset takes ~1 ms; a call's leftovers can make it longer)."""


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
        self._ready: Handoff[SandboxContainer] = Handoff(on_handoff=_drawn)
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

    def settled_count(self) -> int:
        """Ready containers whose last reset has been answered (read without waiting, while
        no call can take them): what "the pool is whole again" means for a benchmark."""
        return self._ready.count_where(_reset_answered)

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
        """A ready container whose reset after its last call is confirmed, waiting (up to
        ``timeout``) when the pool is drained.

        The confirmation is read here, by the call that takes the container, so
        it costs no wake-up of its own. One still resetting after
        ``RESET_PATIENCE`` goes back to the ready set, behind the others: a call
        that left a slow reset costs the next call that drew its container no
        more than that. One that is late past ``RESET_CONFIRMATION_LIMIT``,
        unclean, or from a container that died or spoke while idle is retired,
        and the next one is taken.
        """
        deadline = time.monotonic() + timeout
        while True:
            container = await self._take(max(0.0, deadline - time.monotonic()), timeout)
            container.drawn_by = weakref.ref(asyncio.get_running_loop())
            try:
                clean = await _confirm_reset(container)
            except BaseException:
                self.retire(container)
                raise
            if clean is None:
                self._ready.put(container)  # still resetting: the others first
                continue
            if clean and container.channel.poll():
                log.warning(
                    "retiring container %s: %s",
                    container.id[:12],
                    "its stream ended while idle"
                    if container.channel.at_eof()
                    else "it sent a frame while idle",
                )
                clean = False
            if clean and _holds_too_much(container):
                clean = False
            if clean:
                return container
            self.retire(container)

    async def _take(self, left: float, timeout: float) -> SandboxContainer:
        """The next container of the ready set, as it is."""
        if self._closed:
            raise PoolUnavailableError("the pool is closed")
        if self._alive < self.size:
            self._on_home(self._refill)
        container = self._ready.get_nowait()  # the common case: no waiting, no timer
        if container is not None:
            return container
        self._on_home(self._reclaim_abandoned, 0.0)
        try:
            return await self._ready.get(
                left, between=lambda waited: self._on_home(self._reclaim_abandoned, waited)
            )
        except TimeoutError as exc:
            raise PoolUnavailableError(
                f"no sandbox container became ready within {timeout:.0f}s"
                + (f"; last start failure: {self._last_error}" if self._last_error else "")
            ) from (self._last_error or exc)

    def release(self, container: SandboxContainer) -> None:
        """Return a container after a call (from any loop); only a reusable one goes back.

        A reused container goes back before its reset is confirmed: whoever
        takes it next reads the confirmation first (``acquire``).
        """
        if container.reclaimed:
            return
        container.calls += 1
        if self.reuse and not self._closed and container.calls < self.max_calls:
            container.reset_due = time.monotonic() + RESET_CONFIRMATION_LIMIT
            self._ready.put(container)
        else:
            self.retire(container)

    def detach(self, container: SandboxContainer) -> None:
        """Hand a container over for good (to a session family) and start its replacement."""
        container.drawn_by = None
        self._on_home(self._detach_here, container)

    def retire(self, container: SandboxContainer) -> None:
        """Destroy a container in the background and start its replacement (from any loop)."""
        if container.reclaimed:
            return
        container.drawn_by = None
        if self._closed:  # the closing pool removes the container; its stream goes now
            container.channel.close()
        self._on_home(self._retire_here, container)

    def _detach_here(self, container: SandboxContainer) -> None:
        if container not in self._members:
            return  # retired already
        self._members.discard(container)
        self._alive -= 1
        self._refill()

    def _retire_here(self, container: SandboxContainer) -> None:
        if container not in self._members:
            return  # retired already: counted once
        self._members.discard(container)
        self._alive -= 1
        self._spawn(self.factory.destroy(container))
        self._refill()

    def _reclaim_abandoned(self, waited: float) -> None:
        """Retire every container taken by (or on its way to) a call whose event loop is
        closed or gone; ``waited``: how long the caller asking has waited.

        Why: such a call never resumes, and its container was never given back: with
        a pool of one, every later call waited its whole ``start_timeout`` and failed
        (twenty-third and twenty-fourth outside checks). The call's state in the
        container is unknown, so the container is destroyed, never reused. On the
        home loop."""
        members = list(self._members)
        collect_stalled((c.drawn_by for c in members if c.drawn_by is not None), waited)
        for container in members:
            if abandoned(container.drawn_by):
                log.warning(
                    "retiring container %s: the event loop of its call was closed",
                    container.id[:12],
                )
                container.reclaimed = True
                container.channel.close()
                self._retire_here(container)

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
        self._ready.close(lambda: PoolUnavailableError("the pool is closed"))  # wake waiters
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


async def _confirm_reset(container: SandboxContainer) -> bool | None:
    """Whether the agent confirmed, in time, that the last call's reset left it clean;
    None while the reset may still be running after ``RESET_PATIENCE``."""
    due = container.reset_due
    if due is None:
        return True
    left = due - time.monotonic()
    reply: dict[str, Any]
    try:
        reply = await container.channel.receive(timeout=max(0.0, min(left, RESET_PATIENCE)))
    except TimeoutError:
        if left > RESET_PATIENCE:
            return None
        reply = {"reason": f"no reset confirmation within {RESET_CONFIRMATION_LIMIT:g} s"}
    except ProtocolError as exc:
        reply = {"reason": f"no reset confirmation ({exc})"}
    container.reset_due = None
    clean = (
        reply.get("type") == "reset"
        and reply.get("clean") is True
        and hmac.compare_digest(str(reply.get("nonce")), container.nonce)
    )
    if not clean:
        log.warning("retiring container %s: %s", container.id[:12], reply.get("reason"))
    return clean


def _holds_too_much(container: SandboxContainer) -> bool:
    """Whether the host sees the container's gVisor kernel holding more than
    ``HOST_MEMORY_TOLERANCE`` above its ready baseline (``host_cgroup``: a call left it
    there, and the reset inside cannot see it)."""
    watched = container.host_memory
    grown = watched.grown() if watched is not None else None
    if grown is None or grown <= HOST_MEMORY_TOLERANCE:
        return False
    log.warning(
        "retiring container %s: gVisor's kernel holds %d MiB more than when it was ready",
        container.id[:12],
        grown >> 20,
    )
    return True


def _reset_answered(container: SandboxContainer) -> bool:
    return container.reset_due is None or container.channel.poll()


def _drawn(container: SandboxContainer, loop: asyncio.AbstractEventLoop | None) -> None:
    """The ready set's hand-off: the loop a container goes to (None: back in the set)."""
    container.drawn_by = None if loop is None else weakref.ref(loop)
