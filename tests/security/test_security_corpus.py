"""The attack corpus against every backend: hardened containers contain every case.

Parametrized over local, docker-fresh, docker-reuse and docker-runsc. The
local backend (the seed's subprocess) is expected to be exposed wherever a
subprocess cannot contain an attack: those cases are strictly expected to
fail, so this suite proves it can fail. Cases that would really harm this
shared machine (bombs, disk fills) are not run locally. A hole found in a
Docker backend is listed in ``KNOWN_HOLES`` (and in docs/security.md) and
strictly expected to fail until it is fixed: the suite stays honest, and
turns red the day the fix lands so the entry gets removed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from retool_exec.security import BACKEND_IDS, CORPUS, CaseReport, Expect, Status

pytestmark = pytest.mark.security

# (io_uring under Docker 20.10's seccomp profile, the agent's /proc entries and
# signals under gVisor, POSIX queues and the inode cap under gVisor were listed
# here until the agent got its own uid and the calls their own seccomp layer;
# see docs/security.md.)
KNOWN_HOLES: dict[tuple[str, str], str] = {}


class CaseExposed(AssertionError):
    """The backend did not contain the case (the attack or an invariant got through)."""


def _marks(
    backend: str, case_id: str, expect: Expect, skip_reason: str
) -> list[pytest.MarkDecorator]:
    marks: list[pytest.MarkDecorator] = []
    if backend != "local":
        marks.append(pytest.mark.docker)
        if backend == "docker-runsc":
            marks.append(pytest.mark.gvisor)
        hole = KNOWN_HOLES.get((backend, case_id))
        if hole:
            marks.append(pytest.mark.xfail(strict=True, raises=CaseExposed, reason=hole))
        return marks
    if skip_reason:
        marks.append(pytest.mark.skip(reason=skip_reason))
    elif expect is Expect.HOST_DEPENDENT:
        marks.append(pytest.mark.skip(reason="depends on this host's configuration (not root)"))
    elif expect is Expect.EXPOSED:
        marks.append(
            pytest.mark.xfail(
                strict=True, raises=CaseExposed, reason="a plain subprocess cannot contain this"
            )
        )
    return marks


def _params() -> Iterator[object]:
    for backend in BACKEND_IDS:
        for case in CORPUS:
            yield pytest.param(
                backend,
                case.id,
                id=f"{backend}:{case.id}",
                marks=_marks(backend, case.id, case.local_expectation(), case.local_skip_reason()),
            )


@pytest.mark.parametrize(("backend_id", "case_id"), list(_params()))
def test_case_is_contained(
    backend_id: str, case_id: str, security_reports: Callable[[str], dict[str, CaseReport]]
) -> None:
    report = security_reports(backend_id)[case_id]
    if report.status is Status.EXPOSED:
        raise CaseExposed(report.describe())
    assert report.status is Status.CONTAINED, report.describe()


def test_known_holes_name_real_cases() -> None:
    ids = {case.id for case in CORPUS}
    assert {case_id for _, case_id in KNOWN_HOLES} <= ids
    assert {backend for backend, _ in KNOWN_HOLES} <= set(BACKEND_IDS) - {"local"}
