"""Session cases: the runner's steps on the fake backend, what the forged-cell predicate
does and does not promise, and (Docker) weakened scripts of each case getting the verdict
they should, which shows each case can fail. The real runs are in test_security_corpus."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable

import pytest

from retool_exec import Sandbox
from retool_exec._errors import SessionsUnsupportedError
from retool_exec._models import CellResult, ExecResult, Outcome
from retool_exec.backends.base import Backend, RunRequest
from retool_exec.backends.fake import FakeBackend, FakeCell, FakeSession
from retool_exec.security import (
    CORPUS,
    Case,
    CaseContext,
    CaseReport,
    HostFacts,
    HostFixtures,
    Observation,
    Status,
    run_case,
    with_audit_limits,
)
from retool_exec.security.model import SessionStep, StepAction
from tests.conftest import backend_config, require_docker

pytestmark = pytest.mark.security

SESSION_CASES = [case for case in CORPUS if case.session_steps]
_NEXT = re.compile(r"print\('(rx[0-9a-f]+)' \+ '-next'\)")


def _case(case_id: str) -> Case:
    return next(case for case in CORPUS if case.id == case_id)


def test_the_session_cases_are_in_the_corpus() -> None:
    assert {case.id for case in SESSION_CASES} == {
        "iso-session-other-family",
        "iso-session-fork-private",
        "iso-session-family-end",
        "proto-session-forged-cell",
        "proto-session-fork-announced-by-its-middle",
        "res-session-ignores-interrupt",
        "proto-session-events-deep-nesting",
        "proto-session-stops-reading",
        "proto-session-surrogate-value",
        "proto-session-fork-forged-pid",
        "res-session-fork-deep-tree",
        "proto-session-peeked-cells",
        "proto-session-leader-thread-exits",
        "proto-session-oversized-cell-end",
    }
    for case in SESSION_CASES:
        assert case.exclusive  # a family holds a container: not beside other cases
        opened = {s.session for s in case.session_steps if s.action is StepAction.OPEN}
        forked = {s.session for s in case.session_steps if s.action is StepAction.FORK}
        for step in case.session_steps:
            if step.action in (StepAction.CELL, StepAction.CLOSE):
                assert step.session in opened | forked, (case.id, step)
            if step.action is StepAction.FORK:
                assert step.parent in opened | forked, (case.id, step)


def _next_call(request: RunRequest) -> str:
    match = _NEXT.search(request.code)
    return f"{match.group(1)}-next\n" if match else ""


def _run(backend: Backend, case_id: str) -> CaseReport:
    async def go() -> CaseReport:
        with HostFixtures() as host:
            async with Sandbox(backend=backend, timeout=5) as sandbox:
                return await run_case(sandbox, _case(case_id), host, backend="fake")

    return asyncio.run(go())


def _timed_out(stdout: str, latency: float, detail: str = "") -> ExecResult:
    """A cell's timeout, as a real backend reports it."""
    return ExecResult(
        ok=False,
        stdout=stdout,
        stderr="",
        returncode=None,
        timed_out=True,
        latency=latency,
        outcome=Outcome.TIMEOUT,
        detail=detail,
    )


def _stubborn(lose: bool) -> Callable[[FakeCell], ExecResult | str]:
    """A session where the stubborn cell times out, and is killed (``lose``) or not."""

    def cell(c: FakeCell) -> ExecResult | str:
        if "report(stubborn=True)" not in c.code:
            return '{"ready": true}\n'
        detail = "session lost: killed after its grace" if lose else ""
        return _timed_out('{"stubborn": true}\n', 3.0, detail)

    return cell


def test_a_session_killed_after_its_grace_is_contained() -> None:
    backend = FakeBackend(_next_call, session_handler=_stubborn(lose=True))
    report = _run(backend, "res-session-ignores-interrupt")
    assert report.status is Status.CONTAINED, report.describe()
    # open, setup, the stubborn cell; then the next cell and the fork were refused
    assert len(backend.cells) == 2
    assert len(backend.sessions) == 1


def test_a_session_that_lives_on_after_its_timeout_is_exposed() -> None:
    backend = FakeBackend(_next_call, session_handler=_stubborn(lose=False))
    report = _run(backend, "res-session-ignores-interrupt")
    assert report.status is Status.EXPOSED
    assert "the attack got through" in report.reasons


class _NoSessions(FakeBackend):
    async def open_session(self, *, memory_mb: int | None = None) -> FakeSession:
        raise SessionsUnsupportedError("this backend has no sessions")


def test_a_backend_without_sessions_skips_the_session_cases() -> None:
    report = _run(_NoSessions(_next_call), "iso-session-fork-private")
    assert report.status is Status.SKIPPED
    assert "has no sessions" in report.reasons[0]


