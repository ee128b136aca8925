"""A case whose attack missed its timing is run again, not reported as an error or a pass:
the runner's retries on the fake backend, with the real inotify neighbour case."""

from __future__ import annotations

import asyncio
import json
import time

from retool_exec import Sandbox
from retool_exec.backends.base import RunRequest
from retool_exec.backends.fake import FakeBackend
from retool_exec.security import CORPUS, CaseReport, HostFixtures, Status, run_case
from retool_exec.security.runner import INCONCLUSIVE_RUNS

_CASE = next(case for case in CORPUS if case.id == "res-inotify-neighbour")


class _Neighbourhood:
    """Answers the attack with a hold and the neighbour with attempts ``late`` (after the
    hold) for the first ``late_runs`` runs, then during it."""

    def __init__(self, late_runs: int, outcome: str = "ok") -> None:
        self.late_runs = late_runs
        self.outcome = outcome
        self.attacks = 0

    def __call__(self, request: RunRequest) -> str:
        now = time.time()
        if "time.sleep(2.5)" in request.code:
            self.attacks += 1
            return json.dumps({"instances": 253, "error": "EMFILE", "held": [now, now + 2.5]})
        if "attempts, deadline" in request.code:
            at = now + (10.0 if self.attacks <= self.late_runs else 0.5)
            return json.dumps({"attempts": [[at, self.outcome], [at + 0.1, self.outcome]]})
        token = request.code.split("'")[1]  # the next call: print('<token>' + '-next')
        return f"{token}-next\n"


def _run(neighbourhood: _Neighbourhood) -> CaseReport:
    async def go() -> CaseReport:
        with HostFixtures() as host:
            async with Sandbox(backend=FakeBackend(neighbourhood), timeout=5) as sandbox:
                return await run_case(sandbox, _CASE, host, backend="fake")

    return asyncio.run(go())


def test_a_run_whose_neighbour_came_late_is_run_again() -> None:
    neighbourhood = _Neighbourhood(late_runs=INCONCLUSIVE_RUNS - 1)
    report = _run(neighbourhood)
    assert report.status is Status.CONTAINED, report.describe()
    assert neighbourhood.attacks == INCONCLUSIVE_RUNS


def test_a_case_inconclusive_every_time_is_an_error_that_says_so() -> None:
    neighbourhood = _Neighbourhood(late_runs=INCONCLUSIVE_RUNS)
    report = _run(neighbourhood)
    assert report.status is Status.ERROR
    assert f"inconclusive in each of {INCONCLUSIVE_RUNS} runs" in report.reasons
    assert neighbourhood.attacks == INCONCLUSIVE_RUNS


def test_a_neighbour_refused_even_after_the_hold_is_exposed_at_once() -> None:
    neighbourhood = _Neighbourhood(late_runs=INCONCLUSIVE_RUNS, outcome="EMFILE")
    report = _run(neighbourhood)
    assert report.status is Status.EXPOSED
    assert neighbourhood.attacks == 1  # an exposure is never run again
