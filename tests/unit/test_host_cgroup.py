"""The host's reading of a container's cgroups (no Docker needed)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from retool_exec.backends.docker import host_cgroup
from retool_exec.backends.docker.host_cgroup import HostMemory, busy, find_host_memory


def test_growth_is_read_against_the_baseline(tmp_path: Path) -> None:
    stat = tmp_path / "memory.stat"
    stat.write_text("cache 100\ntotal_rss_huge 0\ntotal_rss 4096\n")
    watched = HostMemory(str(stat), "total_rss", 1024)
    assert watched.grown() == 3072  # (not total_rss_huge: the key and a space)
    stat.write_text("cache 100\n")
    assert watched.grown() is None
    stat.unlink()
    assert watched.grown() is None


def test_a_process_without_a_readable_cgroup_gives_none() -> None:
    assert find_host_memory(2**22 + 12345) is None  # no such pid


def test_this_process_s_own_cgroup_is_found_where_the_host_has_the_files() -> None:
    found = find_host_memory(os.getpid())
    if found is not None:  # (a container running the tests may have no cgroup files)
        assert found.key in {"total_rss", "anon"}
        assert found.grown() is not None


def test_a_process_without_a_readable_cgroup_is_neither_busy_nor_idle() -> None:
    assert busy(2**22 + 12345) is None  # no such pid: the host then treats it as busy


def test_busy_since_a_noted_point_measures_the_whole_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A starved container does little in any short sample but much over the grace: the
    window from the agent's lateness decides, without a sample (thirtieth round)."""
    monkeypatch.setattr(host_cgroup, "cpu_seconds", lambda pid: 10.5)
    monkeypatch.setattr(host_cgroup.time, "sleep", _no_sample)
    now = time.monotonic()
    assert busy(1, since=(now - 1.5, 10.0)) is True  # 0.5 s of CPU in 1.5 s
    assert busy(1, since=(now - 1.5, 10.49)) is False  # 10 ms in 1.5 s: idle


def test_busy_samples_when_the_noted_point_is_too_recent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readings = iter([10.0, 10.0])
    monkeypatch.setattr(host_cgroup, "cpu_seconds", lambda pid: next(readings))
    slept: list[float] = []
    monkeypatch.setattr(host_cgroup.time, "sleep", slept.append)
    assert busy(1, since=(time.monotonic(), 0.0)) is False
    assert slept == [host_cgroup.BUSY_SAMPLE]


def _no_sample(seconds: float) -> None:
    raise AssertionError(f"sampled for {seconds} s where the window was given")


def test_a_pids_cgroup_reads_its_refusals_and_tasks_and_nothing_once_gone(tmp_path: Path) -> None:
    """What the host samples while a gVisor call's agent is silent (``TaskLimitHits``)."""
    (tmp_path / "pids.events").write_text("max 3\n")
    (tmp_path / "pids.current").write_text("4100\n")
    hits = host_cgroup.TaskLimitHits(str(tmp_path), 4160)
    assert hits.sample() == (3, 4100)
    assert hits.reached(4100) and hits.reached(4160) and not hits.reached(3000)
    (tmp_path / "pids.current").unlink()  # the container's cgroup removed with it
    assert hits.sample() is None


def test_a_process_moved_to_the_hierarchys_root_is_not_read_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under cgroup v1 the kernel moves an exiting process to the root: a dying gVisor
    sandbox was read as the host's whole CPU (13,000 s), and a wait that noted that
    found the container idle after (thirty-fifth session's reproduction)."""
    (tmp_path / "cpuacct" / "docker" / "c1").mkdir(parents=True)
    (tmp_path / "cpuacct" / "cpuacct.usage").write_text("13000000000000\n")
    (tmp_path / "cpuacct" / "docker" / "c1" / "cpuacct.usage").write_text("2500000000\n")
    monkeypatch.setattr(host_cgroup, "CGROUP_ROOT", str(tmp_path))
    lines = {1: "2:cpuacct:/docker/c1\n0::/\n", 2: "2:cpuacct:/\n0::/\n"}
    monkeypatch.setattr(
        host_cgroup,
        "_memberships",
        lambda pid: [line.split(":", 2) for line in lines[pid].splitlines()],
    )
    assert host_cgroup.cpu_seconds(1) == 2.5
    assert host_cgroup.cpu_seconds(2) is None
