"""Session cases without Docker: the runner's steps on the fake backend, and what the
forged-cell predicate does and does not promise (the real runs are in test_security_corpus)."""

from __future__ import annotations

import asyncio
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
)
from retool_exec.security.model import StepAction

pytestmark = pytest.mark.security

SESSION_CASES = [case for case in CORPUS if case.session_steps]
_NEXT = re.compile(r"print\('(rx[0-9a-f]+)' \+ '-next'\)")


def _case(case_id: str) -> Case:
    return next(case for case in CORPUS if case.id == case_id)


def test_the_five_session_cases_are_in_the_corpus() -> None:
    assert {case.id for case in SESSION_CASES} == {
        "iso-session-other-family",
        "iso-session-fork-private",
        "iso-session-family-end",
        "proto-session-forged-cell",
        "res-session-ignores-interrupt",
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


def _stubborn(lose: bool) -> Callable[[FakeCell], ExecResult | str]:
    """A session where the stubborn cell times out, and is killed (``lose``) or not."""

    def cell(c: FakeCell) -> ExecResult | str:
        if "report(stubborn=True)" not in c.code:
            return '{"ready": true}\n'
        return ExecResult(
            ok=False,
            stdout='{"stubborn": true}\n',
            stderr="",
            returncode=None,
            timed_out=True,
            latency=3.0,
            outcome=Outcome.TIMEOUT,
            detail="session lost: killed after its grace" if lose else "",
        )

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