def test_every_step_runs_and_every_open_session_is_closed() -> None:
    def cell(c: FakeCell) -> str:
        return '{"state": "?"}\n'

    backend = FakeBackend(_next_call, session_handler=cell)
    report = _run(backend, "iso-session-fork-private")
    assert report.status is Status.EXPOSED  # the fake's answers are not the expected state
    assert [s.parent for s in backend.sessions] == [None, 1, 1]
    assert len(backend.cells) == 4
    assert all(s.closed for s in backend.sessions)  # all closed by the runner


def _stops_late(late_runs: int) -> tuple[FakeBackend, list[str]]:
    """proto-session-stops-reading on the fake: the big cell runs to its end (the stop
    never landed) for the first ``late_runs`` runs, then times out on time."""
    seen: list[str] = []

    def cell(c: FakeCell) -> ExecResult | str:
        if "the big cell ran" not in c.code:
            return '{"stopping": true}\n'
        seen.append("big")
        if len(seen) <= late_runs:
            return "the big cell ran\n"
        return _timed_out("", 3.2)

    return FakeBackend(_next_call, session_handler=cell), seen


def test_a_stop_that_never_landed_is_run_again_not_exposed() -> None:
    backend, seen = _stops_late(late_runs=1)
    report = _run(backend, "proto-session-stops-reading")
    assert report.status is Status.CONTAINED, report.describe()
    assert len(seen) == 2


def test_a_stop_that_never_lands_is_an_error_not_a_pass() -> None:
    backend, _ = _stops_late(late_runs=99)
    report = _run(backend, "proto-session-stops-reading")
    assert report.status is Status.ERROR
    assert any("inconclusive in each of" in reason for reason in report.reasons)


# -- what proto-session-forged-cell promises ------------------------------------------------


def _context() -> CaseContext:
    host = HostFacts("h", "C", "v", "/s", "/p", 1, 2, "u")
    return CaseContext(token="rx0123456789", backend="x", gvisor=False, timeout=5, host=host)


def _cell_result(
    stdout: str, stderr: str, display: list[dict[str, str]], error: list[str], detail: str = ""
) -> ExecResult:
    errors = [{"ename": name, "evalue": "", "traceback": []} for name in error]
    return ExecResult(
        ok=not error,
        stdout=stdout,
        stderr=stderr,
        returncode=1 if error else 0,
        timed_out=False,
        latency=0.01,
        detail=detail,
        cells=[CellResult(stdout=stdout, stderr=stderr, display=display, error=errors)],
    )


_TRACE = "Traceback (most recent call last):\nZeroDivisionError: division by zero\n"


def _forged_observation(first: ExecResult | None, second: ExecResult | None) -> Observation:
    cells = {"attack": _cell_result('{"written": {}}\n', "", [], [])}
    refused = {}
    for name, result in (("victim-1", first), ("victim-2", second)):
        if result is None:
            refused[name] = "SessionLostError: this session is gone: it broke its event stream"
        else:
            cells[name] = result
    return Observation(
        result=cells["attack"], follow=None, ctx=_context(), cells=cells, refused=refused
    )


def _judge(first: ExecResult | None, second: ExecResult | None) -> bool:
    return _case("proto-session-forged-cell").contained(_forged_observation(first, second))


OWN_FIRST = _cell_result("victim-out-1\n", "victim-err-1\n", [{"text/plain": "42"}], [])
OWN_SECOND = _cell_result("victim-out-2\n", _TRACE, [], ["ZeroDivisionError"])


def test_own_records_are_contained_with_the_leftover_threads_lines_in_them() -> None:
    assert _judge(OWN_FIRST, OWN_SECOND)
    # A thread cell 1 left is the interpreter's state: its lines land in the running cell.
    leftover = "LEFTOVER-rx0123456789 3\nvictim-out-1\nLEFTOVER-rx0123456789 4\n"
    first = _cell_result(leftover, "victim-err-1\n", [{"text/plain": "42"}], [])
    assert _judge(first, OWN_SECOND)


def test_an_explicitly_lost_session_forges_nothing() -> None:
    lost = _cell_result("", "", [], [], detail="session lost: it broke its event stream")
    lost = lost.model_copy(update={"cells": []})
    assert _judge(lost, None)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        # cell 1's fake cell_end taken for victim 1's
        (_cell_result("", "", [{"text/plain": "FORGED-rx0123456789"}], []), OWN_SECOND),
        # records shifted by one: victim 2 shows victim 1's display, victim 1 cell 1's output
        (_cell_result('{"written": {}}\n', "", [], []), OWN_FIRST),
        # an error hidden
        (OWN_FIRST, _cell_result("victim-out-2\n", "", [], [])),
        # a forged status line in the output
        (_cell_result("victim-out-1\nFORGED-rx0123456789\n", "victim-err-1\n", [], []), OWN_SECOND),
    ],
)
def test_a_forged_or_shifted_record_is_exposed(first: ExecResult, second: ExecResult) -> None:
    assert not _judge(first, second)


