"""Running the corpus against a backend: one case, one backend, or a whole audit.

Per case: run the attack (beside its companion, if any, and with a neighbour
call in another container during it, if any), then its follow-up, then judge
the predicate and three invariants that hold for every case:

1. the call returned within its wall limit plus :data:`GRACE`, with an
   explicit outcome (a sandbox failure caused by an attack counts against it);
2. the next call on the same backend succeeds;
3. nothing is left behind on the host (processes, files, IPC objects).

One Sandbox serves all cases of a backend. Cases run concurrently where they
cannot disturb each other; ``exclusive`` ones (bombs, CPU burners) run one
at a time afterwards. A ``reuse`` pool runs with one container and one call
at a time, so a follow-up lands in the container its attack used; for the
same reason a case's ``neighbour`` call runs on a second sandbox of the same
config there (another container), started only when a case has one.

A session case (``Case.session_steps``) runs its steps on sessions of the
same sandbox instead of one attack call: it opens families, forks, runs
cells and closes them in order, then closes whatever is still open before
its follow-up call. Invariant 1 holds for every cell, with
:data:`SESSION_GRACE` (a cell that ignores its KeyboardInterrupt is killed
after the backend's one-second grace); a backend without sessions skips it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from retool_exec._errors import SessionError, SessionsUnsupportedError
from retool_exec._models import ExecResult, Outcome
from retool_exec._sandbox import Sandbox
from retool_exec._session import Session
from retool_exec.backends.config import BackendConfigBase, DockerConfig, LocalConfig
from retool_exec.backends.docker.hardening import is_gvisor
from retool_exec.security.host import HostFixtures, new_token
from retool_exec.security.model import (
    Case,
    CaseContext,
    CaseReport,
    Inconclusive,
    Observation,
    Status,
    StepAction,
)
from retool_exec.security.snippets import PRELUDE

__all__ = [
    "AUDIT_LABEL",
    "AUDIT_LIMITS",
    "BACKEND_IDS",
    "DEFAULT_TIMEOUT",
    "GRACE",
    "INCONCLUSIVE_RUNS",
    "ISOLATING",
    "SESSION_GRACE",
    "AuditRun",
    "BackendRun",
    "audit_backend",
    "audit_config",
    "default_concurrency",
    "neighbour_sandbox",
    "run_backend",
    "run_case",
    "with_audit_limits",
]

DEFAULT_TIMEOUT = 5.0
"""Wall-clock seconds per attack call unless the case says otherwise."""
GRACE = 1.5
"""Seconds past the limit a call may take to come back (invariant 1)."""
SESSION_GRACE = 2.0
"""Seconds past its limit a session cell may take: a cell that ignores KeyboardInterrupt
is killed one second after it (the backends' interrupt grace), and its session lost."""
NEXT_CALL_TIMEOUT = 10.0
INCONCLUSIVE_RUNS = 3
"""Runs of a case at most while its predicate finds them :class:`Inconclusive` (the
attack's timing missed on a loaded host); an invariant that broke is never rerun."""
BACKEND_IDS = ("local", "docker-fresh", "docker-reuse", "docker-runsc")
ISOLATING = frozenset({"docker-fresh", "docker-reuse", "docker-runsc"})
"""Backends meant to contain every case: an exposure there fails the audit."""
AUDIT_LABEL = "retool-exec-audit"
"""Container label carrying the audit run's id (to prove nothing is left)."""
AUDIT_LIMITS: Mapping[str, Any] = {
    "memory_mb": 256,
    "pids": 64,
    "tmpfs_mb": 16,
    "tmpfs_inodes": 4096,
    "shm_mb": 8,
    "nofile": 256,
    "fsize_mb": 8,
}
"""Modest limits, so that bombs hit them fast (the resource cases assume these numbers)."""
AUDIT_PRELOAD = ("numpy",)
"""What a ``reuse`` zygote preloads in the audit: one C-extension module with its own RNG,
enough for the fork-server cases (reseeding, module state), and a container that
restarts in about a second when an attack kills it (the full default preload takes
several, under gVisor more)."""

Progress = Callable[[CaseReport], None]
ConfigT = TypeVar("ConfigT", bound=BackendConfigBase)


def audit_config(
    backend_id: str, *, run_id: str = "", timeout: float = DEFAULT_TIMEOUT
) -> LocalConfig | DockerConfig:
    """The config the audit uses for a backend name (with the audit's limits)."""
    if backend_id == "local":
        return LocalConfig(timeout=timeout)
    base: dict[str, DockerConfig] = {
        "docker-fresh": DockerConfig(timeout=timeout, policy="fresh", pool_size=4),
        "docker-reuse": DockerConfig(timeout=timeout, policy="reuse"),
        "docker-runsc": DockerConfig(timeout=timeout, policy="reuse", runtime="runsc"),
    }
    if backend_id not in base:
        raise ValueError(f"unknown backend {backend_id!r}; choose from {', '.join(BACKEND_IDS)}")
    return with_audit_limits(base[backend_id], run_id=run_id)


def with_audit_limits(config: ConfigT, *, run_id: str = "") -> ConfigT:
    """``config`` with the audit's limits (and, for ``reuse``, a single container)."""
    if not isinstance(config, DockerConfig):
        return config
    update: dict[str, Any] = dict(AUDIT_LIMITS)
    if config.policy == "reuse":
        update["pool_size"] = 1
        update["preload"] = AUDIT_PRELOAD
    if run_id:
        update["labels"] = {**config.labels, AUDIT_LABEL: run_id}
    return type(config).model_validate({**config.model_dump(), **update})


def default_concurrency(config: BackendConfigBase) -> int:
    """Calls in flight at once: a docker pool's size (one for ``reuse``), four locally."""
    if isinstance(config, DockerConfig):
        return 1 if config.policy == "reuse" else config.pool_size
    return 4


def _fill(text: str, ctx: CaseContext) -> str:
    for placeholder, value in ctx.substitutions().items():
        text = text.replace(placeholder, value)
    return text


def _render(source: str, ctx: CaseContext, *, raw: bool = False) -> str:
    return source if raw else _fill(PRELUDE + source, ctx)


def _inputs(case: Case, ctx: CaseContext) -> dict[str, Any]:
    """The attack call's stdin/files/fetch/memory_mb keywords (only those the case gives)."""
    given = case.inputs
    inputs: dict[str, Any] = {}
    if given.stdin is not None:
        inputs["stdin"] = _fill(given.stdin, ctx)
    if given.files:
        inputs["files"] = {_fill(path, ctx): _fill(text, ctx) for path, text in given.files.items()}
    if given.fetch:
        inputs["fetch"] = tuple(_fill(path, ctx) for path in given.fetch)
    if given.memory_mb is not None:
        inputs["memory_mb"] = given.memory_mb
    return inputs


async def _after(delay: float, call: Awaitable[ExecResult]) -> ExecResult:
    await asyncio.sleep(delay)
    return await call


def neighbour_sandbox(sandbox: Sandbox) -> Sandbox | None:
    """A second sandbox for ``neighbour`` calls where ``sandbox`` would run them in the
    container the attack uses (a ``reuse`` pool); None where ``sandbox`` itself puts
    concurrent calls in separate containers or processes."""
    config = getattr(sandbox.backend, "config", None)
    if isinstance(config, DockerConfig) and config.policy == "reuse":
        return Sandbox(config, timeout=sandbox.timeout, max_workers=sandbox.max_workers)
    return None


def _evidence(result: ExecResult | None, limit: int = 300) -> str:
    if result is None:
        return ""
    for line in reversed(result.stdout.splitlines()):
        if line.startswith("{"):
            return line[:limit]
    text = (result.stdout or result.stderr or result.detail).strip()
    tail = text.splitlines()[-1] if text else ""
    return (tail[:limit] + f" [{result.outcome.value}]").strip()


async def run_case(
    sandbox: Sandbox,
    case: Case,
    host: HostFixtures,
    *,
    backend: str,
    gvisor: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    neighbours: Sandbox | None = None,
) -> CaseReport:
    """Run one case on one backend and judge it (see the module docstring).

    A ``neighbour`` call runs on ``neighbours`` if given, else on ``sandbox``
    (see :func:`neighbour_sandbox`). A run its predicate finds :class:`Inconclusive`
    is run again, :data:`INCONCLUSIVE_RUNS` times at most; the last one is reported."""
    started = time.perf_counter()
    runs = 0
    while True:
        runs += 1
        outcome, inconclusive = await _run_once(
            sandbox,
            case,
            host,
            backend=backend,
            gvisor=gvisor,
            timeout=timeout,
            neighbours=neighbours,
            started=started,
        )
        if not inconclusive or runs == INCONCLUSIVE_RUNS:
            break
    if inconclusive:
        reasons = (*outcome.reasons, f"inconclusive in each of {runs} runs")
        outcome = dataclasses.replace(outcome, reasons=reasons)
    return outcome


async def _run_once(
    sandbox: Sandbox,
    case: Case,
    host: HostFixtures,
    *,
    backend: str,
    gvisor: bool,
    timeout: float,
    neighbours: Sandbox | None,
    started: float,
) -> tuple[CaseReport, bool]:
    """One run of :func:`run_case`: its report, and whether the predicate found it
    :class:`Inconclusive`."""

    def report(
        status: Status,
        reasons: Iterable[str],
        evidence: str = "",
        outcome: str = "",
        inconclusive: bool = False,
    ) -> tuple[CaseReport, bool]:
        judged = CaseReport(
            case_id=case.id,
            klass=case.klass,
            severity=case.severity,
            backend=backend,
            status=status,
            reasons=tuple(reasons),
            evidence=evidence,
            outcome=outcome,
            seconds=time.perf_counter() - started,
        )
        return judged, inconclusive

    if backend == "local" and (skip := case.local_skip_reason()):
        return report(Status.SKIPPED, [skip])
    token = new_token()
    ctx = CaseContext(
        token=token,
        backend=backend,
        gvisor=gvisor,
        timeout=case.timeout or timeout,
        host=host.facts,
    )
    cells: dict[str, ExecResult] = {}
    refused: dict[str, str] = {}
    try:
        companion = None
        if case.companion is not None and not case.session_steps:
            companion = asyncio.ensure_future(
                sandbox.arun_code(_render(case.companion, ctx), timeout=timeout)
            )
            await asyncio.sleep(0.3)
        if case.session_steps:
            await _run_steps(sandbox, case, ctx, cells, refused)
            result, neighbour = _main_cell(cells), None
        else:
            result, neighbour = await _attack(sandbox, case, ctx, neighbours or sandbox, timeout)
        follow = None
        if case.follow_up is not None:
            follow = await sandbox.arun_code(_render(case.follow_up, ctx), timeout=timeout)
        if companion is not None:
            await companion
        if follow is not None and follow.ok:
            after = follow  # a successful follow-up already is the next call
        else:
            after = await sandbox.arun_code(
                f"print({token!r} + '-next')", timeout=NEXT_CALL_TIMEOUT
            )
    except SessionsUnsupportedError as exc:
        return report(Status.SKIPPED, [f"the backend has no sessions: {exc}"])
    except Exception as exc:
        return report(Status.ERROR, [f"the audit could not run the case: {exc!r}"])

    reasons = []
    if case.session_steps:
        for name, cell in cells.items():
            limit = cell.timeout or ctx.timeout
            took = cell.latency - cell.queue_wait
            if took > limit + SESSION_GRACE:
                reasons.append(
                    f"cell {name} returned after {took:.1f}s "
                    f"(limit {limit:g}s + {SESSION_GRACE:g}s grace)"
                )
    else:
        took = result.latency - result.queue_wait
        if took > ctx.timeout + GRACE:
            reasons.append(
                f"returned after {took:.1f}s (limit {ctx.timeout:g}s + {GRACE:g}s grace)"
            )
    checked: dict[str, ExecResult | None] = {**cells} if cells else {"attack": result}
    checked["follow-up"] = follow
    for name, call in checked.items():
        if call is not None and call.outcome is Outcome.SANDBOX_ERROR:
            reasons.append(f"the {name} call broke the sandbox: {call.detail}")
    if not after.ok or (after is not follow and after.stdout != f"{token}-next\n"):
        reasons.append(f"the next call failed: {after.outcome.value} {_evidence(after)}")
    left = await host.await_leftovers(token, wait=0.5 if backend == "local" else 5.0)
    if left:
        reasons.append("left behind on the host: " + ", ".join(left[:5]))
        if backend == "local":
            host.clean(token)

    evidence = _evidence(result)
    if follow is not None:
        evidence += " | follow-up: " + _evidence(follow)
    if neighbour is not None:
        evidence += " | neighbour: " + _evidence(neighbour)
    observation = Observation(
        result=result, follow=follow, ctx=ctx, neighbour=neighbour, cells=cells, refused=refused
    )
    try:
        contained = case.contained(observation)
    except (KeyError, ValueError, TypeError, IndexError, json.JSONDecodeError) as exc:
        return report(
            Status.ERROR,
            [f"could not judge the outcome: {type(exc).__name__}: {exc}", *reasons],
            evidence,
            result.outcome.value,
            inconclusive=isinstance(exc, Inconclusive) and not reasons,
        )
    if not contained:
        reasons.insert(0, "the attack got through")
    status = Status.EXPOSED if reasons else Status.CONTAINED
    return report(status, reasons, evidence, result.outcome.value)


async def _attack(
    sandbox: Sandbox, case: Case, ctx: CaseContext, bystander: Sandbox, timeout: float
) -> tuple[ExecResult, ExecResult | None]:
    """The attack call, and the ``neighbour`` call beside it (if the case has one)."""
    if case.neighbour is not None:
        await bystander.astart()  # warm before the attack starts its clock
    attack = sandbox.arun_code(
        _render(case.source(), ctx, raw=case.raw), timeout=ctx.timeout, **_inputs(case, ctx)
    )
    if case.neighbour is None:
        return await attack, None
    return await asyncio.gather(
        attack,
        _after(
            case.neighbour_delay,
            bystander.arun_code(_render(case.neighbour, ctx), timeout=timeout),
        ),
    )


async def _run_steps(
    sandbox: Sandbox,
    case: Case,
    ctx: CaseContext,
    cells: dict[str, ExecResult],
    refused: dict[str, str],
) -> None:
    """Run a session case's steps in order (see ``SessionStep``); close what is left open.

    A step that raises a ``SessionError`` is recorded in ``refused`` (the case's
    predicate judges it), as is a step on a session whose open or fork was refused; a
    backend without sessions raises ``SessionsUnsupportedError`` at the first ``OPEN``."""
    sessions: dict[str, Session] = {}
    try:
        for step in case.session_steps:
            needed = step.parent if step.action is StepAction.FORK else step.session
            if step.action is not StepAction.OPEN and needed not in sessions:
                refused[step.key] = f"no session {needed!r}: its open or fork was refused"
                continue
            try:
                if step.action is StepAction.OPEN:
                    sessions[step.session] = await sandbox.aopen_session()
                elif step.action is StepAction.FORK:
                    sessions[step.session] = await sessions[step.parent].afork()
                elif step.action is StepAction.CELL:
                    cells[step.key] = await sessions[step.session].arun_code(
                        _render(step.code, ctx), timeout=step.timeout or ctx.timeout
                    )
                else:
                    await sessions[step.session].aclose()
            except SessionsUnsupportedError:
                raise
            except SessionError as exc:
                refused[step.key] = f"{type(exc).__name__}: {exc}"
    finally:
        for session in sessions.values():
            with contextlib.suppress(Exception):
                await session.aclose()


def _main_cell(cells: Mapping[str, ExecResult]) -> ExecResult:
    """A session case's ``attack`` cell, else its last cell that returned."""
    if "attack" in cells:
        return cells["attack"]
    if not cells:
        raise RuntimeError("no cell of the session case returned a result")
    return list(cells.values())[-1]


async def run_backend(
    sandbox: Sandbox,
    cases: Iterable[Case],
    host: HostFixtures,
    *,
    backend: str,
    gvisor: bool = False,
    concurrency: int = 4,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Progress | None = None,
) -> list[CaseReport]:
    """Run ``cases`` on one started sandbox; reports come back in the corpus order."""
    cases = list(cases)
    slots = asyncio.Semaphore(max(1, concurrency))
    neighbours = None
    if any(case.neighbour is not None for case in cases):
        neighbours = neighbour_sandbox(sandbox)

    async def one(case: Case) -> CaseReport:
        outcome = await run_case(
            sandbox,
            case,
            host,
            backend=backend,
            gvisor=gvisor,
            timeout=timeout,
            neighbours=neighbours,
        )
        if progress is not None:
            progress(outcome)
        return outcome

    async def limited(case: Case) -> CaseReport:
        async with slots:
            return await one(case)

    try:
        shared = [case for case in cases if not case.exclusive]
        done = dict(
            zip((c.id for c in shared), await asyncio.gather(*map(limited, shared)), strict=True)
        )
        for case in cases:
            if case.exclusive:
                done[case.id] = await one(case)
    finally:
        if neighbours is not None:
            await neighbours.aclose()
    return [done[case.id] for case in cases]


@dataclass
class BackendRun:
    """One backend's reports, plus what went wrong around the cases."""

    backend: str
    reports: list[CaseReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Backend-level failures: could not start, containers left behind."""
    seconds: float = 0.0

    @property
    def isolating(self) -> bool:
        return self.backend in ISOLATING

    @property
    def failed(self) -> bool:
        """An isolating backend exposed something, could not judge, or broke."""
        if not self.isolating:
            return False
        bad = {Status.EXPOSED, Status.ERROR}
        return bool(self.problems) or any(report.status in bad for report in self.reports)


@dataclass
class AuditRun:
    """A whole audit: the runs of every backend asked for."""

    backends: list[BackendRun] = field(default_factory=list)
    command: str = ""

    @property
    def failed(self) -> bool:
        return any(run.failed for run in self.backends)


async def audit_backend(
    backend: str,
    cases: Iterable[Case],
    host: HostFixtures,
    *,
    config: BackendConfigBase | None = None,
    concurrency: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Progress | None = None,
) -> BackendRun:
    """Start a sandbox for ``backend``, run ``cases`` on it, close it, check for leftovers."""
    from retool_exec._errors import RetoolExecError

    started = time.perf_counter()
    run = BackendRun(backend=backend)
    config = config or audit_config(backend, run_id=host.run_id, timeout=timeout)
    sandbox = Sandbox(config, timeout=timeout)  # as many calls at once as the pool runs
    try:
        await sandbox.astart()
    except RetoolExecError as exc:
        run.problems.append(f"could not start the backend: {exc}")
        await sandbox.aclose()
        return run
    gvisor = isinstance(config, DockerConfig) and is_gvisor(config.runtime)
    try:
        if backend == "local":
            with host.adopting_orphans():
                run.reports = await run_backend(
                    sandbox,
                    cases,
                    host,
                    backend=backend,
                    concurrency=concurrency or 4,
                    timeout=timeout,
                    progress=progress,
                )
        else:
            run.reports = await run_backend(
                sandbox,
                cases,
                host,
                backend=backend,
                gvisor=gvisor,
                concurrency=concurrency or default_concurrency(config),
                timeout=timeout,
                progress=progress,
            )
    finally:
        await sandbox.aclose()
    if isinstance(config, DockerConfig):
        left = await asyncio.to_thread(_labelled_containers, config)
        if left:
            run.problems.append(f"{len(left)} container(s) left behind after close")
    run.seconds = time.perf_counter() - started
    return run


def _labelled_containers(config: DockerConfig) -> list[str]:
    """Containers of this audit run still present (and remove them: leave nothing)."""
    label = config.labels.get(AUDIT_LABEL)
    if not label:
        return []
    import docker

    from retool_exec.backends.docker.client import connect

    client = connect(config.docker_host)
    try:
        found = client.api.containers(all=True, filters={"label": f"{AUDIT_LABEL}={label}"})
        for info in found:
            with contextlib.suppress(docker.errors.APIError):
                client.api.remove_container(info["Id"], force=True)
        return [str(info["Id"]) for info in found]
    finally:
        client.close()
