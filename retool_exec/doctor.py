"""Prove the isolation on this host: a handful of the security corpus's cases, in real containers.

Used by ``retool-exec doctor``. The checks are not a second probe model: they
are cases of :data:`retool_exec.security.CORPUS` (network, read-only root,
user, capabilities, environment, memory and process limits, the agent's
reach, io_uring and POSIX queues, the Docker socket, the hostname), run and
judged by the audit's runner with the audit's limits. ``retool-exec audit``
runs the whole corpus.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from retool_exec.backends.config import BackendConfigBase
from retool_exec.security.cases import CORPUS
from retool_exec.security.model import Case, CaseReport, Status

__all__ = ["DOCTOR_CASES", "Check", "doctor_cases", "run_doctor"]

DOCTOR_CASES: tuple[str, ...] = (
    "net-interfaces",
    "net-no-routes",
    "priv-readonly-system",
    "priv-uid",
    "priv-capabilities",
    "info-env-allowlist",
    "res-memory-one-block",
    "res-thread-bomb",
    "proto-agent-signals",
    "proto-agent-descriptors",
    "priv-io-uring",
    "res-mqueue-by-open",
    "priv-docker-socket",
    "info-hostname",
)
"""Ids of the corpus cases the doctor runs: quick ones that show the isolation is real."""


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    ok: bool
    detail: str


def doctor_cases() -> tuple[Case, ...]:
    """The doctor's cases, taken from the corpus (a missing id is a bug here)."""
    by_id = {case.id: case for case in CORPUS}
    missing = [case_id for case_id in DOCTOR_CASES if case_id not in by_id]
    if missing:
        raise LookupError(f"doctor cases not in the security corpus: {', '.join(missing)}")
    return tuple(by_id[case_id] for case_id in DOCTOR_CASES)


def _check(report: CaseReport, titles: dict[str, str]) -> Check:
    ok = report.status is Status.CONTAINED
    detail = "; ".join(report.reasons) if report.reasons else ""
    if not ok and report.evidence:
        detail = f"{detail}; evidence: {report.evidence}" if detail else report.evidence
    return Check(f"{report.case_id}: {titles.get(report.case_id, '')}", ok, detail[:200])


def run_doctor(
    config: BackendConfigBase,
    *,
    name: str = "docker",
    report: Callable[[Check], None] | None = None,
) -> list[Check]:
    """Start a sandbox from ``config`` (with the audit's limits) and run the doctor's cases
    on it; one Check for the start, then one per case (in the order they finish)."""
    return asyncio.run(_run(config, name, report))


async def _run(
    config: BackendConfigBase, name: str, report: Callable[[Check], None] | None
) -> list[Check]:
    from retool_exec.security.host import HostFixtures
    from retool_exec.security.runner import audit_backend, with_audit_limits

    cases = doctor_cases()
    titles = {case.id: case.title for case in cases}
    checks: list[Check] = []

    def add(check: Check) -> None:
        checks.append(check)
        if report is not None:
            report(check)

    with HostFixtures() as host:
        run = await audit_backend(
            name,
            cases,
            host,
            config=with_audit_limits(config, run_id=host.run_id),
            progress=lambda case_report: add(_check(case_report, titles)),
        )
    if not run.reports:  # it never started: the problems say why
        add(Check("start a sandbox", False, "; ".join(run.problems) or "no case ran"))
    else:
        for problem in run.problems:
            add(Check("clean up", False, problem))
    return checks
