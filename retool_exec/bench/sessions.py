"""Session figures: a warm cell against a stateless call, a multi-turn conversation with
and without state, and ``fork()`` of a session holding 100 MB.

Measured on every backend of the run that has sessions (a backend without
them is noted, not failed), one backend after the other:

- **warm cell**: ``print(2+3)`` as a cell of an open session, interleaved
  call by call with the same code as a stateless call on the same backend
  (alternating which goes first; untimed, the pool settles before each), so
  both see the same machine.
- **conversation**: ``TURNS`` turns of sympy/numpy work where each turn uses
  earlier turns' variables. With a session, each turn is one cell (the time
  counted is opening the session plus every cell; closing it is shown apart).
  Without, turn *k* is one stateless call running turns 1..*k* again, as a
  framework without sessions must. Each turn's output is checked.
- **fork**: a session builds 100 MB of bytes (every page written), then
  ``fork()`` is timed from the call to the new session being ready; each
  copy is closed (untimed) before the next fork, and the first copy is
  checked to hold the state.

``--quick`` runs fewer of each and only the first 3 turns (see ``plan``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass

from retool_exec._errors import RetoolExecError, SessionsUnsupportedError
from retool_exec._models import ExecResult, Outcome
from retool_exec._sandbox import Sandbox
from retool_exec._session import Session
from retool_exec.bench.backends import LOCAL
from retool_exec.bench.environment import missing_modules
from retool_exec.bench.pools import settle
from retool_exec.bench.progress import Progress
from retool_exec.bench.results import BenchResult, BenchSettings, SessionFigures

__all__ = [
    "CELL_CODE",
    "FORK_STATE_MB",
    "TURNS",
    "SessionPlan",
    "measure_sessions",
    "plan",
    "planned_calls",
]

CELL_CODE = "print(2+3)"
FORK_STATE_MB = 100
_STATE_CODE = f"state = b'\\x01' * ({FORK_STATE_MB} << 20)\nprint(len(state))"
_STATE_LEN = str(FORK_STATE_MB << 20)

TURNS: tuple[tuple[str, str], ...] = (
    (
        "import numpy as np\nimport sympy as sp\nrng = np.random.default_rng(0)\n"
        "A = rng.standard_normal((80, 80))\nprint(A.shape)",
        "(80, 80)",
    ),
    (
        "x = sp.symbols('x')\nf = x**3 - 6*x**2 + 11*x - 6\nroots = sp.solve(f, x)\nprint(roots)",
        "[1, 2, 3]",
    ),
    ("B = A @ A.T + 80 * np.eye(80)\nprint(bool(np.allclose(B, B.T)))", "True"),
    ("L = np.linalg.cholesky(B)\nprint(bool(np.allclose(L @ L.T, B)))", "True"),
    ("crit = sp.solve(sp.diff(f, x), x)\nprint(len(crit))", "2"),
    (
        "values = sorted(float(f.subs(x, c)) for c in crit)\n"
        "print(round(values[0], 4), round(values[1], 4))",
        "-0.3849 0.3849",
    ),
    ("w = np.linalg.eigvalsh(B)\nprint(bool(w.min() > 0))", "True"),
    ("area = sp.integrate(f, (x, 0, 3))\nprint(area)", "-9/4"),
    ("y = np.linalg.solve(B, np.ones(80))\nprint(bool(np.allclose(B @ y, 1)))", "True"),
    (
        "taylor = sp.series(sp.exp(x) * f, x, 0, 4).removeO()\n"
        "print(sp.expand(taylor).coeff(x, 0), [int(r) for r in roots], area)",
        "-6 [1, 2, 3] -9/4",
    ),
)
"""The conversation: (code, the end of its output). Each turn uses earlier turns' names."""
TURN_NEEDS = ("numpy", "sympy")


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """How much of each session figure a run measures."""

    cell_calls: int
    """Warm cells, and as many stateless calls beside them."""
    turns: int
    rounds: int
    """Times the whole conversation runs each way."""
    forks: int


FULL_PLAN = SessionPlan(cell_calls=40, turns=len(TURNS), rounds=3, forks=20)
QUICK_PLAN = SessionPlan(cell_calls=10, turns=3, rounds=1, forks=5)


def plan(settings: BenchSettings) -> SessionPlan:
    """The full plan, or the quick one for ``--quick`` (3 turns, one round, 5 forks)."""
    return QUICK_PLAN if settings.quick else FULL_PLAN


def planned_calls(settings: BenchSettings) -> int:
    """Calls (cells, stateless calls, forks) the session figures make, for the progress bar."""
    p = plan(settings)
    per_backend = 2 * p.cell_calls + 2 * p.rounds * p.turns + p.forks + 1
    return per_backend * len(settings.backends)


def _wrong(result: ExecResult, expected: str) -> bool:
    return result.outcome is not Outcome.SUCCESS or not result.stdout.rstrip().endswith(expected)


