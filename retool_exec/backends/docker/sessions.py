"""Docker sessions: a session family (a session and its forks) owns one container.

Opening a session takes a warm container out of the pool (the pool starts a
replacement), asks its agent to start a session interpreter, and keeps the
container for the family's lifetime. ``fork()`` forks the interpreter inside
the same container: copy-on-write takes milliseconds, and an interpreter's
state (objects, open files, imported C extensions) cannot be moved to another
container at all. The cost is that the family shares the container's memory
and process limits, and its cells run one at a time (one frame stream). When
the last session of a family closes, the container is destroyed; a family
whose container fails loses every session in it, explicitly.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from retool_exec._errors import SessionError, SessionLostError
from retool_exec._models import ExecResult, Outcome
from retool_exec._output import read_cap_bytes
from retool_exec.backends.base import SessionHandle
from retool_exec.backends.docker import frame_limit
from retool_exec.backends.docker.backend import (
    LATE_PROBE,
    TASK_LIMIT_KILLED,
    CallProgress,
    agent_outcome,
    stream_stalled,
    streams,
    task_limit_count,
    task_limit_reached,
)
from retool_exec.backends.docker.containers import SandboxContainer
from retool_exec.backends.docker.protocol import ProtocolError

if TYPE_CHECKING:
    from retool_exec.backends.docker.backend import DockerBackend

__all__ = ["DockerSession", "SessionFamily"]

log = logging.getLogger(__name__)

START_BUDGET = 10.0
"""Seconds the host waits for a session (or a fork) to start: the agent's 5 s, and margin."""
INTERRUPT_GRACE = 1.0
STREAM_KEYS = ("stdout", "stdout_dropped", "stderr", "stderr_dropped")
"""The agent's grace between KeyboardInterrupt and killing a cell's session."""


