"""Plugging a Sandbox into training frameworks that take tools as plain functions.

TRL's ``GRPOTrainer(tools=[...])`` (like ``transformers``' chat templates)
builds a tool's JSON schema from the function itself: its ``__name__``, its
type hints and a Google-style docstring with an ``Args:`` entry per
parameter. ``make_code_interpreter`` returns such a function, bound to your
sandbox, whose answer is exactly the observation the seed's training loop
gives the model (``sandbox.format_tool_content``).

Multi-turn tools keep one stateful session (``Sandbox.session()``) per
trajectory, so turn 3 sees what turn 1 defined:

- ``SessionCodeInterpreter`` / ``session_environment_factory``: TRL's
  ``environment_factory`` shape (one instance per rollout, ``reset()`` between).
- ``SessionCodeTool``: verl's tool class interface (``create``/``execute``/
  ``release`` with an instance id; the session follows verl's ``request_id``).
- ``run_branches`` / ``arun_branches``: run a shared prefix once, then N
  continuations, each in its own fork of that state.

For frameworks that call SandboxFusion over HTTP (verl, SkyRL), run
``retool-exec serve`` instead and change their URL; its ``/sessions``
endpoints give HTTP clients the same sessions. See ``docs/server.md``.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import functools
import importlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

from pydantic import BaseModel, Field

from retool_exec._errors import SessionLimitError, SessionLostError
from retool_exec._models import ExecResult, Outcome
from retool_exec._sandbox import Sandbox
from retool_exec._session import Session
from retool_exec.backends.registry import backend_config

__all__ = [
    "DEFAULT_TOOL_SCHEMA",
    "Branches",
    "SessionCodeInterpreter",
    "SessionCodeTool",
    "ToolResponse",
    "ToolSchema",
    "arun_branches",
    "make_async_code_interpreter",
    "make_code_interpreter",
    "run_branches",
    "session_environment_factory",
]

log = logging.getLogger(__name__)

# The model reads this (TRL turns it into the tool schema): it promises nothing a backend
# may not give, such as isolation (the local backend has none).
_DOC = """Run a Python program and return what it printed.

Every call starts from scratch: do not rely on variables, imports or files
from earlier calls; include everything the code needs. Use print() to see
values.

Args:
    code: A complete Python program to run.

Returns:
    The program's standard output; or its error message if it failed; or a
    note that it timed out.
"""


def make_code_interpreter(sandbox: Sandbox) -> Callable[[str], str]:
    """A TRL-style tool ``code_interpreter(code: str) -> str`` that runs on ``sandbox``.

    Safe to call from any thread (TRL calls tools synchronously); the sandbox
    stays yours to close.
    """

    def code_interpreter(code: str) -> str:
        return sandbox.format_tool_content(sandbox.run_code(code))

    code_interpreter.__doc__ = _DOC
    return code_interpreter


def make_async_code_interpreter(sandbox: Sandbox) -> Callable[[str], Awaitable[str]]:
    """The ``async`` twin of ``make_code_interpreter``, for async tool loops."""

    async def code_interpreter(code: str) -> str:
        return sandbox.format_tool_content(await sandbox.arun_code(code))

    code_interpreter.__doc__ = _DOC
    return code_interpreter


# -- multi-turn: one interpreter per trajectory ------------------------------------------

_SESSION_DOC = """Run Python code in this conversation's own interpreter and return its output.

The interpreter persists between calls, like a Jupyter notebook: variables,
functions, imports and files from earlier calls are still there. Use print()
to see values (the value of a final expression is shown too).

Args:
    code: Python code to run in the persistent interpreter.

Returns:
    What the code printed; or its error message if it failed; or a note that it
    timed out (the interpreter keeps its state) or that the interpreter ended
    (a new one starts without the earlier state).
