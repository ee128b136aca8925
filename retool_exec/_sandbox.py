"""The Sandbox facade: the seed's LocalPythonSandbox API over any backend.

    sandbox = Sandbox(backend="docker", timeout=30.0, max_workers=8)
    results = await asyncio.gather(*(sandbox.arun_code(c) for c in codes))
    text = sandbox.format_tool_content(results[0])
    metrics.update(sandbox.stats.metrics())

The backend lives on the sandbox's own event loop (see ``_portal``), so the
same object works from sync code, from one event loop, or from a new
``asyncio.run()`` every training step. Once a backend that allows it has
started (``Backend.runs_on_any_loop``: the Docker backend), ``arun_code``
runs the call on the caller's own loop instead, and the calls of every loop
share one ``max_workers`` limit (``_handoff.Slots``). ``latency`` is measured from the
moment a call is submitted, so it includes waiting for a slot, as in the seed.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from retool_exec._errors import (
    ConfigError,
    SandboxClosedError,
    SandboxForkedError,
    SessionLimitError,
)
from retool_exec._formatting import format_tool_content, resolve_markers
from retool_exec._handoff import Slots
from retool_exec._models import ExecResult, Outcome, not_returned
from retool_exec._portal import LoopThread
from retool_exec._session import Session, close_abandoned
from retool_exec._stats import SandboxStats
from retool_exec._text import utf8_safe
from retool_exec.backends.base import Backend, RunRequest, SessionHandle, exact_bytes
from retool_exec.backends.config import BackendConfigBase, LocalConfig
from retool_exec.backends.registry import resolve_backend

__all__ = ["DEFAULT_MAX_CODE_CHARS", "LocalPythonSandbox", "Sandbox"]

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_MAX_CODE_CHARS = 16 * 1024 * 1024
"""Code longer than this is rejected with an explicit result instead of run."""

_MAX_TIMEOUT = 24 * 3600.0
DEFAULT_MAX_SESSIONS = 64
"""Sessions a Sandbox keeps open at once (each Docker session family holds a container)."""
DEFAULT_SESSION_TTL = 600.0
"""Seconds a session may stay idle before it is closed (its next use raises SessionLostError)."""
DEFAULT_MAX_WORKERS = 8
"""The seed's default concurrency, for backends without a fixed capacity."""


CLOSE_PATIENCE = 1.0
"""Seconds ``Sandbox.close`` lets its sessions close on their own before closing the backend
under them (a polite close takes milliseconds; one waiting behind a running cell ends then)."""

_CLOSED_UNDER_THE_CALL = "the sandbox was closed while the call ran"
"""A call in flight on another thread when ``close()`` stopped the sandbox's loop: an
explicit error, not a CancelledError its caller never asked for."""