class SessionFamily:
    """One container and the sessions that live in it."""

    def __init__(self, backend: DockerBackend, container: SandboxContainer) -> None:
        self.backend = backend
        self.container = container
        self.sessions: set[int] = set()
        self.lost: str | None = None
        self.oom = False
        """Whether the family's container was killed for memory during the request that
        lost it (Docker's OOM events since that request was sent)."""
        self.over_tasks = False
        """Whether the request that lost the family ended with gVisor's kernel dead of the
        container's pids limit, which the family's processes reached (``TaskLimitHits``)."""
        self.held_up = False
        """Whether the request that lost the family was a cell whose agent was silent past
        its deadline in a container its code kept busy (``_note_loss``)."""
        self._lock = asyncio.Lock()
        self._sids = itertools.count(1)

    def new_sid(self) -> int:
        return next(self._sids)

    async def request(
        self,
        frame: dict[str, Any],
        reply_type: str,
        timeout: float,
        *,
        note_cpu_after: float | None = None,
        settle: Callable[[dict[str, Any] | None], object] | None = None,
    ) -> dict[str, Any]:
        """Send one authenticated frame and wait for its answer; a failure loses the family.

        The exchange runs as a task of its own, shielded from its caller: a caller that
        gives up (``asyncio.wait_for``, Ctrl-C around ``run_code``, an MCP client's
        cancel) leaves it to finish, so the agent's answer is always read and the stream
        stays in step. Cancelled with its caller, it left the answer for the family's next
        request, which took it for a broken stream and lost every session of the family
        as ``sandbox_error`` after ~7 s (the sixth red-team round).

        ``note_cpu_after``: seconds after the hand-over at which, the agent still silent,
        the container's CPU is noted, so that silence at the deadline can be told apart:
        a cell that kept its container busy, or an agent that failed (``held_up``).

        ``settle``: what the answer (None: the exchange failed) does to the sessions, run
        when the exchange ends whether or not its caller still waits. Done after the
        caller's await, it was skipped for a caller that gave up: a session the agent
        had ended was still taken for alive, its next cell read the agent's "no such
        session" as killed by a signal, and a fork's copy lived on unclosed until the
        agent ran out of descriptors (thirty-first round).
        """
        # The family's turn is waited for here, where the caller may still give up: a cell
        # whose caller was cancelled while an earlier cell ran had its exchange started
        # (shielded) all the same, and ran later, unseen by anyone, changing the state
        # the next cells saw (red team D, the thirty-sixth round). Once it is our turn the
        # exchange owns it, and hands it on when it ends, started or not.
        await self._lock.acquire()
        try:
            exchange = asyncio.ensure_future(
                self._exchange(frame, reply_type, timeout, note_cpu_after)
            )
        except BaseException:
            self._lock.release()
            raise
        exchange.add_done_callback(lambda _done: self._lock.release())
        exchange.add_done_callback(_retrieved)  # its failure, if nobody awaits it any more
        if settle is not None:  # (before the shield's own callback: settled before resuming)
            exchange.add_done_callback(lambda done: settle(_answer(done)))
        return await asyncio.shield(exchange)

    async def _exchange(
        self, frame: dict[str, Any], reply_type: str, timeout: float, note_cpu_after: float | None
    ) -> dict[str, Any]:
        """(Run under the family's turn, which ``request`` took for it.)"""
        if self.lost is not None:
            raise SessionLostError(f"this session is gone: {self.lost}")
        container = self.container
        container.next_id += 1
        call_id = container.next_id
        container.nonce = secrets.token_hex(16)
        await self.backend.await_oom_events_due(container)
        oom_before = self.backend.container_oom_count(container)
        progress = CallProgress()
        progress.tasks_before = task_limit_count(container)
        try:
            await container.channel.send({**frame, "id": call_id, "nonce": container.nonce})
            taken = time.monotonic()
            deadline = taken + timeout
            late = None if note_cpu_after is None else taken + note_cpu_after
            reply = await self.backend.receive_noting_cpu(
                container, progress, until=deadline, late=late, ask_silence=late is not None
            )
            authentic = reply.get("id") == call_id and hmac.compare_digest(
                str(reply.get("nonce")), container.nonce
            )
            if authentic and reply.get("type") == reply_type:
                self.backend.note_oom_kills(container, reply, oom_before)
                return reply
            if authentic and reply.get("type") == "error":
                raise ProtocolError(f"the agent failed: {str(reply.get('reason'))[:300]}")
            raise ProtocolError(f"unexpected frame from the agent: {reply.get('type')!r}")
        except (TimeoutError, ProtocolError) as exc:
            if self.backend.closing:
                self.lost = self.lost or "the sandbox was closed"
            elif self.lost is None:  # else the family was ended on purpose meanwhile
                cell = note_cpu_after is not None
                await self._note_loss(
                    container, exc, oom_before, progress, timeout=timeout, cell=cell
                )
            self.backend.end_session_container_soon(container)
            raise

    async def _note_loss(
        self,
        container: SandboxContainer,
        exc: Exception,
        oom_before: int | None,
        progress: CallProgress,
        *,
        timeout: float,
        cell: bool,
    ) -> None:
        """Why the family's container is lost: killed for memory, kept busy past the
        deadline by the family's code (``held_up``), or failed.

        A silent agent's container still running (``progress.silence``, asked as the wait
        ended; a stopped one is judged as a stream that ended): Docker's OOM count is read
        as it is (``container_oom_killed`` waits up to 6 s for a container to stop, which a
        silent one never does: a cell came back 6 s past its deadline), and asked
        whether it was busy, as a call's is (``DockerBackend._silent_past_deadline``):
        four fork bombs in cells of four families under gVisor, each to its limit,
        kept their agents silent past the grace and came back as the sandbox's failure
        (thirty-first round)."""
        if isinstance(exc, TimeoutError) and progress.silence != "stopped":
            self.oom = self.backend.oom_counted_since(container, oom_before)
            self.held_up = (  # asked as the wait ended (``receive_noting_cpu``)
                cell
                and not self.oom
                and progress.in_transit_until is None
                and progress.silence == "busy"
            )
        else:  # its stream ended, or its container stopped before the end came through
            self.over_tasks = task_limit_reached(container, progress, progress.tasks_before)
            self.oom = await self.backend.container_oom_killed(container, oom_before)
        if self.over_tasks and not self.oom:
            self.lost = TASK_LIMIT_KILLED
        elif self.oom:
            self.lost = "the session's container ran out of memory and was killed"
        elif isinstance(exc, TimeoutError) and progress.in_transit_until is not None:
            self.lost = stream_stalled()
        elif self.held_up:
            self.lost = (
                f"the session's agent was silent past the deadline ({timeout:.1f}s), held up "
                "by the cell (or failing during it): its output is lost, the container was "
                "killed"
            )
        else:
            why = str(exc) or (
                f"its agent was silent past the deadline ({timeout:.1f}s), the container "
                "idle, paused or stopped"
            )
            self.lost = f"the session's container failed: {why}"

    def forget(self, sid: int) -> None:
        """A session the agent reported gone; the family ends with its last session (its
        container removed in the background: the cell's result does not wait for it)."""
        self.sessions.discard(sid)
        if not self.sessions and self.lost is None:
            self.lost = "the session family ended"
            self.backend.end_session_container_soon(self.container)

    async def close_session(self, sid: int) -> None:
        """Close one session: the agent ends its interpreter, after a cell still running
        in the family (the stream carries one exchange at a time); the family's last
        session takes the container with it. ``Sandbox.close`` does not wait for such
        a cell: the backend's close ends the container under it."""
        self.sessions.discard(sid)
        if self.lost is None:
            with contextlib.suppress(TimeoutError, ProtocolError, SessionLostError):
                await self.request({"type": "session_close", "sid": sid}, "session", 10.0)
        if not self.sessions and self.lost is None:
            self.lost = "the session family ended"
            await self.backend.destroy_session_container(self.container)


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Take a finished exchange's exception (already recorded as the family's loss)."""
    if not task.cancelled():
        task.exception()


def _answer(exchange: asyncio.Future[dict[str, Any]]) -> dict[str, Any] | None:
    """A finished exchange's answer; None if it failed or was cancelled."""
    if exchange.cancelled() or exchange.exception() is not None:
        return None
    return exchange.result()


