"""RayBackend: the Backend a Sandbox drives when its calls run across a Ray cluster.

Each call goes to the least-loaded node's actor (``fleet``) as a RunRequest
and comes back as that node's ExecResult. Ray does the transport, the
placement and the failure detection; this module decides what a failure
means for the call:

* the node (or its actor) died before answering: the call is run again on
  another node if it has taken at most ``rerun_budget`` seconds so far
  (calls are hermetic: no network, no state kept between calls, so running
  one twice is safe), else it ends as a ``sandbox_error`` naming the node;
* the node did not answer within the call's own limit plus its pool's
  start time plus a margin (a hung actor): the call is cancelled there, the
  actor is restarted by Ray, and the call is treated as above;
* no node at all for ``node_wait`` seconds: a ``sandbox_error``.

Nothing here raises out of ``run`` for a node's failure, and no call waits
without a bound on a node that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from retool_exec._errors import SessionLostError
from retool_exec._models import ExecResult
from retool_exec.backends.base import Backend, RunRequest, SessionHandle
from retool_exec.backends.config import RayConfig
from retool_exec.backends.ray.connect import connect
from retool_exec.backends.ray.fleet import Fleet, Node, NodeStats

__all__ = ["CALL_MARGIN", "MAX_RERUNS", "NodeLostError", "RayBackend"]

log = logging.getLogger(__name__)

CALL_MARGIN = 10.0
"""Seconds past a call's worst case on its node (timeout + host_grace + start_timeout)
before the driver takes the node's actor as hung."""
MAX_RERUNS = 3
"""Most times one call is run again after losing its node (a flapping fleet ends it)."""


class NodeLostError(Exception):
    """A node (or its actor) failed to answer a call; internal to this backend."""


class RayBackend(Backend):
    """Docker pools on the nodes of a Ray cluster; see ``RayConfig`` and docs/scaling.md."""

    name = "ray"

    def __init__(self, config: RayConfig | None = None) -> None:
        self.config = config or RayConfig()
        self._fleet: Fleet | None = None
        self._ray: Any = None
        self._start_lock: asyncio.Lock | None = None
        self.reruns = 0
        """Calls run again on another node after theirs was lost (since start)."""

    @property
    def capacity(self) -> int:
        """``max_in_flight``: the fleet's size changes, so the Sandbox's bound is a setting."""
        return self.config.max_in_flight

    @property
    def fleet(self) -> Fleet | None:
        """The nodes, once started (for tests and stats)."""
        return self._fleet

    def nodes(self) -> list[NodeStats]:
        """Each node taking calls now: capacity, calls in flight, sessions, calls served."""
        return self._fleet.stats() if self._fleet is not None else []

    async def start(self) -> None:
        if self._fleet is not None:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._fleet is not None:
                return
            ray = await asyncio.to_thread(connect, self.config.address)
            from retool_exec.backends.ray.actor import NodeActor

            fleet = Fleet(ray, self.config, ray.remote(NodeActor))
            try:
                await fleet.start()
            except BaseException:
                await fleet.close()
                raise
            self._ray, self._fleet = ray, fleet

    async def run(self, request: RunRequest) -> ExecResult:
        started = time.perf_counter()
        if self._fleet is None:
            await self.start()
        fleet = self._fleet
        assert fleet is not None
        lost: list[str] = []
        while True:
            node = await fleet.acquire()
            waited = time.perf_counter() - started
            if node is None:
                return self._failure(
                    started,
                    f"no Ray node could take the call for {self.config.node_wait:g} s"
                    + (f" (after: {'; '.join(lost)})" if lost else ""),
                    waited,
                )
            try:
                result: ExecResult = await self._call(node, node.actor.run.remote(request), request)
            except NodeLostError as exc:
                lost.append(f"node {node.name}: {exc}")
                elapsed = time.perf_counter() - started
                if elapsed <= self.config.rerun_budget and len(lost) <= MAX_RERUNS:
                    self.reruns += 1
                    log.warning("re-running a call whose Ray node was lost: %s", exc)
                    continue
                return self._failure(
                    started,
                    f"its Ray node was lost and the call was not run again (after "
                    f"{elapsed:.1f} s; rerun_budget {self.config.rerun_budget:g} s, "
                    f"{len(lost) - 1} re-run(s)): {'; '.join(lost)}",
                    waited,
                )
            finally:
                fleet.release(node)
            update: dict[str, Any] = {
                "backend": self.name,
                "queue_wait": waited + result.queue_wait,
            }
            if lost:
                note = f"run again after losing its node ({'; '.join(lost)})"
                update["detail"] = f"{result.detail}; {note}" if result.detail else note
            return result.model_copy(update=update)

    async def _call(self, node: Node, ref: Any, request: RunRequest) -> Any:
        """Await one actor call; any way its node fails becomes NodeLostError."""
        docker = self.config
        budget = request.timeout + docker.host_grace + docker.start_timeout + CALL_MARGIN
        return await self.await_node(node, ref, budget)

    async def await_node(self, node: Node, ref: Any, budget: float) -> Any:
        """The reply to ``ref`` from ``node`` within ``budget`` seconds, or NodeLostError."""
        exceptions = self._ray.exceptions
        try:
            async with asyncio.timeout(budget):
                return await ref
        except TimeoutError as exc:
            self._cancel(ref)
            if self._fleet is not None:  # else closed meanwhile: nothing to restart
                self._fleet.restart(node, f"a call got no answer within {budget:.0f} s")
            reason = f"no answer within {budget:.0f} s (its actor was restarted)"
            raise NodeLostError(reason) from exc
        except asyncio.CancelledError:
            self._cancel(ref)  # the caller gave up: stop the call on its node too
            raise
        except exceptions.RayError as exc:
            reason = f"{type(exc).__name__}: {_first_line(exc)}"
            if not isinstance(exc, exceptions.ActorUnavailableError) and self._fleet is not None:
                self._fleet.drop(node, reason)  # a live node gets a new actor at the next look
            raise NodeLostError(reason) from exc

    def _cancel(self, ref: Any) -> None:
        with contextlib.suppress(Exception):
            self._ray.cancel(ref)

    async def open_session(self, *, memory_mb: int | None = None) -> SessionHandle:
        """A session on the node with the fewest; it lives and dies with that node."""
        from retool_exec.backends.ray.session import RaySession

        if self._fleet is None:
            await self.start()
        assert self._fleet is not None
        node = self._fleet.least_loaded()
        if node is None:
            raise SessionLostError("no Ray node is taking sessions now")
        return await RaySession.open(self, node, memory_mb)

    def _failure(self, started: float, detail: str, waited: float = 0.0) -> ExecResult:
        log.warning("sandbox failure: %s", detail)
        return ExecResult.sandbox_failure(
            detail, backend=self.name, latency=time.perf_counter() - started, queue_wait=waited
        )

    async def close(self) -> None:
        fleet, self._fleet = self._fleet, None
        if fleet is not None:
            await fleet.close()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else ""
