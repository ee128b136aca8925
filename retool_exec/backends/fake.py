"""A backend that runs nothing: for testing code that uses a Sandbox.

Like httpx's ``MockTransport``: give it a handler that maps a request to a
result (or to a string, taken as stdout of a successful run), and your
training-loop tests run without Python subprocesses or Docker.

    sandbox = Sandbox(backend=FakeBackend(lambda req: "5\\n"))

The handler sees the whole ``RunRequest`` (``stdin``, ``files``, ``fetch``,
``cells``, ``auto_print``, ...; the code as written, since real backends print a
final expression where the code runs); a test that needs fetched files or notebook cells back
returns an ``ExecResult`` with ``files``/``fetch_errors``/``cells`` set, since
a plain string answer carries stdout only.

Sessions (``Sandbox.session()``) work too. Each cell of a session goes to
``session_handler`` as a ``FakeCell``: the session's id, the cell's code and
timeout, the id of the session it was forked from, and ``history``, the code
of every cell that ran before it in this session's line (a fork's history is
its parent's at the moment of the fork). Nothing is executed, so the history
*is* the state: a handler can answer from it, or keep its own state by
session id.

    def cell(c: FakeCell) -> str:
        return "42\\n" if "print(x)" in c.code and "x = 42" in c.history else ""

    sandbox = Sandbox(backend=FakeBackend(session_handler=cell))

Without a ``session_handler``, a session's cells go to ``handler`` as plain
``RunRequest(code=cell, timeout=...)``. Either handler may answer with a
string (a successful cell printing it) or an ``ExecResult``; a result whose
``detail`` starts with ``"session lost:"`` ends the session, as a real
backend's does, so its next use raises ``SessionLostError``. ``fork()`` and
``close()`` behave as on real backends (after ``close()``, use raises
``SessionLostError``), and ``backend.sessions`` lists every session opened or
forked, ``backend.cells`` every cell seen, in order.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from retool_exec._errors import SessionLostError
from retool_exec._models import CellResult, ExecResult
from retool_exec.backends.base import Backend, RunRequest, SessionHandle
from retool_exec.backends.config import FakeConfig

__all__ = ["FakeBackend", "FakeCell", "FakeHandler", "FakeSession", "FakeSessionHandler"]

FakeHandler = Callable[[RunRequest], "ExecResult | str | Awaitable[ExecResult | str]"]

LOST_PREFIX = "session lost:"
"""The start of a result's ``detail`` that ends its session (as real backends report it)."""


@dataclass(frozen=True, slots=True)
class FakeCell:
    """One cell of a fake session, as ``session_handler`` sees it."""

    session: int
    """The session's id: 1, 2, ... in the order sessions were opened or forked."""
    code: str
    timeout: float
    history: tuple[str, ...] = ()
    """The code of the cells run before this one in this session's line, oldest first
    (a fork starts with its parent's history at the moment of the fork)."""
    parent: int | None = None
    """The id of the session this one was forked from (None: opened)."""

    @property
    def index(self) -> int:
        """The cell's position in its line, from 0 (real backends name it ``<cell index+1>``)."""
        return len(self.history)


FakeSessionHandler = Callable[[FakeCell], "ExecResult | str | Awaitable[ExecResult | str]"]


class FakeBackend(Backend):
    """Answers every request through ``handler``; records the requests it saw."""

    name = "fake"

    def __init__(
        self,
        handler: FakeHandler | None = None,
        *,
        session_handler: FakeSessionHandler | None = None,
    ) -> None:
        self._handler: FakeHandler = handler or (lambda _request: "")
        self._session_handler = session_handler
        self.requests: list[RunRequest] = []
        """Every request ``run`` saw (a session's cells are in ``cells``)."""
        self.sessions: list[FakeSession] = []
        """Every session opened or forked, in order (closed ones included)."""
        self.cells: list[FakeCell] = []
        """Every session cell seen, in order."""
        self.started = False
        self.closed = False
        self._ids = itertools.count(1)

    @classmethod
    def from_config(cls, config: FakeConfig) -> FakeBackend:
        """A backend that returns the config's fixed values after ``config.delay``."""

        async def fixed(_request: RunRequest) -> ExecResult:
            if config.delay:
                await asyncio.sleep(config.delay)
            return ExecResult(
                ok=not config.timed_out and config.returncode == 0,
                stdout=config.stdout,
                stderr=config.stderr,
                returncode=None if config.timed_out else config.returncode,
                timed_out=config.timed_out,
                latency=config.delay,
                backend=cls.name,
            )

        backend = cls(fixed)
        backend.config = config  # type: ignore[attr-defined]
        return backend

    async def start(self) -> None:
        self.started = True

    async def run(self, request: RunRequest) -> ExecResult:
        started = time.perf_counter()
        self.requests.append(request)
        answer = self._handler(request)
        if inspect.isawaitable(answer):
            answer = await answer
        if isinstance(answer, str):
            return ExecResult(
                True, answer, "", 0, False, time.perf_counter() - started, backend=self.name
            )
        return answer

    async def open_session(self, *, memory_mb: int | None = None) -> FakeSession:
        """A new fake session (``memory_mb`` is ignored)."""
        return self._new_session(parent=None, history=())

    def _new_session(self, *, parent: int | None, history: tuple[str, ...]) -> FakeSession:
        session = FakeSession(self, next(self._ids), parent=parent, history=history)
        self.sessions.append(session)
        return session

    async def _answer_cell(self, cell: FakeCell) -> ExecResult | str:
        self.cells.append(cell)
        answer: ExecResult | str | Awaitable[ExecResult | str]
        if self._session_handler is not None:
            answer = self._session_handler(cell)
        else:
            answer = self._handler(RunRequest(code=cell.code, timeout=cell.timeout))
        if inspect.isawaitable(answer):
            answer = await answer
        return answer

    async def close(self) -> None:
        for session in self.sessions:
            await session.close()
        self.closed = True


class FakeSession(SessionHandle):
    """One fake session: its id, lineage and history; see the module docstring."""

    def __init__(
        self,
        backend: FakeBackend,
        session_id: int,
        *,
        parent: int | None,
        history: tuple[str, ...],
    ) -> None:
        self._backend = backend
        self.id = session_id
        self.parent = parent
        self.history = history
        """The code of every cell run in this session's line so far."""
        self.closed = False

    def _check_usable(self) -> None:
        if self.lost is not None:
            raise SessionLostError(f"this session is gone: {self.lost}")
        if self.closed:
            raise SessionLostError("this session was closed")

    async def run(self, code: str, timeout: float) -> ExecResult:
        self._check_usable()
        started = time.perf_counter()
        cell = FakeCell(self.id, code, timeout, self.history, self.parent)
        answer = await self._backend._answer_cell(cell)
        self.history = (*self.history, code)
        if isinstance(answer, str):
            return ExecResult(
                ok=True,
                stdout=answer,
                stderr="",
                returncode=0,
                timed_out=False,
                latency=time.perf_counter() - started,
                backend=self._backend.name,
                cells=[CellResult(stdout=answer, finished=True)],
            )
        if answer.detail.startswith(LOST_PREFIX):
            self.lost = answer.detail[len(LOST_PREFIX) :].strip() or "the session was lost"
        return answer

    async def fork(self) -> FakeSession:
        self._check_usable()
        return self._backend._new_session(parent=self.id, history=self.history)

    async def close(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return f"FakeSession({self.id}, parent={self.parent}, cells={len(self.history)})"