"""


def _lost_note(reason: str) -> str:
    return (
        f"\n[the interpreter ended ({reason}); the next call starts a new one, without the "
        "variables, imports and files of earlier calls]"
    )


def _restarted_note(reason: str) -> str:
    return (
        f"\n[the interpreter of the earlier calls had ended ({reason}); this code ran in a "
        "new one, without their variables, imports and files]"
    )


class SessionCodeInterpreter:
    """One trajectory's interpreter as a tool: ``code_interpreter`` keeps its state.

        env = SessionCodeInterpreter(sandbox)
        env.code_interpreter("x = 6 * 7")
        env.code_interpreter("print(x)")        # '42'
        env.reset()                              # the trajectory ended: close its interpreter

    This is the shape of TRL's ``GRPOTrainer(environment_factory=...)``: the
    trainer makes one instance per rollout slot, calls ``reset()`` before each
    rollout and exposes every other public method as a tool, built from its
    name, type hints and docstring. So the only public methods are ``reset``
    and ``code_interpreter``; pass ``session_environment_factory(sandbox)``.
    Reward functions receive the instances, and can read ``results``.

    The session opens on the first call (a trajectory that never calls the tool
    costs nothing) and is closed by ``reset()`` or on leaving a ``with`` block.
    When the interpreter ends (a cell ignored its timeout, ran out of memory,
    exited), the observation says so and the next call opens a new session:
    never silently, since the model must know its state is gone.
    Sync (TRL calls tools from its own threads); the sandbox stays yours.
    """

    def __init__(
        self, sandbox: Sandbox, *, timeout: float | None = None, memory_mb: int | None = None
    ) -> None:
        self.sandbox = sandbox
        self.timeout = timeout
        """Seconds per cell (None: the sandbox's timeout)."""
        self.memory_mb = memory_mb
        self.session: Session | None = None
        """The trajectory's session while it is open."""
        self.results: list[ExecResult] = []
        """Every cell's result since the last ``reset()``, in order."""
        self.sessions_lost = 0
        """Interpreters that ended during a cell since the last ``reset()``."""

    def reset(self, **_kwargs: object) -> None:
        """Start a new trajectory: close the interpreter and forget the results.

        TRL passes the dataset row's fields as keyword arguments; they are ignored.
        """
        session, self.session = self.session, None
        self.results = []
        self.sessions_lost = 0
        if session is not None:
            session.close()

    def code_interpreter(self, code: str) -> str:
        ended = self.session.lost if self.session is not None else None  # e.g. idle too long
        if ended is not None and self.session is not None:
            self.session.close()
            self.session = None
            self.sessions_lost += 1
        if self.session is None:
            self.session = self.sandbox.open_session(memory_mb=self.memory_mb)
        session = self.session
        result = session.run_code(code, timeout=self.timeout)
        self.results.append(result)
        text = session.format_tool_content(result)
        if ended is not None:
            text += _restarted_note(ended)
        if session.lost is not None:
            text += _lost_note(session.lost)
            self.sessions_lost += 1
            self.session = None
            session.close()
        return text

    code_interpreter.__doc__ = _SESSION_DOC

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc_info: object) -> None:
        self.reset()


def session_environment_factory(
    sandbox: Sandbox, *, timeout: float | None = None, memory_mb: int | None = None
) -> Callable[[], SessionCodeInterpreter]:
    """``environment_factory`` for TRL's ``GRPOTrainer``: one interpreter per rollout.

        trainer = GRPOTrainer(..., environment_factory=session_environment_factory(sandbox))

    Each instance holds one session while its rollout runs (a Docker session
    holds a container): size the sandbox's ``max_sessions`` for the rollouts
    in flight.
    """

    def factory() -> SessionCodeInterpreter:
        return SessionCodeInterpreter(sandbox, timeout=timeout, memory_mb=memory_mb)

    return factory


# -- verl: a tool class --------------------------------------------------------------------

_TOOL_DESCRIPTION = (
    "Run Python code in a persistent interpreter of this conversation and return its "
    "output. Variables, imports and files from earlier calls are kept. Use print() to "
    "see values."
)

DEFAULT_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": _TOOL_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The Python code to run."},
            },
            "required": ["code"],
        },
    },
}
"""The OpenAI function schema ``SessionCodeTool`` uses when the tool config gives none."""

_TOOL_CONFIG_KEYS = frozenset(
    {"type", "backend", "backend_config", "timeout", "memory_mb", "max_sessions", "session_ttl"}
)


class ToolResponse(BaseModel):
    """verl's ``ToolResponse`` (text, image, video), used when verl is not installed."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None


class _FunctionSchema(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any] = Field(default_factory=dict)
    strict: bool = False


class ToolSchema(BaseModel):
    """verl's ``OpenAIFunctionToolSchema`` (type, function), used when verl is not installed."""

    type: str
    function: _FunctionSchema


