"""Stateful sessions: one interpreter kept between calls, and forked in milliseconds.

    with sandbox.session() as session:
        session.run_code("import sympy as sp; x = sp.symbols('x')")
        branch = session.fork()               # a copy of the state, now
        session.run_code("print(sp.solve(x**2 - 2, x))")
        branch.run_code("print(x + 1)")       # unaffected by the other branch

A session is a backend's ``SessionHandle`` seen through the Sandbox: the
same ExecResult, stats and ``format_tool_content``, sync and async methods,
and the Sandbox's limits (``max_sessions`` open at once, ``session_ttl``
seconds idle). A session that ended (killed after a timeout, OOM, exited,
idle past its TTL, its container lost) raises ``SessionLostError``; it is
never replaced by a fresh interpreter behind the caller's back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType
from typing import TYPE_CHECKING, Self

from retool_exec._errors import SandboxClosedError, SessionLostError
from retool_exec._formatting import MAX_OUTPUT_CHARS, within
from retool_exec._models import ExecResult
from retool_exec.backends.base import SessionHandle

if TYPE_CHECKING:
    from retool_exec._sandbox import Sandbox

__all__ = ["Session"]


class Session:
    """One interpreter of a Sandbox's backend; see the module docstring."""

    def __init__(self, sandbox: Sandbox, handle: SessionHandle) -> None:
        self._sandbox = sandbox
        self._handle = handle
        self._closed = False
        self._lock = asyncio.Lock()
        self.last_used = time.monotonic()
        self.cells = 0

    # -- running cells -------------------------------------------------------

    def run_code(self, code: str, *, timeout: float | None = None) -> ExecResult:
        """Run one cell and wait for its result (any thread)."""
        return self._sandbox._call_in_loop(self.arun_code_in_loop(code, timeout))

    async def arun_code(self, code: str, *, timeout: float | None = None) -> ExecResult:
        """Run one cell without blocking the caller's event loop."""
        return await self._sandbox._acall_in_loop(self.arun_code_in_loop(code, timeout))

    async def arun_code_in_loop(self, code: str, timeout: float | None) -> ExecResult:
        submitted = time.perf_counter()
        prepared = self._sandbox._prepare(code, submitted, timeout, auto_print=False)
        if isinstance(prepared, ExecResult):
            return prepared
        async with self._lock:  # one cell at a time per interpreter
            self._check_usable()
            self.last_used = time.monotonic()
            result = await self._handle.run(prepared.code, prepared.timeout)
            self.last_used = time.monotonic()
            self.cells += 1
        result = result.model_copy(
            update={"latency": time.perf_counter() - submitted, "timeout": prepared.timeout}
        )
        self._sandbox.stats.record(result)
        return result

    def format_tool_content(self, result: ExecResult) -> str:
        """The observation for ``result``: as ``Sandbox.format_tool_content``, and for a cell
        that succeeded, its stdout followed by the value of its final expression (as a
        notebook shows ``Out[n]``, bounded: ``value_text``), so a model sees ``x * 7``
        without a print."""
        shown = self.value_text(result)
        if result.ok and shown:
            result = result.model_copy(update={"stdout": f"{result.stdout}{shown}\n"})
        return self._sandbox.format_tool_content(result)

    def value_text(self, result: ExecResult) -> str:
        """The value of the cell's final expression as text ("" when none), bounded like a
        stream: at most the backend's ``max_output_chars``, its end after the seed's
        marker (``within``: a backend cuts a value so already; a cell ending in
        ``'A' * 10**6`` made a 69,665-character observation, the sixth red-team round, and
        keeping the head of a value cut so lost its last characters, the thirty-sixth)."""
        shown = "\n".join(
            str(item.get("text/plain", ""))
            for cell in result.cells
            for item in cell.display
            if isinstance(item, dict)
        )
        config = getattr(self._sandbox.backend, "config", None)
        limit = getattr(config, "max_output_chars", MAX_OUTPUT_CHARS)
        return within(shown, limit)

    # -- branching -------------------------------------------------------------

    def fork(self) -> Session:
        """A new, independent session whose state is a copy of this one's now."""
        return self._sandbox._call_in_loop(
            self.afork_in_loop(), "fork()", abandoned=close_abandoned
        )

    async def afork(self) -> Session:
        """Async ``fork``; a copy made for a caller that gave up is closed."""
        return await self._sandbox._acall_in_loop(self.afork_in_loop(), abandoned=close_abandoned)

    async def afork_in_loop(self) -> Session:
        async with self._lock:
            self._check_usable()
            self._sandbox._reserve_session()
            try:
                handle = await self._handle.fork()
            except BaseException:
                self._sandbox._release_session(None)
                raise
            self.last_used = time.monotonic()
        return self._sandbox._adopt_session(handle)

    # -- lifecycle ---------------------------------------------------------------

    @property
    def lost(self) -> str | None:
        """Why the interpreter is gone (None while it lives)."""
        if self._closed and self._handle.lost is None:
            return "the session was closed"
        return self._handle.lost

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """End the interpreter. Idempotent; the Sandbox closes what is left open (so
        closing a session of a closed Sandbox, even one closing now, does nothing)."""
        if not self._closed:
            with contextlib.suppress(SandboxClosedError):
                self._sandbox._call_in_loop(self.aclose_in_loop())

    async def aclose(self) -> None:
        """Async ``close``."""
        if not self._closed:
            with contextlib.suppress(SandboxClosedError):
                # Shielded: handed over, the close runs to its end however soon its
                # caller gives up (cancelled before its first step, it never began).
                await self._sandbox._acall_in_loop(self.aclose_in_loop(), shielded=True)

    def _close_soon(self) -> None:
        """Hand the close over to the sandbox's loop now, without waiting for it: for a
        caller that must not be cut short between forgetting a session and closing it."""
        if self._closed:
            return
        with contextlib.suppress(RuntimeError):  # the sandbox's loop stopped: it closed all
            self._sandbox._ensure_portal().submit(self.aclose_in_loop())

    async def aclose_in_loop(self, reason: str | None = None) -> None:
        """End the interpreter. A close that has begun runs to its end even if its caller
        gives up (``asyncio.wait_for``, Ctrl-C, an MCP cancel): cut short, it left the
        session released from ``max_sessions`` while its container lived on until the
        Sandbox closed (the twelfth red-team round). A caller that gives up returns at
        once; the session still counts until its interpreter is gone."""
        if self._closed:
            return
        self._closed = True
        if reason and self._handle.lost is None:
            self._handle.lost = reason  # before closing: the handle keeps the first reason
        await self._sandbox._to_the_end(self._end())

    async def _end(self) -> None:
        try:
            await self._handle.close()
        finally:
            self._sandbox._release_session(self)

    def _check_usable(self) -> None:
        if self._handle.lost is not None:
            raise SessionLostError(f"this session is gone: {self._handle.lost}")
        if self._closed:
            raise SessionLostError("this session was closed")

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
        state = f"lost: {self.lost}" if self.lost else f"{self.cells} cells"
        return f"Session({self._sandbox.backend.name}, {state})"


async def close_abandoned(session: Session) -> None:
    """Close a session whose caller gave up before it was handed over (run on the
    sandbox's loop: ``LoopThread.run_from_other_loop``)."""
    await session.aclose_in_loop("its caller gave up before it was handed over")
