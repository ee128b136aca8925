"""``/sessions``: stateful interpreters for HTTP clients that are not Python.

=================================  ===============================================
``POST   /sessions``               open one: 201 ``{"session_id", "ttl"}``
``POST   /sessions/{id}/run``      run a cell: 200 ``SessionRunResponse``
``POST   /sessions/{id}/fork``     copy its state now: 201 ``{"session_id", "ttl"}``
``DELETE /sessions/{id}``          close it: 204
=================================  ===============================================

Each id stands for one ``Session`` of the server's Sandbox
(``retool_exec._session``): globals, imports and files persist from cell to
cell, and a fork is an independent copy. The id is ``secrets.token_urlsafe``
(192 random bits) and is good only for the client that made it: another
client, or a guess, gets 404, the same answer as for an id that never
existed. The client is the token it sent when the server has one, else its
IP address (``client_key``).

Every cell, open and fork takes a run slot of the server's admission queue
like any other request (504 when the server is full). Answers:

===  ==========================================================================
404  no such session here: unknown, deleted, another client's, or closed by
     the sandbox after ``session_ttl`` seconds idle ("expired")
409  a cell or fork is already running in this session (one at a time)
410  the session's interpreter is gone (killed after a cell ignored its
     timeout, out of memory, exited, its container lost); its state is lost,
     and it is never replaced by a fresh interpreter behind the client's back
429  the client already holds ``max_sessions_per_client`` sessions
503  the sandbox holds its ``max_sessions`` (all clients), or a session could
     not start (``Retry-After: 1``)
501  the backend has no sessions; 403 when the server turned sessions off
===  ==========================================================================

The cell in which an interpreter ends is still answered 200, with what it
printed, ``session_lost: true`` and the reason in ``message``; the id answers
410 from then on (until deleted, or for an hour, then 404). ``DELETE`` answers
204 for any id this client holds, lost or expired included, and 404 otherwise;
a session being deleted counts against its client until it is closed (on
Docker after its running cell, if any, has ended).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Coroutine, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from retool_exec._errors import (
    ConfigError,
    SandboxClosedError,
    SessionError,
    SessionLimitError,
    SessionLostError,
    SessionsUnsupportedError,
)
from retool_exec._models import ExecResult, Outcome
from retool_exec._session import Session
from retool_exec.server.admission import ClientGone
from retool_exec.server.files import RequestRejected
from retool_exec.server.jupyter import display_entry, error_entry
from retool_exec.server.results import outcome_message, run_status
from retool_exec.server.schemas import (
    SessionCreated,
    SessionCreateRequest,
    SessionRunRequest,
    SessionRunResponse,
)

if TYPE_CHECKING:
    from retool_exec.server.service import Disconnected, SandboxService

__all__ = ["ENDED_RETENTION", "ID_BYTES", "MAX_ENDED", "SessionService", "client_key"]

log = logging.getLogger("retool_exec.server")

ID_BYTES = 24
"""Random bytes in a session id (``secrets.token_urlsafe``: 32 characters)."""
MAX_ENDED = 4096
"""Ended sessions remembered (to answer 410/404 with the reason) at most; oldest forgotten."""
ENDED_RETENTION = 3600.0
"""Seconds an ended session is remembered (then its id is simply unknown: 404)."""
LOOK_AGAIN = 0.01
"""Seconds between the two looks at a client that may have left (``_left``)."""
_RETRY = {"Retry-After": "1"}


def client_key(*, token: str | None, peer: str | None) -> str:
    """Who holds a session: a digest of the token when the server checks one, else the IP.

    With one server token every holder of it is the same client; without a token,
    clients behind one proxy or NAT share an address and so a cap.
    """
    if token is not None:
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()
        return f"token:{digest[:32]}"
    return f"peer:{peer or 'unknown'}"


@dataclass(eq=False)
class _Entry:
    client: str
    session: Session
    busy: bool = False
    """A cell or fork is running in it."""
    ended: str | None = None
    """Why it ended, once the server saw it end; the id then answers ``status``."""
    status: int = 410
    """410 for an interpreter that was lost, 404 for a session closed when idle."""
    ended_at: float = 0.0


class SessionService:
    """The ``/sessions`` endpoints over the server's Sandbox, within its admission queue."""

    def __init__(self, service: SandboxService) -> None:
        self._service = service
        self._entries: dict[str, _Entry] = {}
        self._pending: Counter[str] = Counter()
        self._finishing: set[asyncio.Future[None]] = set()
        self.opened = 0
        """Sessions opened so far (forks included)."""
        self.lost = 0
        """Sessions whose interpreter ended on its own (answered 410 after)."""
        self.expired = 0
        """Sessions the sandbox closed after ``session_ttl`` seconds idle."""

    @property
    def ttl(self) -> float:
        """Seconds a session may stay idle: the sandbox's ``session_ttl``."""
        return self._service.sandbox.session_ttl

    # -- the endpoints ---------------------------------------------------------------

    async def create(
        self, request: SessionCreateRequest, *, client: str, gone: Disconnected | None = None
    ) -> SessionCreated:
        """``POST /sessions``."""
        self._check_enabled()
        memory = self._service.clamp_memory(request.memory_mb)
        with self._reservation(client):
            async with self._service.admission.slot(gone=gone):
                try:
                    session = await self._sandbox_call(
                        self._service.sandbox.aopen_session(memory_mb=memory)
                    )
                except SessionLostError as exc:
                    raise _unavailable(f"the session could not start: {exc}") from exc
            return await self._hand_over(client, session, gone)

    async def run(
        self,
        session_id: str,
        request: SessionRunRequest,
        *,
        client: str,
        gone: Disconnected | None = None,
    ) -> tuple[SessionRunResponse, Outcome]:
        """``POST /sessions/{id}/run``: the answer, and retool_exec's outcome for the header."""
        service = self._service
        entry = await self._entry(session_id, client)
        service._check_size(request.code)
        timeout = service.clamp_timeout(request.timeout)
        with self._busy(entry):
            try:
                result = await service._run(
                    lambda: entry.session.arun_code(request.code, timeout=timeout),
                    gone=gone,
                    passthrough=(SessionError, SandboxClosedError),
                )
            except SessionLostError as exc:
                await self._end(entry)
                raise self._gone(entry) from exc
            except SandboxClosedError as exc:
                raise _shutting_down() from exc
        lost = entry.session.lost
        if lost is not None and self._entries.get(session_id) is entry:
            await self._end(entry)
        return self._answer(result, lost, timeout), result.outcome

    async def fork(
        self, session_id: str, *, client: str, gone: Disconnected | None = None
    ) -> SessionCreated:
        """``POST /sessions/{id}/fork``."""
        entry = await self._entry(session_id, client)
        with self._reservation(client), self._busy(entry):
            async with self._service.admission.slot(gone=gone):
                try:
                    child = await self._sandbox_call(entry.session.afork())
                except SessionLostError as exc:
                    if entry.session.lost is not None:
                        await self._end(entry)
                        raise self._gone(entry) from exc
                    raise _unavailable(f"the fork failed: {exc}") from exc
            return await self._hand_over(client, child, gone)

    async def delete(self, session_id: str, *, client: str) -> None:
        """``DELETE /sessions/{id}``: close it (any id this client holds, ended or not)."""
        self._check_enabled()
        self._prune()
        entry = self._entries.get(session_id)
        if entry is None or entry.client != client:
            raise _not_found()
        del self._entries[session_id]
        if entry.ended is None:
            await self._to_the_end(self._close_held(client, entry.session))

    def metrics(self) -> dict[str, float]:
        """Gauges and counters for ``/v1/metrics``."""
        self._prune()
        live = sum(1 for entry in self._entries.values() if entry.ended is None)
        return {
            "server/sessions": float(live),
            "server/sessions_opened": float(self.opened),
            "server/sessions_lost": float(self.lost),
            "server/sessions_expired": float(self.expired),
        }

    async def close(self) -> None:
        """Close every session the server opened (at shutdown)."""
        entries = list(self._entries.values())
        self._entries.clear()
        live = [entry.session for entry in entries if entry.ended is None]
        await asyncio.gather(*(_close(session) for session in live))

    # -- bookkeeping -------------------------------------------------------------------

    def _check_enabled(self) -> None:
        if self._service.settings.max_sessions_per_client == 0:
            raise RequestRejected(
                "sessions are turned off on this server (max_sessions_per_client=0)",
                status=403,
            )

    async def _entry(self, session_id: str, client: str) -> _Entry:
        """The live session ``session_id`` of ``client``, or the 404/410 that says why not."""
        self._check_enabled()
        self._prune()
        entry = self._entries.get(session_id)
        if entry is None or entry.client != client:
            raise _not_found()
        if entry.ended is None and entry.session.lost is not None and not entry.busy:
            await self._end(entry)  # it died between calls (e.g. its container went away)
        if entry.ended is not None:
            raise self._gone(entry)
        return entry

    def _prune(self) -> None:
        """Note sessions the sandbox closed when idle; forget ended ones after an hour."""
        now = time.monotonic()
        for entry in self._entries.values():
            if entry.ended is None and entry.session.closed:
                entry.ended = entry.session.lost or "it was closed"
                entry.status = 404
                entry.ended_at = now
                self.expired += 1
        ended = [
            (entry.ended_at, session_id)
            for session_id, entry in self._entries.items()
            if entry.ended is not None
        ]
        ended.sort()
        surplus = max(0, len(ended) - MAX_ENDED)
        for index, (ended_at, session_id) in enumerate(ended):
            if index < surplus or now - ended_at > ENDED_RETENTION:
                del self._entries[session_id]

    def _live(self, client: str) -> int:
        return sum(
            1 for entry in self._entries.values() if entry.client == client and entry.ended is None
        )

    @contextlib.contextmanager
    def _reservation(self, client: str) -> Iterator[None]:
        """Count a session being opened against ``client``'s cap (429 past it)."""
        self._prune()
        cap = self._service.settings.max_sessions_per_client
        held = self._live(client) + self._pending[client]
        if held >= cap:
            raise RequestRejected(
                f"this client already holds {held} open sessions, the most it may "
                f"(max_sessions_per_client={cap}); delete one first",
                status=429,
            )
        with self._held(client):
            yield

    @contextlib.contextmanager
    def _held(self, client: str) -> Iterator[None]:
        """Count one interpreter against ``client``'s cap that is not in its entries.

        A session being opened or forked, and a deleted one until it is closed: closing
        waits for a running cell to end (up to its timeout), and a client that deleted
        its busy sessions held its cap free while their cells still ran (sixth red-team
        round).
        """
        self._pending[client] += 1
        try:
            yield
        finally:
            self._pending[client] -= 1
            if self._pending[client] <= 0:
                del self._pending[client]

    @staticmethod
    @contextlib.contextmanager
    def _busy(entry: _Entry) -> Iterator[None]:
        if entry.busy:
            raise RequestRejected(
                "a cell or fork is already running in this session; a session runs one at "
                "a time (wait for that answer, or fork first to work in parallel)",
                status=409,
            )
        entry.busy = True
        try:
            yield
        finally:
            entry.busy = False

    async def _to_the_end(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` to its end even if the request that asked for it is cancelled.

        A close cut short would leave the session marked closed (released from the
        sandbox's count) while its interpreter and container lived on.
        """
        task = asyncio.ensure_future(work)
        self._finishing.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._finishing.discard)
        await asyncio.shield(task)

    async def _close_held(self, client: str, session: Session) -> None:
        with self._held(client):
            await _close(session)

    async def _hand_over(
        self, client: str, session: Session, gone: Disconnected | None
    ) -> SessionCreated:
        """``session`` under a new id, unless its client left while it was made: nobody
        could name it, and it held a container and the client's cap until its idle time
        ran out (red team, the thirty-sixth round)."""
        if gone is not None and await _left(gone):
            await self._to_the_end(_close(session))
            raise ClientGone("the client disconnected while its session was made")
        return self._add(client, session)

    def _add(self, client: str, session: Session) -> SessionCreated:
        session_id = secrets.token_urlsafe(ID_BYTES)
        while session_id in self._entries:  # pragma: no cover - 192 random bits
            session_id = secrets.token_urlsafe(ID_BYTES)
        self._entries[session_id] = _Entry(client, session)
        self.opened += 1
        return SessionCreated(session_id=session_id, ttl=self.ttl)

    async def _end(self, entry: _Entry) -> None:
        """The interpreter is gone: remember why and release what it held.

        Lost on its own: 410. Already closed, which only the sandbox does behind the
        server's back (idle past ``session_ttl`` while its cell waited for a slot, say):
        expired, 404.
        """
        if entry.ended is None:
            expired = entry.session.closed
            entry.ended = entry.session.lost or "the session ended"
            entry.status = 404 if expired else 410
            entry.ended_at = time.monotonic()
            if expired:
                self.expired += 1
            else:
                self.lost += 1
        await _close(entry.session)

    def _gone(self, entry: _Entry) -> RequestRejected:
        if entry.status == 404:
            return _not_found(f"this session was closed: {entry.ended}")
        return RequestRejected(
            f"this session is gone: {entry.ended}; its state is lost (open a new session)",
            status=410,
        )

    async def _sandbox_call(self, call: Awaitable[Session]) -> Session:
        """Open or fork; the sandbox's refusals as HTTP answers (SessionLostError passes)."""
        sandbox = self._service.sandbox
        try:
            return await call
        except SessionLostError:
            raise
        except SessionsUnsupportedError as exc:
            raise RequestRejected(str(exc), status=501) from exc
        except SessionLimitError as exc:
            raise _unavailable(
                f"the server holds all the sessions it may ({sandbox.max_sessions}, all "
                "clients together); retry later"
            ) from exc
        except SandboxClosedError as exc:
            raise _shutting_down() from exc
        except SessionError as exc:  # e.g. a fork that failed while its parent lives on
            raise _unavailable(str(exc)) from exc
        except ConfigError as exc:
            raise RequestRejected(str(exc)) from exc
        except Exception as exc:
            log.exception("a session could not be opened or forked")
            raise _unavailable(f"the sandbox failed: {type(exc).__name__}: {exc}") from exc

    def _answer(self, result: ExecResult, lost: str | None, timeout: float) -> SessionRunResponse:
        service = self._service
        run_result = service._command(result)
        chars = service.settings.output_chars
        cell = result.cells[0] if result.cells else None
        display = [
            entry
            for item in (cell.display if cell else [])
            if (entry := display_entry(item, chars)) is not None
        ]
        errors = [error_entry(item, chars) for item in (cell.error if cell else [])]
        notes = [outcome_message(result)]
        if result.timed_out and lost is None:
            notes.append(
                f"the cell ran longer than its {timeout:g} s limit and was interrupted; "
                "the session keeps its state"
            )
        if lost is not None and result.outcome is not Outcome.SANDBOX_ERROR:
            notes.append(f"session lost: {lost}")
        return SessionRunResponse(
            status=run_status(run_result),
            message="; ".join(note for note in notes if note),
            run_result=run_result,
            display=display,
            error=errors,
            session_lost=lost is not None,
        )


def _not_found(detail: str = "") -> RequestRejected:
    return RequestRejected(
        detail
        or "no such session: unknown, deleted, or closed after it was idle longer than its ttl",
        status=404,
    )


def _unavailable(detail: str) -> RequestRejected:
    return RequestRejected(detail, status=503, headers=dict(_RETRY))


def _shutting_down() -> RequestRejected:
    """504, as every request the server answers while it stops (``shutdown.py``; it was
    503 here, which verl does not retry)."""
    return RequestRejected(
        "the server is shutting down: this session ends with it; open a new one (another "
        "server, or this one once it is back)",
        status=504,
        headers=dict(_RETRY),
    )


async def _left(gone: Disconnected) -> bool:
    """Whether the client has gone, asked twice: uvicorn stops reading a connection once
    its request is in, so the first question only lets it read on (and see an end that
    came meanwhile), and the second, ``LOOK_AGAIN`` later, sees that end."""
    if await gone():
        return True
    await asyncio.sleep(LOOK_AGAIN)
    return await gone()


async def _close(session: Session) -> None:
    try:
        await session.aclose()
    except Exception:  # the sandbox may be closing too; nothing is left to release then
        log.warning("closing a session failed", exc_info=True)