@functools.cache
def _verl_class(module: str, name: str) -> type[Any] | None:
    """A class of verl's, or None when verl is not importable here."""
    try:
        found = getattr(importlib.import_module(module), name)
    except Exception:  # not installed, or its own imports (torch, ray) are missing
        return None
    return found if isinstance(found, type) else None


def _tool_response(text: str | None) -> Any:
    cls = _verl_class("verl.tools.schemas", "ToolResponse") or ToolResponse
    return cls(text=text)


def _tool_schema(schema: Mapping[str, Any]) -> Any:
    cls = _verl_class("verl.tools.schemas", "OpenAIFunctionToolSchema") or ToolSchema
    return cls.model_validate(dict(schema))


ENDED_KEPT = 4096
"""Trajectories whose session ended by itself that ``SessionCodeTool`` remembers (to tell
their next call why), the newest first; older ones get a new session without the note."""


class SessionCodeTool:
    """A verl tool (``verl.tools.base_tool.BaseTool``'s interface): one interpreter per trajectory.

    In verl's tool config (``actor_rollout_ref.rollout.multi_turn.tool_config_path``)::

        tools:
          - class_name: retool_exec.adapters.SessionCodeTool
            config: {type: native, backend: docker, timeout: 30,
                     backend_config: {pool_size: 8}, max_sessions: 256, session_ttl: 300}

    ``tool_schema`` may be left out (``DEFAULT_TOOL_SCHEMA``). verl's agent loop
    calls ``create``, ``execute`` and ``release`` around *every* tool call and
    passes its ``agent_data``, whose ``request_id`` names the trajectory: the
    session is kept per ``request_id``, so turn 3 sees what turn 1 defined, and
    it is closed by ``release_trajectory(request_id)``, ``aclose()``, or when it
    has been idle for ``session_ttl`` seconds (verl has no end-of-trajectory
    hook); at ``max_sessions`` the least recently used idle one is closed to
    make room (that trajectory's next call says its state is gone), and a call
    for which none is free is refused as ``sandbox_error``. A framework that
    creates one instance per trajectory and releases it at the end (verl's
    older SGLang rollout) gets a session per instance, closed by ``release``.
    verl's agent loop passes ``agent_data`` since 2025-12-09 (its PR 4469):
    with an older one every call gets a new interpreter, and the tool logs a
    warning once.

    The observation is ``Session.format_tool_content`` (the seed's, plus a final
    expression's value); an interpreter that ended says so, and the next call
    opens a new session. The sandbox is built from the config on first use
    (or pass ``sandbox=`` to share one); a deep copy (verl caches tool lists by
    deep-copying them) builds its own. Duck-typed: verl is not needed to import
    it; its ``ToolResponse``/``OpenAIFunctionToolSchema`` are used when present.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        tool_schema: Any = None,
        *,
        sandbox: Sandbox | None = None,
    ) -> None:
        self.config: dict[str, Any] = dict(config or {})
        unknown = sorted(set(self.config) - _TOOL_CONFIG_KEYS)
        if unknown:
            log.warning(
                "SessionCodeTool ignores config keys %s (it reads %s)",
                ", ".join(unknown),
                ", ".join(sorted(_TOOL_CONFIG_KEYS)),
            )
        self.tool_schema = tool_schema if tool_schema is not None else self.get_openai_tool_schema()
        self.name: str = self.tool_schema.function.name
        self.timeout = _config_number(self.config, "timeout", float, 30.0)
        memory = _config_number(self.config, "memory_mb", int, None)
        self.memory_mb = None if memory is None else int(memory)
        self._sandbox = sandbox
        self._owns_sandbox = sandbox is None
        self._sessions: dict[str, Session] = {}
        self._ended: collections.OrderedDict[str, str] = collections.OrderedDict()
        """Why the session of a trajectory ended between its calls (idle past its TTL),
        for its next call's observation; the newest ``ENDED_KEPT`` only."""
        self._instances: dict[str, str] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}
        """Calls of each trajectory in ``_session`` now: its lock is dropped when the last
        leaves without a session (an open that failed or was cancelled left one per
        trajectory, without bound: the twenty-eighth red-team round)."""
        self._told_no_trajectory = False
        self._in_use: collections.Counter[str] = collections.Counter()
        """Calls of each trajectory in ``execute`` now: a session in use is never evicted."""
        self._used: dict[str, float] = {}
        """When each trajectory's session was last used: the least recent idle one makes
        room at ``max_sessions`` (``_open``)."""

    def get_openai_tool_schema(self) -> Any:
        """The tool's OpenAI function schema (the config's, else ``DEFAULT_TOOL_SCHEMA``)."""
        existing = getattr(self, "tool_schema", None)
        return existing if existing is not None else _tool_schema(DEFAULT_TOOL_SCHEMA)

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox the sessions run on (built from the config on first use)."""
        if self._sandbox is None:
            options = {
                key: self.config[key]
                for key in ("max_sessions", "session_ttl")
                if key in self.config
            }
            backend = backend_config(
                str(self.config.get("backend", "docker")), self.config.get("backend_config")
            )
            self._sandbox = Sandbox(backend, timeout=self.timeout, **options)
        return self._sandbox

    @property
    def open_sessions(self) -> int:
        """Trajectories with a session open now."""
        return sum(session.lost is None for session in self._sessions.values())

    async def create(self, instance_id: str | None = None, **_kwargs: Any) -> tuple[str, Any]:
        """A tool instance for a call (verl) or a trajectory; the session opens on first use."""
        instance_id = instance_id or uuid.uuid4().hex
        self._instances[instance_id] = f"instance:{instance_id}"
        return instance_id, _tool_response(None)

    async def execute(
        self, instance_id: str, parameters: Mapping[str, Any], **kwargs: Any
    ) -> tuple[Any, float | None, dict[str, Any]]:
        """Run ``parameters["code"]`` in the trajectory's session.

        Returns (ToolResponse, None, metrics): no step reward, as verl's own
        SandboxFusion tool; metrics has the outcome, latency and whether the
        interpreter ended.
        """
        request_id = getattr(kwargs.get("agent_data"), "request_id", None)
        key = f"request:{request_id}" if request_id else f"instance:{instance_id}"
        if not request_id and not self._told_no_trajectory:
            self._told_no_trajectory = True
            log.warning(
                "SessionCodeTool: a call came without agent_data.request_id, so its session "
                "lasts only until its instance is released; verl passes agent_data since "
                "its agent loop of 2025-12-09 (before, every call started a new interpreter)"
            )
        self._instances[instance_id] = key
        if not isinstance(parameters, Mapping):  # the model's arguments were not an object
            text = 'Error: the arguments must be an object with a "code" string.'
            refused = {"outcome": "rejected", "latency": 0.0, "session_lost": False}
            return _tool_response(text), None, refused
        code = parameters.get("code", "")
        if not isinstance(code, str):
            code = str(code)
        self._in_use[key] += 1
        try:
            return await self._execute(key, code)
        finally:
            self._in_use[key] -= 1
            if self._in_use[key] <= 0:
                del self._in_use[key]
            self._note_use(key)

    def _note_use(self, key: str) -> None:
        """When ``key``'s session was last used; nothing for a trajectory without one
        (this table must not grow with every trajectory ever seen)."""
        for gone in [other for other in self._used if other not in self._sessions]:
            del self._used[gone]
        if key in self._sessions:
            self._used[key] = time.monotonic()

    async def _execute(self, key: str, code: str) -> tuple[Any, float | None, dict[str, Any]]:
        started = time.perf_counter()
        try:
            session, ended = await self._session(key)
        except SessionLimitError as exc:
            # Every session is in use by a trajectory in flight: the sandbox's failure to
            # serve this call, never the code's (it did not run), and said so to the trainer.
            text = f"Error: the code did not run: no interpreter is free ({exc})"
            latency = time.perf_counter() - started
            refused = {"outcome": Outcome.SANDBOX_ERROR.value, "latency": latency}
            return _tool_response(text), None, {**refused, "session_lost": False}
        try:
            result = await session.arun_code(code, timeout=self.timeout)
        except SessionLostError as exc:
            # A parallel call of the trajectory ended the interpreter first: the same
            # observation as the call that did, and this code never ran (the review of the
            # twenty-eighth round).
            await self._drop(key, session)
            text = _lost_note(session.lost or str(exc)).lstrip("\n")
            latency = time.perf_counter() - started
            ended_here = {"outcome": "rejected", "latency": latency, "session_lost": True}
            return _tool_response(text), None, ended_here
        text = session.format_tool_content(result)
        if ended is not None:
            text += _restarted_note(ended)
        lost = session.lost
        if lost is not None:
            text += _lost_note(lost)
            await self._drop(key, session)
        metrics: dict[str, Any] = {
            "outcome": result.outcome.value,
            "latency": result.latency,
            "session_lost": lost is not None,
        }
        return _tool_response(text), None, metrics

    async def calc_reward(self, instance_id: str, **_kwargs: Any) -> float:
        """No reward of its own (score the answer in your reward function)."""
        return 0.0

    async def release(self, instance_id: str, **_kwargs: Any) -> None:
        """End an instance; its session closes unless it belongs to a ``request_id``."""
        key = self._instances.pop(instance_id, f"instance:{instance_id}")
        if key.startswith("instance:"):
            await self._close(key)

    async def release_trajectory(self, request_id: str) -> None:
        """Close the session of the trajectory ``request_id`` (verl's ``agent_data.request_id``)."""
        await self._close(f"request:{request_id}")

    async def aclose(self) -> None:
        """Close every session, and the sandbox if the tool built it."""
        for key in list(self._sessions):
            await self._close(key)
        self._instances.clear()
        if self._owns_sandbox and self._sandbox is not None:
            sandbox, self._sandbox = self._sandbox, None
            await sandbox.aclose()

    async def _session(self, key: str) -> tuple[Session, str | None]:
        """The trajectory's session, and why its previous one ended if it did between calls
        (idle past ``session_ttl``, say): the observation must say so."""
        self._forget_ended(but=key)
        lock = self._opening.setdefault(key, asyncio.Lock())
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            async with lock:  # parallel calls of one trajectory open one session
                session = self._sessions.get(key)
                ended = session.lost if session is not None else self._ended.pop(key, None)
                if session is None or ended is not None:
                    if session is not None:
                        await session.aclose()
                    try:
                        session = await self._open(key)
                    except BaseException:
                        if ended is not None and key not in self._sessions:
                            self._ended[key] = ended  # still for the next call to say
                        raise
                    self._sessions[key] = session
                return session, ended
        finally:
            left = self._waiting.pop(key) - 1
            if left:
                self._waiting[key] = left
            elif key not in self._sessions and self._opening.get(key) is lock:
                del self._opening[key]

    async def _open(self, key: str) -> Session:
        """A new session for ``key``. At the sandbox's ``max_sessions`` this tool's least
        recently used idle session is closed to make room, and its trajectory's next call
        says so: verl never says a trajectory is over, so the sessions of the batches
        before held the cap until their idle time ran out, and the next batch's calls
        were refused (red team, the thirty-sixth round)."""
        while True:
            try:
                return await self.sandbox.aopen_session(memory_mb=self.memory_mb)
            except SessionLimitError as exc:
                idle = [
                    other
                    for other in self._sessions
                    if other != key and not self._in_use[other] and not self._waiting.get(other)
                ]
                if not idle:
                    raise
                oldest = min(idle, key=lambda other: self._used.get(other, 0.0))
                session = self._sessions.pop(oldest)
                self._opening.pop(oldest, None)
                self._ended[oldest] = f"closed for a newer trajectory's: {exc}"
                while len(self._ended) > ENDED_KEPT:
                    self._ended.popitem(last=False)
                await session.aclose()

    async def _drop(self, key: str, session: Session) -> None:
        """Forget and close the trajectory's session that ended during a call; its lock too,
        unless another call of the trajectory is in ``_session`` (a lock per trajectory
        whose interpreter ended was kept, without bound)."""
        if self._sessions.get(key) is session:
            del self._sessions[key]
            if not self._waiting.get(key):
                self._opening.pop(key, None)
        await session.aclose()

    def _forget_ended(self, but: str) -> None:
        """Drop the sessions that ended by themselves (idle past ``session_ttl``, say),
        keeping only why, for a while: verl never says a trajectory is over, and a
        table of every trajectory's session grew without bound (~31 KiB each on Docker;
        the sixth red-team round). Each is closed too, handed over at once (one whose
        call was cancelled before it could close it stayed open)."""
        for key, session in list(self._sessions.items()):
            if key == but or session.lost is None or self._waiting.get(key):
                continue  # (a call in ``_session``, holding or awaiting the lock: its own)
            del self._sessions[key]
            self._opening.pop(key, None)
            self._ended[key] = session.lost
            while len(self._ended) > ENDED_KEPT:
                self._ended.popitem(last=False)
            session._close_soon()

    async def _close(self, key: str) -> None:
        self._ended.pop(key, None)
        if not self._waiting.get(key):  # else a call of it holds the lock: kept for it
            self._opening.pop(key, None)
        session = self._sessions.pop(key, None)
        if session is not None:
            await session.aclose()

    def __deepcopy__(self, memo: dict[int, Any]) -> SessionCodeTool:
        shared = None if self._owns_sandbox else self._sandbox
        return type(self)(
            copy.deepcopy(self.config, memo), copy.deepcopy(self.tool_schema, memo), sandbox=shared
        )


# -- branching -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Branches:
    """What ``run_branches`` ran: the shared prefix once, then each continuation in its fork."""

    prefix: list[ExecResult]
    """The prefix's cells, run once in the root session."""
    branches: list[list[ExecResult]]
    """One list per continuation, in input order: its cells' results (shorter than its cells
    when its interpreter ended: the cells after that did not run)."""


def _config_number(
    config: Mapping[str, Any], key: str, kind: type[float] | type[int], default: float | None
) -> float | None:
    """``config[key]`` as ``kind``, or a ValueError naming the key (``{"timeout": "abc"}``
    said only "could not convert string to float"; the new-user pass of the round)."""
    value = config.get(key, default)
    if value is None:
        return None
    try:
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"SessionCodeTool config {key!r} must be a number, got {value!r}") from exc