class Sandbox:
    """Runs model-written code on a backend and keeps the seed's stats and formatting."""

    def __init__(
        self,
        backend: str | BackendConfigBase | Backend = "local",
        *,
        timeout: float | None = None,
        max_workers: int | None = None,
        auto_print: bool = False,
        markers: Mapping[str, str] | Iterable[str] | None = None,  # see resolve_markers
        max_code_chars: int = DEFAULT_MAX_CODE_CHARS,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        session_ttl: float = DEFAULT_SESSION_TTL,
    ) -> None:
        _check_timeout(timeout)
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 0:
            raise ConfigError(f"max_sessions must be an integer >= 0, got {max_sessions!r}")
        if (
            isinstance(session_ttl, bool)
            or not isinstance(session_ttl, int | float)
            or not (0 < session_ttl <= _MAX_TIMEOUT)
        ):
            raise ConfigError(f"session_ttl must be in (0, {_MAX_TIMEOUT:.0f}] s: {session_ttl}")
        if max_workers is not None:
            _check_count("max_workers", max_workers)
        _check_count("max_code_chars", max_code_chars)
        self.backend, self.timeout = resolve_backend(backend, timeout=timeout)
        capacity = self.backend.capacity
        if max_workers is None:  # as many as the backend runs at once (the seed's 8 if unbounded)
            max_workers = capacity if capacity is not None else DEFAULT_MAX_WORKERS
        self.max_workers = max_workers
        if capacity is not None and max_workers > capacity:
            log.warning(
                "max_workers=%d is more than the %s backend runs at once (%d); "
                "the other calls queue (raise pool_size to run them together)",
                max_workers,
                self.backend.name,
                capacity,
            )
        self.auto_print = auto_print
        self.markers = resolve_markers(markers) if markers is not None else None
        self.max_code_chars = max_code_chars
        self.stats = SandboxStats()
        self._lock = threading.RLock()  # (reentrant: see ``LoopThread._gate``)
        self._portal: LoopThread | None = None
        self._slots: Slots | None = None
        self._start_lock: asyncio.Lock | None = None
        self._started = False
        self._closed = False
        self._owner_pid = os.getpid()
        self.max_sessions = max_sessions
        self.session_ttl = float(session_ttl)
        self._sessions: set[Session] = set()
        self._session_reservations = 0
        self._reaper: asyncio.Task[None] | None = None
        self._finishing: set[asyncio.Task[None]] = set()  # closes whose callers gave up
        _open_sandboxes.add(self)

    # -- the seed's API ----------------------------------------------------

    def run_code(
        self,
        code: str,
        *,
        timeout: float | None = None,
        memory_mb: int | None = None,
        stdin: str | bytes | None = None,
        files: Mapping[str, str | bytes] | None = None,
        fetch: Iterable[str] = (),
        script: str | None = None,
    ) -> ExecResult:
        """Run ``code`` and wait for its result (from any thread).

        ``timeout`` overrides the sandbox's limit for this call only;
        ``memory_mb`` asks for a smaller memory cap where the backend supports one.
        ``stdin`` is what the code reads from stdin; ``files`` are written into
        its working directory first and ``fetch`` names files read back after
        it ends (``ExecResult.files``). The backend handles all three outside
        the code's process: nothing the code prints can change them.
        ``script`` runs the code as ``python SCRIPT`` would (``__file__`` and
        ``sys.argv[0]`` name that file in the working directory).
        """
        submitted = time.perf_counter()
        request_or_result = self._prepare(
            code,
            submitted,
            timeout,
            memory_mb,
            stdin=stdin,
            files=files,
            fetch=fetch,
            script=script,
        )
        if isinstance(request_or_result, ExecResult):
            return request_or_result
        return self._call_in_loop(self._run(request_or_result, submitted), "run_code()")

    async def arun_code(
        self,
        code: str,
        *,
        timeout: float | None = None,
        memory_mb: int | None = None,
        stdin: str | bytes | None = None,
        files: Mapping[str, str | bytes] | None = None,
        fetch: Iterable[str] = (),
        script: str | None = None,
    ) -> ExecResult:
        """Run ``code`` without blocking the caller's event loop (any loop, any thread)."""
        submitted = time.perf_counter()
        request_or_result = self._prepare(
            code,
            submitted,
            timeout,
            memory_mb,
            stdin=stdin,
            files=files,
            fetch=fetch,
            script=script,
        )
        if isinstance(request_or_result, ExecResult):
            return request_or_result
        if self._runs_here():
            return await self._run(request_or_result, submitted)
        return await self._acall_in_loop(self._run(request_or_result, submitted))

    def format_tool_content(self, result: ExecResult) -> str:
        """The observation for ``result``: the timeout it ran under, this sandbox's markers."""
        timeout = result.timeout if result.timeout is not None else self.timeout
        return format_tool_content(result, timeout=timeout, markers=self.markers)

    # -- batches -------------------------------------------------------------

    def run_many(
        self,
        codes: Iterable[str],
        *,
        timeout: float | None = None,
        memory_mb: int | None = None,
    ) -> list[ExecResult]:
        """Run every code, at most ``max_workers`` at once; results in input order."""
        codes = _code_list(codes)
        return self._call_in_loop(self._gather(codes, timeout, memory_mb), "run_many()")

    async def arun_many(
        self,
        codes: Iterable[str],
        *,
        timeout: float | None = None,
        memory_mb: int | None = None,
    ) -> list[ExecResult]:
        """Async ``run_many``."""
        codes = _code_list(codes)
        if self._runs_here():
            return await self._gather(codes, timeout, memory_mb)
        return await self._acall_in_loop(self._gather(codes, timeout, memory_mb))

    # -- sessions ----------------------------------------------------------------

    def session(self, *, memory_mb: int | None = None) -> SessionContext:
        """A stateful session, as a context manager (``with`` or ``async with``).

        Globals, imported modules and files in the working directory persist
        between its cells; ``fork()`` copies them. See ``retool_exec._session``.
        """
        return SessionContext(self, memory_mb)

    def open_session(self, *, memory_mb: int | None = None) -> Session:
        """A stateful session to close yourself (or leave to ``close()`` of the Sandbox)."""
        return self._call_in_loop(
            self._open_session_in_loop(memory_mb), "open_session()", abandoned=close_abandoned
        )

    async def aopen_session(self, *, memory_mb: int | None = None) -> Session:
        """Async ``open_session``. A session opened for a caller that gave up (cancelled)
        before it was handed over is closed."""
        return await self._acall_in_loop(
            self._open_session_in_loop(memory_mb), abandoned=close_abandoned
        )

    @property
    def open_sessions(self) -> int:
        """Sessions open now (forks included)."""
        return len(self._sessions)

    async def _open_session_in_loop(self, memory_mb: int | None) -> Session:
        if memory_mb is not None and (
            isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 1
        ):
            raise ConfigError(f"memory_mb must be an integer of at least 1, got {memory_mb!r}")
        await self._ensure_started()
        self._reserve_session()
        try:
            handle = await self.backend.open_session(memory_mb=memory_mb)
        except BaseException:
            self._release_session(None)
            raise
        return self._adopt_session(handle)

    def _reserve_session(self) -> None:
        if self._closed:
            raise SandboxClosedError("this sandbox is closed")
        if self.max_sessions == 0:
            raise SessionLimitError("sessions are off for this Sandbox (max_sessions=0)")
        if len(self._sessions) + self._session_reservations >= self.max_sessions:
            raise SessionLimitError(
                f"this Sandbox already holds {self.max_sessions} open sessions (max_sessions); "
                "close some first"
            )
        self._session_reservations += 1

    def _adopt_session(self, handle: SessionHandle) -> Session:
        self._session_reservations -= 1
        session = Session(self, handle)
        self._sessions.add(session)
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap_idle_sessions())
        return session

    def _release_session(self, session: Session | None) -> None:
        if session is None:
            self._session_reservations -= 1
        else:
            self._sessions.discard(session)

    async def _reap_idle_sessions(self) -> None:
        """Close sessions idle longer than ``session_ttl`` (checked a few times per TTL).

        Each close runs on its own: one waits for its family's running cell (a Docker
        family's stream carries one exchange at a time), and awaited in turn it held the
        closing of every other idle session for that cell's time (red team D, the
        thirty-sixth round)."""
        reaping: set[Session] = set()
        while self._sessions:
            await asyncio.sleep(min(5.0, self.session_ttl / 4))
            now = time.monotonic()
            reason = f"it was idle for more than {self.session_ttl:.0f} s (session_ttl)"
            for session in list(self._sessions):
                idle = now - session.last_used > self.session_ttl
                if idle and not session._lock.locked() and session not in reaping:
                    reaping.add(session)
                    task = asyncio.ensure_future(session.aclose_in_loop(reason))
                    self._finishing.add(task)  # (the loop keeps a weak reference only)
                    task.add_done_callback(self._finishing.discard)
                    task.add_done_callback(functools.partial(_forget, reaping, session))

    async def _close_everything(self) -> None:
        """Close the sessions, then the backend. A session's close may wait for a cell
        still running in its family (a Docker session's stream carries one exchange at a
        time): after ``CLOSE_PATIENCE`` the backend closes under it, which ends that
        cell as lost, and the close with it (a 20 s cell once held close() for 20 s)."""
        closing = asyncio.ensure_future(self._close_sessions("the sandbox was closed"))
        await asyncio.wait([closing], timeout=CLOSE_PATIENCE)
        try:
            await self.backend.close()
        finally:
            await closing

    async def _close_sessions(self, reason: str) -> None:
        """Close every session at once (one waiting behind a running cell of its family
        must not hold up the others, whose closes may end that family), and wait for
        closes still running after their callers gave up."""
        closing = [session.aclose_in_loop(reason) for session in list(self._sessions)]
        outcomes = await asyncio.gather(*closing, return_exceptions=True)
        while pending := [task for task in self._finishing if not task.done()]:
            await asyncio.wait(pending)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome  # the first failure, once every close has ended

    async def _to_the_end(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` on this loop to its end even if the caller is cancelled."""
        task = asyncio.ensure_future(work)
        self._finishing.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._finishing.discard)
        await asyncio.shield(task)

    def _call_in_loop(
        self,
        coro: Coroutine[Any, Any, T],
        what: str = "a blocking method",
        *,
        abandoned: Callable[[T], Coroutine[Any, Any, object]] | None = None,
    ) -> T:
        """Run ``coro`` on the sandbox's loop and wait for it (from any other thread).

        ``abandoned``: what to do with the result of a call whose caller gave up (Ctrl-C
        in ``open_session()``): the call then runs to its end and its result goes there.
        A session made as the interrupt landed was dropped, still open, counted against
        ``max_sessions`` and holding its container (red team D, the thirty-sixth round).
        The interrupt can land anywhere here, ``submit`` included, so the result is
        claimed under a lock by whichever side comes second (``_Claim``).
        """
        try:
            portal = self._ensure_portal()
        except BaseException:
            coro.close()
            raise
        if portal.in_loop_thread:
            coro.close()
            raise RuntimeError(f"{what} was called from the sandbox's own event loop")
        claim = None if abandoned is None else _Claim(abandoned)
        work = coro if claim is None else claim.run(coro)
        try:
            try:
                future = portal.submit(work)
            except RuntimeError:  # the loop stopped: closed (by a signal handler of this thread)
                work.close()
                if self._closed:
                    raise SandboxClosedError(_CLOSED_UNDER_THE_CALL) from None
                raise
            try:
                return future.result()
            except concurrent.futures.CancelledError:
                if self._closed:  # close() stopped the loop under the call, not its caller
                    raise SandboxClosedError(_CLOSED_UNDER_THE_CALL) from None
                raise
            except BaseException:
                if claim is None:
                    future.cancel()
                raise
        except BaseException:
            if claim is not None:
                claim.give_up(portal)
            raise

    def _runs_here(self) -> bool:
        """Whether a call may run on the caller's own event loop (the backend is started and
        allows it); else it is handed to the sandbox's loop.

        Run there, the call's stream is read by that loop: a caller whose loop is blocked
        (a long synchronous step) keeps its container until it reads the result. The
        backend still enforces the call's time limit, and the caller could not have
        used the result sooner.
        """
        return (
            self._started
            and not self._closed
            and os.getpid() == self._owner_pid
            and self.backend.runs_on_any_loop
        )

    async def _acall_in_loop(
        self,
        coro: Coroutine[Any, Any, T],
        *,
        shielded: bool = False,
        abandoned: Callable[[T], Coroutine[Any, Any, object]] | None = None,
    ) -> T:
        """Run ``coro`` on the sandbox's loop without blocking the caller's loop
        (``shielded`` and ``abandoned``: ``LoopThread.run_from_other_loop``)."""
        try:
            portal = self._ensure_portal()
        except BaseException:
            coro.close()  # never awaited: no "coroutine was never awaited" warning
            raise
        if portal.in_loop_thread:
            return await coro
        try:
            return await portal.run_from_other_loop(coro, shielded=shielded, abandoned=abandoned)
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if self._closed and caller is not None and not caller.cancelling():
                raise SandboxClosedError(_CLOSED_UNDER_THE_CALL) from None
            raise

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Start the backend now (warm containers) instead of on the first call.

        A ``close()`` meanwhile raises ``SandboxClosedError``, as for a call (it was a bare
        ``CancelledError``: thirty-third red-team round)."""
        self._call_in_loop(self._ensure_started(), "start()")

    async def astart(self) -> None:
        """Async ``start``."""
        await self._acall_in_loop(self._ensure_started())

    def close(self) -> None:
        """Close the backend (removing its processes/containers) and stop the loop. Idempotent."""
        if os.getpid() != self._owner_pid:
            self._closed = True  # a fork's copy: the parent owns the loop and the containers
            _open_sandboxes.discard(self)
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            portal, self._portal = self._portal, None
        _open_sandboxes.discard(self)
        if portal is None:
            return
        try:
            if not portal.in_loop_thread:
                portal.submit(self._close_everything()).result()
        finally:
            portal.stop()

    async def aclose(self) -> None:
        """Async ``close``."""
        await asyncio.to_thread(self.close)

    @property
    def concurrency(self) -> int:
        """Calls run at once: ``max_workers``, or the backend's capacity if that is smaller.

        Waiting for a free container is queueing, not a failure: calls beyond the
        backend's capacity (a Docker pool's ``pool_size``) wait here, and the
        wait shows in ``ExecResult.queue_wait``.
        """
        capacity = self.backend.capacity
        return self.max_workers if capacity is None else min(self.max_workers, capacity)

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(backend={self.backend.name!r}, timeout={self.timeout}, "
            f"max_workers={self.max_workers})"
        )

    # -- internals ---------------------------------------------------------------

    def _prepare(
        self,
        code: object,
        submitted: float,
        timeout: float | None = None,
        memory_mb: int | None = None,
        *,
        stdin: str | bytes | None = None,
        files: Mapping[str, str | bytes] | None = None,
        fetch: Iterable[str] = (),
        script: str | None = None,
        auto_print: bool | None = None,
    ) -> RunRequest | ExecResult:
        """Validate input in the caller's thread: a bad type raises, bad content is a result.

        ``auto_print`` overrides the sandbox's (a session cell displays its last
        expression itself, so it never rewrites the code).
        """
        if not isinstance(code, str):
            raise TypeError(f"code must be str, not {type(code).__name__}")
        # Its own text, as an exact str: a subclass's ``__len__`` said 1 and got a 12 MiB
        # program past ``max_code_chars`` and the frame's size check, to the sandbox's
        # failure (thirty-third red-team round). No method of the caller's object runs.
        code = str.__str__(code)
        if isinstance(fetch, str):
            raise TypeError("fetch must be an iterable of paths, not one string")
        if files is not None and not isinstance(files, Mapping):
            raise TypeError(
                f"files must be a mapping of path to content, not {type(files).__name__}"
            )
        _check_timeout(timeout)
        if memory_mb is not None and (
            isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 1
        ):
            raise ConfigError(f"memory_mb must be an integer of at least 1, got {memory_mb!r}")
        if self._closed:
            raise SandboxClosedError("this sandbox is closed")
        if len(code) > self.max_code_chars:
            result = ExecResult(
                ok=False,
                stdout="",
                stderr=(
                    f"Error: the code is {len(code)} characters long; "
                    f"the limit is {self.max_code_chars}."
                ),
                returncode=None,
                timed_out=False,
                latency=time.perf_counter() - submitted,
                outcome=Outcome.REJECTED,
                backend=self.backend.name,
                detail="code too large",
            )
            self.stats.record(result)
            return result
        try:
            return RunRequest(
                code=code,
                auto_print=self.auto_print if auto_print is None else auto_print,
                timeout=self.timeout if timeout is None else timeout,
                memory_mb=memory_mb,
                stdin=_as_bytes(stdin, "stdin") if stdin is not None else None,
                files={
                    path: _as_bytes(data, "files", path) for path, data in (files or {}).items()
                },
                fetch=_paths(fetch),
                script=script,
            )
        except ValueError as exc:
            raise ConfigError(f"bad call input: {exc}") from exc

    def __reduce__(self) -> Any:
        """A Sandbox holds threads, sockets and containers: pickling one (to send it to a
        worker process) said only "cannot pickle '_thread.lock'"."""
        raise TypeError(
            "a Sandbox cannot be pickled: pickle the config it was built from (a "
            "DockerConfig or LocalConfig pickles) and build a Sandbox from it in each worker"
        )

    def _ensure_portal(self) -> LoopThread:
        if os.getpid() != self._owner_pid:
            raise SandboxForkedError(
                f"this Sandbox was created in process {self._owner_pid} and cannot be used "
                f"after fork() (this is process {os.getpid()}): create a new Sandbox in each "
                "worker, e.g. from its config (configs pickle), or use the 'spawn' start method"
            )
        with self._lock:
            if self._closed:
                raise SandboxClosedError("this sandbox is closed")
            if self._portal is None:
                portal = LoopThread(name=f"retool-exec-{self.backend.name}")
                if self._closed:  # by a signal handler of this thread, as the loop started
                    portal.stop()
                    raise SandboxClosedError("this sandbox is closed")
                self._portal = portal
            return self._portal

    async def _ensure_started(self) -> None:
        if self._started:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if not self._started:
                await self.backend.start()
                self._started = True

    async def _run(self, request: RunRequest, submitted: float) -> ExecResult:
        slots = self._slots
        if slots is None:
            with self._lock:
                if self._slots is None:
                    self._slots = Slots(self.concurrency)
                slots = self._slots
        async with slots.hold():
            if self._closed:  # while it waited for a slot (on a loop of its caller's)
                raise SandboxClosedError("this sandbox was closed while the call waited")
            await self._ensure_started()
            # The sandbox's own start (its first containers) is waiting too, not running.
            slot_wait = time.perf_counter() - submitted
            result = await self.backend.run(request)
        if self._closed and result.outcome is Outcome.SANDBOX_ERROR:
            # close() removed its container under it: the caller's doing, said as for a call
            # still queued, not an infrastructure failure in the stats (red team D).
            raise SandboxClosedError(_CLOSED_UNDER_THE_CALL)
        update: dict[str, Any] = {
            "latency": time.perf_counter() - submitted,
            "queue_wait": slot_wait + result.queue_wait,
            "timeout": request.timeout,
        }
        files, errors = _by_spelling(request, result)
        unnamed = [path for path, _ in request.fetch_asked if path not in files]
        unnamed = [path for path in unnamed if path not in errors]
        if unnamed:  # every file asked for is returned or named with a reason (fetch_errors)
            errors = {**errors, **dict.fromkeys(unnamed, not_returned(result))}
        if files is not result.files:
            update["files"] = files
        if errors is not result.fetch_errors:
            update["fetch_errors"] = errors
        result = result.model_copy(update=update)
        self.stats.record(result)
        return result

    async def _gather(
        self, codes: list[str], timeout: float | None, memory_mb: int | None
    ) -> list[ExecResult]:
        submitted = time.perf_counter()
        prepared = [self._prepare(code, submitted, timeout, memory_mb) for code in codes]

        async def one(item: RunRequest | ExecResult) -> ExecResult:
            if isinstance(item, ExecResult):
                return item
            return await self._run(item, submitted)

        return list(await asyncio.gather(*(one(item) for item in prepared)))


class LocalPythonSandbox(Sandbox):
    """Drop-in for the seed's class: same constructor, local subprocess backend.

    NOT a security boundary (see ``retool_exec.backends.local``).
    """

    def __init__(
        self, timeout: float = 30.0, max_workers: int = 8, python: str = sys.executable
    ) -> None:
        super().__init__(
            LocalConfig(python=python, timeout=timeout), timeout=timeout, max_workers=max_workers
        )
        self.python = python


def _forget(reaping: set[Session], session: Session, _done: object) -> None:
    reaping.discard(session)


class _Claim(Generic[T]):
    """The result of a call whose synchronous caller may give up at any moment: the side
    that comes second (the call ending, or its caller giving up) hands it to
    ``abandoned`` if the caller gave up, under one lock, so no moment between them loses
    it (``Sandbox._call_in_loop``)."""

    def __init__(self, abandoned: Callable[[T], Coroutine[Any, Any, object]]) -> None:
        self._abandoned = abandoned
        self._lock = threading.Lock()
        self._gave_up = False
        self._result: list[T] = []

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        result = await coro
        with self._lock:
            gave_up = self._gave_up
            self._result.append(result)
        if gave_up:
            await self._abandoned(result)
        return result

    def give_up(self, portal: LoopThread) -> None:
        with self._lock:
            self._gave_up = True
            result = self._result[:1]
        if result:
            coro = self._abandoned(result[0])
            try:
                portal.submit(coro)
            except RuntimeError:  # the loop is stopping: the sandbox's close ends it all
                coro.close()


def _check_count(name: str, value: object) -> None:
    """An int (not a bool) of at least 1, else a ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer of at least 1, got {value!r}")


def _check_timeout(timeout: object) -> None:
    """None, or a finite number of seconds in (0, 24 h]; NaN, inf and strings are refused."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ConfigError(f"timeout must be a number of seconds, got {timeout!r}")
    if not 0 < timeout <= _MAX_TIMEOUT:  # False for NaN too
        raise ConfigError(f"timeout must be in (0, {_MAX_TIMEOUT:.0f}] seconds, got {timeout}")


def _code_list(codes: Iterable[str]) -> list[str]:
    """``codes`` as a list; one string is refused (it would run each character)."""
    if isinstance(codes, str | bytes):
        raise TypeError("run_many() takes an iterable of code strings, not one string")
    return list(codes)


def _by_spelling(
    request: RunRequest, result: ExecResult
) -> tuple[dict[str, bytes], dict[str, str]]:
    """The result's fetched files and errors under the paths as the caller wrote them (the
    backend names them by their normal form); the result's own when every path was
    written in it. A file asked for in two spellings is under both, read once."""
    asked = request.fetch_asked
    if all(spelling == path and utf8_safe(path) == path for spelling, path in asked):
        return result.files, result.fetch_errors
    files: dict[str, bytes] = {}
    errors: dict[str, str] = {}
    for spelling, path in asked:
        # (``ExecResult`` keeps its reasons' keys UTF-8: a lone surrogate there is "?")
        reason = result.fetch_errors.get(path) or result.fetch_errors.get(str(utf8_safe(path)))
        if path in result.files:
            files[spelling] = result.files[path]
        elif reason is not None:
            errors[spelling] = reason
    return files, errors


def _as_bytes(data: object, what: str, key: object = None) -> bytes:
    """Text is sent as UTF-8 (lone surrogates kept, as Python's own file I/O would); the
    object's own content, never its methods (``exact_bytes``). ``what`` (and ``key``, a
    file's path) name the argument in the error: ``files['a.txt']``."""
    if isinstance(data, str):
        return str.encode(data, "utf-8", "surrogateescape")
    if isinstance(data, bytes | bytearray | memoryview):
        return exact_bytes(data)
    if isinstance(key, str):
        what = f"{what}[{str.__repr__(key)}]"  # (the str's own repr, none of a subclass's)
    raise TypeError(f"{what} must be str or bytes, not {type(data).__name__}")


def _paths(fetch: Iterable[str] | None) -> tuple[str, ...]:
    """``fetch`` as a tuple (its paths are checked by ``RunRequest``; None is none, as
    ``files=None`` is), or a TypeError that names it (``fetch=5`` said only "'int' object
    is not iterable")."""
    if fetch is None:
        return ()
    try:
        return tuple(fetch)
    except TypeError as exc:
        raise TypeError(f"fetch must be an iterable of paths, not {type(fetch).__name__}") from exc


class SessionContext:
    """What ``Sandbox.session()`` returns: opens on enter (sync or async), closes on exit."""

    def __init__(self, sandbox: Sandbox, memory_mb: int | None) -> None:
        self._sandbox = sandbox
        self._memory_mb = memory_mb
        self._session: Session | None = None

    def __enter__(self) -> Session:
        self._session = self._sandbox.open_session(memory_mb=self._memory_mb)
        return self._session

    def __exit__(self, *exc_info: object) -> None:
        if self._session is not None:
            self._session.close()

    async def __aenter__(self) -> Session:
        self._session = await self._sandbox.aopen_session(memory_mb=self._memory_mb)
        return self._session

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.aclose()


_open_sandboxes: set[Sandbox] = set()
"""Every sandbox not yet closed, held strongly: one dropped without ``close()`` stays open
(with its containers) until the interpreter exits, where ``_close_open_sandboxes`` closes
it. Why not close it when it is collected: a sandbox collected in a reference cycle had
its removal threads stopped by the collector first (they hold their pool weakly), and its
close then waited for ever, so the process never exited (twenty-fifth outside check)."""


@atexit.register
def _close_open_sandboxes() -> None:
    """At interpreter exit, close what the caller forgot to (containers must not leak).

    ``atexit`` runs after every non-daemon thread has ended, so a worker thread still
    calling the sandbox after the main thread returned keeps it open until then
    (closing earlier, from threading's shutdown, failed those calls). By then
    ``concurrent.futures`` has stopped its thread pools: the Docker removals run on
    the sandbox's own thread instead (``ContainerFactory._blocking``).
    """
    for sandbox in list(_open_sandboxes):
        try:
            sandbox.close()
        except Exception:
            log.exception("closing a sandbox left open at exit failed")
