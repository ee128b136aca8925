"""Fixtures of the security suite: one sandbox per backend, and one corpus run per backend.

Each backend's sandbox (``tests.conftest.backend_config`` with the audit's
modest limits, see ``retool_exec.security.runner.AUDIT_LIMITS``) is created
once per session and closed at its end. The whole corpus runs on it once,
the way ``retool-exec audit`` runs it (concurrently where cases allow, bombs
one at a time, every invariant checked after every case); each test then
asserts one case's verdict. That keeps four backends x 80+ cases within a
few minutes on a 2-core machine.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterator

import pytest

from retool_exec import Sandbox
from retool_exec.backends.config import DockerConfig
from retool_exec.backends.docker.hardening import is_gvisor
from retool_exec.security import (
    CORPUS,
    CaseReport,
    HostFixtures,
    run_backend,
    with_audit_limits,
)
from retool_exec.security.runner import DEFAULT_TIMEOUT, default_concurrency
from tests.conftest import backend_config, require_docker

Reports = dict[str, CaseReport]


@pytest.fixture(scope="session")
def security_sandboxes() -> Iterator[dict[str, Sandbox]]:
    """Started sandboxes by backend id, closed at the end of the session."""
    sandboxes: dict[str, Sandbox] = {}
    yield sandboxes
    for sandbox in sandboxes.values():
        sandbox.close()


def _security_sandbox(backend_id: str, sandboxes: dict[str, Sandbox]) -> Sandbox:
    if backend_id not in sandboxes:
        config = with_audit_limits(backend_config(backend_id, timeout=DEFAULT_TIMEOUT))
        sandbox = Sandbox(config, timeout=DEFAULT_TIMEOUT)
        sandboxes[backend_id] = sandbox
        sandbox.start()
    return sandboxes[backend_id]


async def _run_corpus(sandbox: Sandbox, backend_id: str) -> list[CaseReport]:
    config = with_audit_limits(backend_config(backend_id, timeout=DEFAULT_TIMEOUT))
    gvisor = isinstance(config, DockerConfig) and is_gvisor(config.runtime)
    with HostFixtures() as host:
        if backend_id == "local":
            with host.adopting_orphans():
                return await run_backend(sandbox, CORPUS, host, backend=backend_id)
        return await run_backend(
            sandbox,
            CORPUS,
            host,
            backend=backend_id,
            gvisor=gvisor,
            concurrency=default_concurrency(config),
        )


@pytest.fixture(scope="session")
def security_reports(
    security_sandboxes: dict[str, Sandbox],
) -> Callable[[str], Reports]:
    """``get(backend_id)``: that backend's verdict per case id (the corpus runs on first use)."""
    cache: dict[str, Reports] = {}
    failures: dict[str, str] = {}

    def get(backend_id: str) -> Reports:
        if backend_id != "local":
            require_docker()
        if backend_id in failures:
            pytest.fail(failures[backend_id], pytrace=False)
        if backend_id not in cache:
            try:
                sandbox = _security_sandbox(backend_id, security_sandboxes)
                reports = asyncio.run(_run_corpus(sandbox, backend_id))
                # Something the run left unclosed warns now, against this backend,
                # instead of at whichever later test a garbage collection falls in.
                gc.collect()
            except Exception as exc:
                failures[backend_id] = f"could not run the corpus on {backend_id}: {exc!r}"
                raise
            cache[backend_id] = {report.case_id: report for report in reports}
        return cache[backend_id]

    return get