# -- the Docker cases can fail: weakened scripts of them are exposed ---------------------------

_TO_PARENT = "    os.chdir(os.path.join(os.path.dirname(os.getcwd()), 'session-1'))\n"


def _weakened() -> list[tuple[Case, Status]]:
    """Each case with its isolation taken away (and the forgery case's control): the
    verdict each must get on Docker, which shows the predicate reads a real invariant."""
    from retool_exec.security.cases import sessions as s

    def script(case_id: str, *steps: SessionStep) -> Case:
        return dataclasses.replace(_case(case_id), id=f"{case_id}-weakened", session_steps=steps)

    skip_fd_3 = s._FORGE.replace(
        "        fd = int(entry)\n",
        "        fd = int(entry)\n        if fd == 3:\n            continue\n",
    )
    back_home = "\n    os.chdir(os.path.join(os.path.dirname(os.getcwd()), 'session-2'))\n"
    return [
        # B is a fork of A, not a family of its own: same container, same /tmp
        (
            script(
                "iso-session-other-family",
                s._open("a"),
                s._fork("a", "b"),
                s._cell("a", "plant", s._PLANT),
                s._cell("b", "attack", s._SEARCH, timeout=15),
                s._cell("a", "alive", s._PLANT_ALIVE),
            ),
            Status.EXPOSED,
        ),
        # no fork: the parent makes the changes itself
        (
            script(
                "iso-session-fork-private",
                s._open("p"),
                s._cell("p", "setup", s._SETUP),
                s._fork("p", "c2"),
                s._cell("p", "attack", s._CHANGE),
                s._cell("p", "parent", s._LOOK),
                s._cell("c2", "sibling", s._LOOK),
            ),
            Status.EXPOSED,
        ),
        # the fork writes its parent's files by absolute path (not separated in a family)
        (
            script(
                "iso-session-fork-private",
                s._open("p"),
                s._cell("p", "setup", s._SETUP),
                s._fork("p", "c1"),
                s._fork("p", "c2"),
                s._cell(
                    "c1",
                    "attack",
                    _TO_PARENT + s._CHANGE.replace("\n    report(", back_home + "    report("),
                ),
                s._cell("p", "parent", s._LOOK),
                s._cell("c2", "sibling", s._LOOK),
            ),
            Status.EXPOSED,
        ),
        # the "next family" is a fork of the first, whose container lives on
        (
            script(
                "iso-session-family-end",
                s._open("a"),
                s._cell("a", "plant", s._LEAVE),
                s._fork("a", "b"),
                s._cell("b", "attack", s._LOOK_LEFT),
            ),
            Status.EXPOSED,
        ),
        # control: the same forger leaving fd 3 alone (its thread's lines are allowed)
        (
            script(
                "proto-session-forged-cell",
                s._open("s"),
                s._cell("s", "attack", skip_fd_3),
                s._cell("s", "victim-1", s._VICTIM_1),
                s._cell("s", "victim-2", s._VICTIM_2),
            ),
            Status.CONTAINED,
        ),
        # a cell that stops on KeyboardInterrupt: the session rightly lives on
        (
            script(
                "res-session-ignores-interrupt",
                s._open("s"),
                s._cell("s", "setup", "value = 41\nreport(ready=True)\n"),
                s._cell("s", "attack", "n = 0\nwhile True:\n    n += 1\n", timeout=2.0),
                s._cell("s", "after", "print(value + 1)\n"),
                SessionStep(StepAction.FORK, "s2", parent="s", name="fork-after"),
            ),
            Status.EXPOSED,
        ),
    ]


@pytest.mark.docker
def test_weakened_session_cases_get_the_verdict_they_should() -> None:
    require_docker()
    config = with_audit_limits(backend_config("docker-reuse", timeout=5.0))

    async def go() -> list[tuple[CaseReport, Status]]:
        with HostFixtures() as host:
            async with Sandbox(config, timeout=5.0) as sandbox:
                return [
                    (await run_case(sandbox, case, host, backend="docker-reuse"), want)
                    for case, want in _weakened()
                ]

    for report, want in asyncio.run(go()):
        assert report.status is want, report.describe()
