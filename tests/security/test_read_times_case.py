"""What the ``iso-read-times`` predicate excuses: another container's own set-up, never a
time in the same container (pure; the real runs are in test_security_corpus)."""

from __future__ import annotations

import json

import pytest

from retool_exec._models import ExecResult
from retool_exec.security import CORPUS, CaseContext, HostFacts, Observation

pytestmark = pytest.mark.security

CASE = next(case for case in CORPUS if case.id == "iso-read-times")
START = 179_662_435_000  # call N's reads: ticks 179_662_435_000 .. 179_662_435_010
HOME = {"id": [2097301, ["1796558816"], 6553956], "started": START - 5_000}


def _result(facts: dict[str, object]) -> ExecResult:
    stdout = json.dumps(facts) + "\n"
    return ExecResult(ok=True, stdout=stdout, stderr="", returncode=0, timed_out=False, latency=0.1)


def _contained(follow_ticks: list[int], follow_container: dict[str, object]) -> bool:
    attack = {"start": START * 10**7, "end": (START + 10) * 10**7, "read": 9, "container": HOME}
    follow = {"ticks": follow_ticks, "container": follow_container}
    host = HostFacts("h", "C", "v", "/s", "/p", 1, 2, "u")
    ctx = CaseContext(token="rx0123456789", backend="x", gvisor=False, timeout=5, host=host)
    return CASE.contained(Observation(result=_result(attack), follow=_result(follow), ctx=ctx))


def test_a_time_of_call_ns_reads_in_its_own_container_is_exposed() -> None:
    assert _contained([START - 400, START + 20], HOME)
    assert not _contained([START + 4], HOME)


def test_the_next_containers_own_set_up_during_the_reads_is_excused() -> None:
    other = {"id": [2097289, ["1796558816"], 6553999], "started": START + 3}
    assert _contained([START + 1, START + 4], other)


def test_another_container_started_long_before_excuses_nothing_of_the_reads() -> None:
    other = {"id": [2097289, ["1796558816"], 6553952], "started": START - 5_000}
    assert not _contained([START + 4], other)
