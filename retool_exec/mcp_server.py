"""An MCP server over a Sandbox, so desktop and IDE agents can run Python in it.

    sandbox = Sandbox(backend="docker")          # started on the first call, not here
    server = SandboxTools(sandbox).server()      # an ``mcp.server.mcpserver.MCPServer``
    ...                                          # serve it (``retool-exec mcp`` does), then
    sandbox.close()

Built with the official ``mcp`` SDK (the ``[mcp]`` extra). Tools:

=================  ===========================================================
``run_python``     code, optional timeout: one program in a fresh interpreter
``session_open``   a stateful interpreter: its ``session_id``
``session_run``    session_id, code, optional timeout: one cell in it
``session_fork``   session_id: a new session holding a copy of its state
``session_close``  session_id: end it
=================  ===========================================================

A run answers the model-facing text of ``format_tool_content`` (a session
cell's shows the value of its final expression, as a notebook does) and the
structured fields ``outcome``, ``stdout``, ``stderr``, ``returncode`` and
``timed_out``. What the code did (an exception, a timeout, running out of
memory) is an answer, not a tool error; ``isError`` is set when the tool
itself could not do its job: bad arguments, an unknown or lost session, the
session cap, a backend that cannot start, the sandbox failing during a call.
No error stops the server.

Sessions are the Sandbox's (``retool_exec._session``): its ``max_sessions``
is the server's cap (forks included) and its ``session_ttl`` closes a
session left idle. Ids are random (``secrets.token_urlsafe``), so over HTTP
one client cannot guess another's.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from retool_exec._errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    RetoolExecError,
    SandboxClosedError,
    SessionLimitError,
    SessionLostError,
)
from retool_exec._formatting import sanitize_tool_content
from retool_exec._models import ExecResult, Outcome
from retool_exec._sandbox import Sandbox
from retool_exec._session import Session
from retool_exec._text import utf8_safe
from retool_exec.backends.registry import backend_spec

__all__ = [
    "DEFAULT_MAX_TIMEOUT",
    "SERVER_NAME",
    "TOOL_NAMES",
    "RunOutput",
    "SandboxTools",
    "SessionClosed",
    "SessionOpened",
    "SessionRunOutput",
]

log = logging.getLogger("retool_exec.mcp")

SERVER_NAME = "retool-exec"
TOOL_NAMES = ("run_python", "session_open", "session_run", "session_fork", "session_close")
DEFAULT_MAX_TIMEOUT = 300.0
"""The largest ``timeout`` a tool call may ask for, in seconds."""
ID_BYTES = 12
"""Random bytes in a session id (16 characters)."""
_KEEP_ENDED = 256
"""Ids of sessions the sandbox ended (idle, lost) that still answer why, not just 'unknown'."""


class RunOutput(BaseModel):
    """What the program did."""

    outcome: Literal[
        "success", "error", "timeout", "oom", "cpu_limit", "signal", "sandbox_error", "rejected"
    ] = Field(description="what happened: success, error (exit status not 0), timeout, oom, ...")
    stdout: str = Field(description="standard output (its tail, if long)")
    stderr: str = Field(description="standard error, tracebacks included (its tail, if long)")
    returncode: int | None = Field(description="exit status; negative for a signal; null if killed")
    timed_out: bool = Field(description="killed because the time limit passed")


class SessionRunOutput(RunOutput):
    """What the cell did, and whether the session's interpreter survived it."""

    session_id: str
    value: str | None = Field(
        default=None, description="repr() of the cell's last expression, if it had one"
    )
    session_lost: str | None = Field(
        default=None,
        description="why the interpreter ended in this cell (its state is gone); null if it lives",
    )


class SessionOpened(BaseModel):
    """A new session."""

    session_id: str = Field(description="pass it to session_run, session_fork, session_close")
    ttl_seconds: float = Field(description="the session is closed after this long unused")


class SessionClosed(BaseModel):
    """A closed session."""

    session_id: str
    closed: bool


class ToolFailure(Exception):
    """A tool could not do its job; the message is what the model reads (``isError``)."""