class DockerSession(SessionHandle):
    """One interpreter of a family (see the module docstring)."""

    def __init__(self, family: SessionFamily, sid: int, *, name: str) -> None:
        self.family = family
        self.sid = sid
        self.name = name
        family.sessions.add(sid)

    @classmethod
    async def open(
        cls, backend: DockerBackend, container: SandboxContainer, memory_mb: int | None
    ) -> DockerSession:
        family = SessionFamily(backend, container)
        sid = family.new_sid()
        frame: dict[str, Any] = {"type": "session_open", "sid": sid}
        if memory_mb is not None:
            frame["memory_mb"] = min(memory_mb, backend.config.memory_mb)
        try:
            reply = await family.request(frame, "session", START_BUDGET)
        except (TimeoutError, ProtocolError) as exc:
            raise SessionLostError(f"the session could not start: {family.lost or exc}") from exc
        if not reply.get("ok"):
            await backend.destroy_session_container(container)
            raise SessionLostError(f"the session could not start: {reply.get('reason')}")
        return cls(family, sid, name=backend.name)

    @property
    def lost(self) -> str | None:
        if self.sid in self.family.sessions:
            return self._lost or self.family.lost
        return self._lost or self.family.lost or "the session was closed"

    @lost.setter
    def lost(self, reason: str | None) -> None:
        self._lost = reason

    _lost: str | None = None

    async def run(self, code: str, timeout: float) -> ExecResult:
        started = time.perf_counter()
        if self.lost is not None:
            raise SessionLostError(f"this session is gone: {self.lost}")
        config = self.family.backend.config
        frame = {
            "type": "session_cell",
            "sid": self.sid,
            "code": code,
            "timeout": timeout,
            "read_cap": read_cap_bytes(config.max_output_chars),
            "text_cap": config.max_output_chars,  # a value's and an error's (``wire.cut_tail``)
        }
        bound = frame_limit.ASCII_JSON_BYTES_PER_CHAR * len(code) + frame_limit.FIELD_OVERHEAD * 8
        too_large = frame_limit.encoded_size_if_too_large(frame, bound)
        if too_large is not None:  # the cell's own outcome; the session stays as it was
            return frame_limit.rejected(too_large, self.name, time.perf_counter() - started)
        after_interrupt = timeout + INTERRUPT_GRACE
        try:
            reply = await self.family.request(
                frame,
                "result",
                after_interrupt + config.host_grace,
                note_cpu_after=after_interrupt + min(LATE_PROBE, config.host_grace / 4),
                settle=self._settle_cell,
            )
        except (TimeoutError, ProtocolError) as exc:
            lost = self._lost or self.family.lost or str(exc)  # a close's reason first
            backend = self.family.backend
            if self.family.oom:
                return backend._container_oom(started, 0.0, f"session lost: {lost}")
            if self.family.over_tasks:
                return backend._task_limit_killed(started, 0.0, f"session lost: {lost}")
            if self.family.held_up:
                detail = f"session lost: {lost}"
                return backend._without_output(Outcome.TIMEOUT, None, True, started, 0.0, detail)
            return ExecResult.sandbox_failure(
                f"session lost: {lost}", backend=self.name, latency=time.perf_counter() - started
            )
        return self._result(reply, started)

    def _settle_cell(self, reply: dict[str, Any] | None) -> None:
        """A cell's end for the session (``SessionFamily.request``'s ``settle``): lost
        with its family's container, or with the agent's word that it is gone."""
        if reply is None:
            self.family.sessions.discard(self.sid)
        elif reply.get("lost"):
            self._lost = self._lost or str(reply["lost"])
            self.family.forget(self.sid)

    def _result(self, reply: dict[str, Any], started: float) -> ExecResult:
        backend = self.family.backend
        stdout, stdout_dropped, stderr, stderr_dropped = streams(
            reply, backend.config.max_output_chars
        )
        lost = reply.get("lost")
        timed_out = bool(reply.get("timed_out"))
        raw = reply.get("returncode")
        returncode = None if timed_out or raw is None else int(raw)
        oom = bool(reply.get("oom"))
        if lost and returncode is None and not timed_out and not oom:
            returncode = -9  # the agent kills every lost session; its status not yet known
        outcome = agent_outcome(reply, returncode, timed_out)
        # A session cell's streams are the frame's own; the cell record adds how it ended.
        own = {key: reply.get(key) for key in STREAM_KEYS}
        cells = [
            backend._cell({**cell, **own}, backend.config.max_output_chars)
            for cell in reply.get("cells") or []
        ]
        return ExecResult(
            ok=outcome is Outcome.SUCCESS,
            stdout=stdout,
            stderr=stderr,
            returncode=returncode,
            timed_out=timed_out,
            latency=time.perf_counter() - started,
            outcome=outcome,
            stdout_dropped_chars=stdout_dropped,
            stderr_dropped_chars=stderr_dropped,
            backend=self.name,
            detail=f"session lost: {lost}" if lost else "",
            cells=cells,
        )

    async def fork(self) -> DockerSession:
        if self.lost is not None:
            raise SessionLostError(f"this session is gone: {self.lost}")
        new_sid = self.family.new_sid()
        answers: list[dict[str, Any] | None] = []
        waiting = True  # whether this call still waits for the copy (else it is closed)

        def close_copy() -> None:
            copy = answers[0] if answers else None
            if copy is not None and copy.get("ok") and not copy.get("parent_lost"):
                self.family.backend.end_soon(self.family.close_session(new_sid))

        def settle(reply: dict[str, Any] | None) -> None:
            answers.append(reply)
            if reply is not None and reply.get("parent_lost"):
                self.lost = str(reply.get("reason"))
            elif not waiting:
                close_copy()

        try:
            reply = await self.family.request(
                {"type": "session_fork", "sid": self.sid, "new_sid": new_sid},
                "session",
                START_BUDGET,
                settle=settle,
            )
        except asyncio.CancelledError:  # the copy is closed once made (or now, if it is)
            waiting = False
            close_copy()
            raise
        except (TimeoutError, ProtocolError) as exc:
            raise SessionLostError(f"this session is gone: {self.family.lost or exc}") from exc
        if reply.get("parent_lost"):  # e.g. its code left a frame unread: killed (settled)
            raise SessionLostError(f"this session is gone: {self.lost}")
        if not reply.get("ok"):  # the parent lives on: only the copy failed
            reason = str(reply.get("reason"))
            said = "the fork failed: "  # (the agent's reason may say it already)
            raise SessionError(reason if reason.startswith(said) else said + reason)
        return DockerSession(self.family, new_sid, name=self.name)

    async def close(self) -> None:
        if self.sid in self.family.sessions:
            await self.family.close_session(self.sid)
