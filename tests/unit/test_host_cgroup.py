"""The host's reading of a container's cgroups (no Docker needed)."""

from __future__ import annotations

import os
from pathlib import Path

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
