"""What the ``iso-read-times`` predicate excuses: in another container, the times of the
inodes that container alone has (its /dev, its mount points); never a time of an inode
call N's container may share, nor any in the same container (pure; the real runs are in
test_security_corpus)."""

from __future__ import annotations

import json

import pytest

from retool_exec._models import ExecResult
from retool_exec.security import CORPUS, CaseContext, HostFacts, Observation

pytestmark = pytest.mark.security

CASE = next(case for case in CORPUS if case.id == "iso-read-times")
START = 179_662_435_000  # call N's reads: ticks 179_662_435_000 .. 179_662_435_010
MOUNTS = ["/", "/dev", "/etc/hostname", "/tmp"]
HOME = {"id": [2097301, ["1796558816"], "6553956"], "mounts": MOUNTS}
OTHER = {"id": [2097289, ["1796558816"], "6553952"], "mounts": MOUNTS}


def _result(facts: dict[str, object]) -> ExecResult:
    stdout = json.dumps(facts) + "\n"
    return ExecResult(ok=True, stdout=stdout, stderr="", returncode=0, timed_out=False, latency=0.1)


def _contained(ticks: dict[str, int], follow_container: dict[str, object]) -> bool:
    attack = {"start": START * 10**7, "end": (START + 10) * 10**7, "read": 9, "container": HOME}
    follow = {"ticks": ticks, "container": follow_container}
    host = HostFacts("h", "C", "v", "/s", "/p", 1, 2, "u")
    ctx = CaseContext(token="rx0123456789", backend="x", gvisor=False, timeout=5, host=host)
    return CASE.contained(Observation(result=_result(attack), follow=_result(follow), ctx=ctx))


def test_in_the_same_container_any_time_within_the_reads_is_exposed() -> None:
    assert _contained({"/dev/null": START - 400, "/etc/passwd": START + 20}, HOME)
    assert not _contained({"/dev/null": START + 4}, HOME)
    assert not _contained({"/etc/hostname": START + 4}, HOME)


def test_in_another_container_its_own_inodes_are_its_set_up() -> None:
    own = {"/dev": START + 3, "/dev/pts/ptmx": START + 4, "/etc/hostname": START + 5, "/": START}
    own |= {"/etc/mtab": START + 2, "/.dockerenv": START + 2}
    assert _contained(own, OTHER)


def test_in_another_container_a_shared_inode_within_the_reads_is_exposed() -> None:
    assert not _contained({"/dev/null": START + 3, "/etc/passwd": START + 4}, OTHER)