def _cells(code: str | Sequence[str]) -> list[str]:
    return [code] if isinstance(code, str) else list(code)


async def arun_branches(
    sandbox: Sandbox,
    prefix: str | Sequence[str],
    continuations: Sequence[str | Sequence[str]],
    *,
    timeout: float | None = None,
    concurrency: int | None = None,
    memory_mb: int | None = None,
) -> Branches:
    """Run ``prefix`` once, then each continuation in a fork of the state it left.

        branches = await arun_branches(sandbox, "import sympy as sp\\nx = sp.symbols('x')",
                                       ["print(sp.solve(x**2 - 2, x))", "print(sp.diff(x**3))"])

    Each continuation (one cell, or a list of cells) runs in its own fork of
    the root session, so the branches start from the same state and never see
    each other; the prefix is not re-run. At most ``concurrency`` forks are open
    at once (default: all), each closed when its continuation ends; the root is
    closed at the end. A root that is lost during the prefix raises
    ``SessionLostError`` at the first fork. On Docker a session and its forks
    share one container and run one cell at a time.
    """
    if isinstance(continuations, (str, bytes)):  # each character would be a branch
        raise TypeError(
            "continuations must be a sequence of continuations (each one cell or a list "
            f"of cells), not one string: wrap it, [{continuations[:20]!r}]"
        )
    prefix_cells, branch_cells = _cells(prefix), [_cells(code) for code in continuations]
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    slots = asyncio.Semaphore(concurrency or max(1, len(branch_cells)))
    async with sandbox.session(memory_mb=memory_mb) as root:
        prefix_results = [await root.arun_code(cell, timeout=timeout) for cell in prefix_cells]

        async def branch(cells: list[str]) -> list[ExecResult]:
            async with slots:
                fork = await root.afork()
                try:
                    results = []
                    for cell in cells:
                        results.append(await fork.arun_code(cell, timeout=timeout))
                        if fork.lost is not None:
                            break
                    return results
                finally:
                    await fork.aclose()

        branches = await asyncio.gather(*(branch(cells) for cells in branch_cells))
    return Branches(prefix=prefix_results, branches=list(branches))


def run_branches(
    sandbox: Sandbox,
    prefix: str | Sequence[str],
    continuations: Sequence[str | Sequence[str]],
    *,
    timeout: float | None = None,
    concurrency: int | None = None,
    memory_mb: int | None = None,
) -> Branches:
    """``arun_branches`` from sync code (any thread without a running event loop)."""
    return asyncio.run(
        arun_branches(
            sandbox,
            prefix,
            continuations,
            timeout=timeout,
            concurrency=concurrency,
            memory_mb=memory_mb,
        )
    )