def _failure(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


class SandboxTools:
    """The tools over one Sandbox; :meth:`server` registers them on an ``MCPServer``.

    The Sandbox is the caller's: it starts on the first call that needs it
    (so a Docker daemon that is down is a tool error, not a start-up failure)
    and the caller closes it on shutdown, which ends every session.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        max_timeout: float = DEFAULT_MAX_TIMEOUT,
        sessions: bool = True,
    ) -> None:
        if not max_timeout > 0:
            raise ValueError(f"max_timeout must be positive, got {max_timeout}")
        self.sandbox = sandbox
        self.max_timeout = float(max_timeout)
        self.sessions_enabled = sessions
        self._sessions: dict[str, Session] = {}
        self._ended: dict[str, str] = {}

    # -- the MCP server --------------------------------------------------------

    def server(self, *, name: str = SERVER_NAME, log_level: str = "WARNING") -> MCPServer:
        """A new ``MCPServer`` with these tools (serve it over stdio or streamable HTTP)."""
        from retool_exec import __version__

        level: Any = log_level.upper()
        server: MCPServer = MCPServer(
            name,
            version=__version__,
            instructions=self._instructions(),
            log_level=level,
        )
        closed_world = self._isolated() is True
        server.add_tool(
            self.run_python,
            name="run_python",
            title="Run Python",
            description=self._run_description(),
            annotations=ToolAnnotations(
                read_only_hint=False,
                destructive_hint=not closed_world,
                idempotent_hint=False,
                open_world_hint=not closed_world,
            ),
        )
        if self.sessions_enabled:
            session_annotations = ToolAnnotations(
                destructive_hint=not closed_world, open_world_hint=not closed_world
            )
            server.add_tool(
                self.session_open,
                name="session_open",
                title="Open a Python session",
                description=(
                    "Start a persistent Python interpreter and return its session_id. Variables, "
                    "imports and files persist between session_run calls on it (like notebook "
                    f"cells). At most {self.sandbox.max_sessions} sessions (forks included) are "
                    f"open at once; one unused for {self.sandbox.session_ttl:.0f} s is closed. "
                    "Close sessions you no longer need with session_close."
                ),
                annotations=session_annotations,
            )
            server.add_tool(
                self.session_run,
                name="session_run",
                title="Run Python in a session",
                description=(
                    "Run a cell of Python in an open session (see session_open): it sees what "
                    "earlier cells defined. Returns what it printed and, as a notebook does, the "
                    "value of its last expression. " + self._limits()
                ),
                annotations=session_annotations,
            )
            server.add_tool(
                self.session_fork,
                name="session_fork",
                title="Fork a Python session",
                description=(
                    "Copy a session's current state (variables, imports, files) into a new, "
                    "independent session and return its session_id: try something in the copy "
                    "without changing the original."
                ),
                annotations=session_annotations,
            )
            server.add_tool(
                self.session_close,
                name="session_close",
                title="Close a Python session",
                description="End a session and free its interpreter; its state is discarded.",
                annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True),
            )
        return server

    # -- the tools -------------------------------------------------------------

    async def run_python(
        self,
        code: Annotated[str, Field(description="the Python program to run")],
        timeout: Annotated[
            float | None,
            Field(description="wall-clock seconds before it is killed (default: the server's)"),
        ] = None,
    ) -> Annotated[CallToolResult, RunOutput]:
        """Run ``code`` in a fresh interpreter (nothing persists between calls)."""

        async def run() -> CallToolResult:
            result = await self.sandbox.arun_code(code, timeout=self._timeout(timeout))
            text = self.sandbox.format_tool_content(result)
            return self._answer(result, text, self._run_output(result))

        return await self._guard("run_python", run)

    async def session_open(self) -> Annotated[CallToolResult, SessionOpened]:
        """Open a session."""

        async def open_() -> CallToolResult:
            session = await self.sandbox.aopen_session()
            return self._opened(session)

        return await self._guard("session_open", open_)

    async def session_run(
        self,
        session_id: Annotated[str, Field(description="from session_open or session_fork")],
        code: Annotated[str, Field(description="the Python cell to run")],
        timeout: Annotated[
            float | None,
            Field(description="wall-clock seconds before it is stopped (default: the server's)"),
        ] = None,
    ) -> Annotated[CallToolResult, SessionRunOutput]:
        """Run one cell in a session."""

        async def run() -> CallToolResult:
            session = self._session(session_id)
            limit = self._timeout(timeout)
            try:
                result = await session.arun_code(code, timeout=limit)
            except SessionLostError as exc:
                raise self._gone(session_id, session, exc) from exc
            lost = session.lost
            shown = session.value_text(result)
            output = SessionRunOutput(
                **self._run_output(result).model_dump(),
                session_id=session_id,
                value=sanitize_tool_content(shown, self.sandbox.markers) if shown else None,
                session_lost=lost,
            )
            answer = self._answer(result, session.format_tool_content(result), output)
            if lost is None and result.timed_out:
                answer.content.append(
                    TextContent(
                        type="text",
                        text=(
                            f"[the cell was interrupted; session {session_id} and what earlier "
                            "cells defined are kept]"
                        ),
                    )
                )
            elif lost is not None:
                self._forget(session_id, lost)
                answer.content.append(
                    TextContent(
                        type="text",
                        text=(
                            f"[session {session_id} ended: {lost}; its state is lost. "
                            "Open a new one with session_open.]"
                        ),
                    )
                )
            return answer

        return await self._guard("session_run", run)

    async def session_fork(
        self,
        session_id: Annotated[str, Field(description="the session to copy")],
    ) -> Annotated[CallToolResult, SessionOpened]:
        """Fork a session."""

        async def fork() -> CallToolResult:
            session = self._session(session_id)
            try:
                branch = await session.afork()
            except SessionLostError as exc:
                raise self._gone(session_id, session, exc) from exc
            return self._opened(branch)

        return await self._guard("session_fork", fork)

    async def session_close(
        self,
        session_id: Annotated[str, Field(description="the session to end")],
    ) -> Annotated[CallToolResult, SessionClosed]:
        """Close a session (a session the sandbox already ended is closed too)."""

        async def close() -> CallToolResult:
            session = self._sessions.pop(session_id, None)
            if session is None:
                if self._ended.pop(session_id, None) is None:
                    raise ToolFailure(self._unknown(session_id))
            else:
                await session.aclose()
            output = SessionClosed(session_id=session_id, closed=True)
            return CallToolResult(
                content=[TextContent(type="text", text=f"session {session_id} closed")],
                structured_content=output.model_dump(mode="json"),
            )

        return await self._guard("session_close", close)

    @property
    def open_sessions(self) -> int:
        """Sessions opened through these tools and not yet closed (forks included)."""
        return sum(1 for session in self._sessions.values() if not session.closed)

    # -- internals ---------------------------------------------------------------

    async def _guard(
        self, tool: str, work: Callable[[], Awaitable[CallToolResult]]
    ) -> CallToolResult:
        """Run a tool's work; every failure becomes a result with ``isError``, in one line,
        its chat-template markers neutralized as in every answer: a failure's text can be
        the session's code's own (a fork's reason: the twenty-eighth red-team round)."""
        try:
            return await work()
        except ToolFailure as exc:
            message = f"Error: {exc}"
        except SessionLimitError as exc:
            message = (
                f"Error: {_one_line(exc)}. Close sessions you no longer need with session_close."
            )
        except BackendUnavailableError as exc:
            message = f"Error: the sandbox cannot start: {_one_line(exc)}"
        except SandboxClosedError:
            message = "Error: the server is shutting down"
        except RetoolExecError as exc:  # bad timeout, sessions unsupported, ...
            message = f"Error: {_one_line(exc)}"
        except Exception as exc:
            log.exception("%s failed", tool)
            message = f"Error: {tool} failed inside retool-exec: {_one_line(exc)}"
        # (A lone surrogate cannot cross a UTF-8 transport: over stdio the SDK's writer
        # failed on one and the server exited. The review of the twenty-eighth round.)
        return _failure(sanitize_tool_content(str(utf8_safe(message)), self.sandbox.markers))

    def _timeout(self, timeout: float | None) -> float | None:
        if timeout is not None and timeout > self.max_timeout:
            raise ToolFailure(
                f"timeout {timeout:g} s is more than this server allows ({self.max_timeout:g} s)"
            )
        return timeout

    def _run_output(self, result: ExecResult) -> RunOutput:
        markers = self.sandbox.markers
        return RunOutput(
            outcome=result.outcome.value,
            stdout=sanitize_tool_content(result.stdout, markers),
            stderr=sanitize_tool_content(result.stderr, markers),
            returncode=result.returncode,
            timed_out=result.timed_out,
        )

    @staticmethod
    def _answer(result: ExecResult, text: str, output: BaseModel) -> CallToolResult:
        """The text and the fields; ``isError`` only when the sandbox itself failed."""
        failed = result.outcome is Outcome.SANDBOX_ERROR
        if failed and result.detail:
            log.warning("sandbox error: %s", result.detail)
        return CallToolResult(
            content=[TextContent(type="text", text=text)],
            structured_content=None if failed else output.model_dump(mode="json"),
            is_error=failed,
        )

    def _opened(self, session: Session) -> CallToolResult:
        for known, other in list(self._sessions.items()):
            if other.closed:  # the sandbox ended it (idle past its TTL, lost)
                self._forget(known, other.lost or "it was closed")
        session_id = secrets.token_urlsafe(ID_BYTES)
        self._sessions[session_id] = session
        output = SessionOpened(session_id=session_id, ttl_seconds=self.sandbox.session_ttl)
        return CallToolResult(
            content=[TextContent(type="text", text=f"session_id: {session_id}")],
            structured_content=output.model_dump(mode="json"),
        )

    def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            ended = self._ended.get(session_id)
            if ended is not None:
                raise ToolFailure(self._gone_text(session_id, ended))
            raise ToolFailure(self._unknown(session_id))
        if session.closed:  # closed by the sandbox: idle past its TTL, or lost
            reason = session.lost or "it was closed"
            self._forget(session_id, reason)
            raise ToolFailure(self._gone_text(session_id, reason))
        return session

    def _gone(self, session_id: str, session: Session, exc: SessionLostError) -> ToolFailure:
        reason = session.lost or _one_line(exc)
        self._forget(session_id, reason)
        return ToolFailure(self._gone_text(session_id, reason))

    def _forget(self, session_id: str, reason: str) -> None:
        """Drop an ended session, keeping why it ended for the next call that names it."""
        self._sessions.pop(session_id, None)
        self._ended[session_id] = reason
        while len(self._ended) > _KEEP_ENDED:
            del self._ended[next(iter(self._ended))]

    @staticmethod
    def _gone_text(session_id: str, reason: str) -> str:
        return (
            f"session {session_id} is gone: {reason}; its state is lost. "
            "Open a new one with session_open."
        )

    def _unknown(self, session_id: str) -> str:
        return (
            f"no open session {session_id!r} (unknown or already closed); "
            "open one with session_open"
        )

    def _isolated(self) -> bool | None:
        """Whether the backend contains the code (None: a backend the table does not know)."""
        try:
            return backend_spec(self.sandbox.backend.name).isolating
        except BackendNotFoundError:
            return None

    def _limits(self) -> str:
        return (
            f"It is stopped after {self.sandbox.timeout:g} s unless you pass timeout "
            f"(at most {self.max_timeout:g})."
        )

    def _where(self) -> str:
        isolated = self._isolated()
        if isolated is True:
            return "in an isolated sandbox (no network; memory and time limits)"
        if isolated is False:
            return "in a local Python subprocess on the server's machine (NOT isolated)"
        return f"on the {self.sandbox.backend.name} backend"

    def _run_description(self) -> str:
        shown = (
            "what it printed; the value of a final expression is printed for you"
            if self.sandbox.auto_print
            else "what it printed (print() what you want to see)"
        )
        return (
            f"Run a Python 3 program {self._where()} and return {shown}, or the traceback "
            "if it failed. Each call starts from scratch: nothing persists between calls"
            + (" (use the session tools for that)" if self.sessions_enabled else "")
            + ". "
            + self._limits()
        )

    def _instructions(self) -> str:
        text = f"Runs Python {self._where()}. run_python runs one self-contained program."
        if self.sessions_enabled:
            text += (
                " For work in steps, session_open starts an interpreter that keeps its state "
                "between session_run calls; session_fork copies one; session_close ends it."
            )
        return text