async def _settle(sandbox: Sandbox) -> None:
    with contextlib.suppress(TimeoutError):  # measured anyway; the figures show it
        await settle(sandbox, drain_removals=True)


async def _warm_cells(
    sandbox: Sandbox, session: Session, calls: int, figures: SessionFigures, progress: Progress
) -> None:
    await session.arun_code(CELL_CODE)  # the interpreter's first cell is not a warm one
    for index in range(calls):
        for turn in (0, 1) if index % 2 == 0 else (1, 0):
            await _settle(sandbox)
            if turn == 0:
                result = await session.arun_code(CELL_CODE)
                figures.cell_latencies.append(result.latency)
            else:
                result = await sandbox.arun_code(CELL_CODE)
                figures.call_latencies.append(result.latency)
            figures.cell_failures += _wrong(result, "5")
            progress.advance()


async def _conversation(
    sandbox: Sandbox, turns: int, figures: SessionFigures, progress: Progress
) -> None:
    chosen = TURNS[:turns]
    await _settle(sandbox)
    started = time.perf_counter()
    session = await sandbox.aopen_session()
    opened = time.perf_counter()
    try:
        for code, expected in chosen:
            result = await session.arun_code(code)
            figures.conversation_failures += _wrong(result, expected)
            progress.advance()
        done = time.perf_counter()
    finally:
        await session.aclose()
    figures.conversation_open.append(opened - started)
    figures.conversation_session.append(done - started)
    figures.conversation_close.append(time.perf_counter() - done)
    await _settle(sandbox)
    total = 0.0
    for last in range(1, len(chosen) + 1):
        await _settle(sandbox)  # a reuse container's reset is not the next turn's cost
        result = await sandbox.arun_code("\n".join(code for code, _ in chosen[:last]))
        total += result.latency
        figures.conversation_failures += _wrong(result, chosen[last - 1][1])
        progress.advance()
    figures.conversation_stateless.append(total)


async def _forks(session: Session, forks: int, figures: SessionFigures, progress: Progress) -> None:
    built = await session.arun_code(_STATE_CODE)
    progress.advance()
    if _wrong(built, _STATE_LEN):
        figures.fork_failures += 1
        figures.error = f"could not build the {FORK_STATE_MB} MB state: {_describe(built)}"
        return
    for index in range(forks):
        started = time.perf_counter()
        try:
            copy = await session.afork()
        except RetoolExecError as exc:
            figures.fork_failures += 1
            figures.error = f"fork failed: {exc}"
            progress.advance()
            continue
        figures.fork_latencies.append(time.perf_counter() - started)
        try:
            if index == 0:
                check = await copy.arun_code("print(len(state))")
                figures.fork_failures += _wrong(check, _STATE_LEN)
        finally:
            await copy.aclose()
        progress.advance()


def _describe(result: ExecResult) -> str:
    tail = (result.stderr.strip().splitlines() or [""])[-1]
    return f"{result.outcome.value} {result.detail or tail}"[:200]


async def _measure(
    name: str, sandbox: Sandbox, settings: BenchSettings, result: BenchResult, progress: Progress
) -> SessionFigures:
    p = plan(settings)
    figures = SessionFigures(backend=name, turns=p.turns, fork_state_mb=FORK_STATE_MB)
    await _settle(sandbox)
    try:
        started = time.perf_counter()
        session = await sandbox.aopen_session()
        figures.open_seconds = time.perf_counter() - started
    except SessionsUnsupportedError as exc:
        figures.error = f"no sessions: {exc}"
        return figures
    except RetoolExecError as exc:
        figures.error = f"could not open a session: {exc}"
        return figures
    try:
        progress.phase(f"sessions: {name}: warm cell vs call")
        await _warm_cells(sandbox, session, p.cell_calls, figures, progress)
        progress.phase(f"sessions: {name}: fork with {FORK_STATE_MB} MB")
        await _forks(session, p.forks, figures, progress)
    finally:
        await session.aclose()
    local_info = result.environment.get("local_python")
    if name == LOCAL and isinstance(local_info, dict):
        missing = missing_modules(local_info, TURN_NEEDS)
        if missing:
            figures.conversation_skipped = (
                f"the local baseline interpreter cannot import {', '.join(missing)}"
            )
            return figures
    progress.phase(f"sessions: {name}: {p.turns}-turn conversation")
    for _ in range(p.rounds):
        await _conversation(sandbox, p.turns, figures, progress)
    return figures


async def measure_sessions(
    sandboxes: Mapping[str, Sandbox],
    settings: BenchSettings,
    *,
    result: BenchResult,
    progress: Progress,
) -> None:
    """The session figures of every backend of the run, appended to ``result.sessions``."""
    for name, sandbox in sandboxes.items():
        progress.phase(f"sessions: {name}")
        started = time.perf_counter()
        figures = await _measure(name, sandbox, settings, result, progress)
        figures.seconds = time.perf_counter() - started
        result.sessions.append(figures)
