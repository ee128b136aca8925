"""Sessions on a Ray fleet: pinned to the node that opened them, ending with it.

An interpreter's state cannot move between hosts, so a session (and every
fork of it, which lives in the same container) stays on its node. The actor
keeps the node's SessionHandles by number; this handle holds the number. If
the node is lost, the cell in flight returns a ``sandbox_error`` ("session
lost: ...") and every later use raises ``SessionLostError``, as a Docker
session whose container died does: never replaced by a fresh interpreter
on another node behind the caller's back.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from retool_exec._errors import SessionError, SessionLostError
from retool_exec._models import ExecResult
from retool_exec.backends.base import SessionHandle
from retool_exec.backends.ray.backend import CALL_MARGIN, NodeLostError
from retool_exec.backends.ray.fleet import Node

if TYPE_CHECKING:
    from retool_exec.backends.ray.backend import RayBackend

__all__ = ["RaySession"]

INTERRUPT_GRACE = 1.0
"""The agent's grace between interrupting a cell past its timeout and killing it."""
START_BUDGET = 10.0
"""Seconds for a session (or a fork) to start on its node, beyond the pool's start time."""


@dataclass
class _FamilyClock:
    """When the work a session family sent its node may last until, at the latest.

    A family (a session and its forks) runs one request at a time on its node, so
    a close or a fork waits there for a sibling's cell: its budget must cover that
    cell, or the wait looks like a hung actor, and the node's actor is restarted
    with every call and session on it (closing a fork during a 13 s cell did).
    A cell its caller gave up on still runs, so the time is kept, never cleared.
    """

    busy_until: float = 0.0

    def books(self, seconds: float) -> None:
        """Work of at most ``seconds`` is sent now."""
        self.busy_until = max(self.busy_until, time.monotonic()) + seconds

    def budget(self, seconds: float) -> float:
        """A budget of ``seconds`` for a request that waits for the work booked first."""
        return max(0.0, self.busy_until - time.monotonic()) + seconds


class RaySession(SessionHandle):
    """One interpreter on one node (see the module docstring)."""

    def __init__(
        self, backend: RayBackend, node: Node, sid: int, family: _FamilyClock | None = None
    ) -> None:
        self.backend = backend
        self.node = node
        self.sid = sid
        self.family = family or _FamilyClock()
        self._lost: str | None = None
        self._closed = False
        node.sessions += 1

    @classmethod
    async def open(cls, backend: RayBackend, node: Node, memory_mb: int | None) -> RaySession:
        reply = await cls._ask(
            backend,
            node,
            node.actor.open_session.remote(memory_mb),
            START_BUDGET + backend.config.start_timeout,
        )
        if "sid" not in reply:
            raise SessionLostError(f"the session could not start: {reply.get('lost')}")
        return cls(backend, node, int(reply["sid"]))

    @staticmethod
    async def _ask(backend: RayBackend, node: Node, ref: Any, budget: float) -> dict[str, Any]:
        try:
            reply: dict[str, Any] = await backend.await_node(node, ref, budget)
        except NodeLostError as exc:
            raise SessionLostError(f"its Ray node {node.name} was lost: {exc}") from exc
        return reply

    @property
    def lost(self) -> str | None:
        if self._lost is None and self.node.lost is not None:
            return f"its Ray node {self.node.name} was lost: {self.node.lost}"
        return self._lost

    @lost.setter
    def lost(self, reason: str | None) -> None:
        self._lost = reason

    async def run(self, code: str, timeout: float) -> ExecResult:
        started = time.perf_counter()
        if self.lost is not None:
            raise SessionLostError(f"this session is gone: {self.lost}")
        config = self.backend.config
        work = timeout + INTERRUPT_GRACE + config.host_grace
        budget = self.family.budget(work + CALL_MARGIN)
        self.family.books(work)
        try:
            reply: dict[str, Any] = await self.backend.await_node(
                self.node, self.node.actor.session_run.remote(self.sid, code, timeout), budget
            )
        except NodeLostError as exc:
            self._lost = f"its Ray node {self.node.name} was lost: {exc}"
            return ExecResult.sandbox_failure(
                f"session lost: {self._lost}",
                backend=self.backend.name,
                latency=time.perf_counter() - started,
            )
        if reply.get("lost") is not None:
            self._lost = str(reply["lost"])
        if "result" not in reply:
            raise SessionLostError(f"this session is gone: {self._lost}")
        result: ExecResult = reply["result"]
        return result.model_copy(update={"backend": self.backend.name})

    async def fork(self) -> RaySession:
        if self.lost is not None:
            raise SessionLostError(f"this session is gone: {self.lost}")
        budget = self.family.budget(START_BUDGET + CALL_MARGIN)
        self.family.books(START_BUDGET)
        reply = await self._ask(
            self.backend, self.node, self.node.actor.session_fork.remote(self.sid), budget
        )
        if "error" in reply:
            raise SessionError(str(reply["error"]))
        if "sid" not in reply:
            self._lost = str(reply.get("lost"))
            raise SessionLostError(f"this session is gone: {self._lost}")
        return RaySession(self.backend, self.node, int(reply["sid"]), self.family)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.node.sessions -= 1
        if self.node.lost is None:
            with contextlib.suppress(NodeLostError):  # the node is gone, the session with it
                await self.backend.await_node(
                    self.node,
                    self.node.actor.session_close.remote(self.sid),
                    self.family.budget(CALL_MARGIN),
                )
