"""What a gVisor container's own kernel holds, read from its memory cgroup on the host.

Why: under gVisor the kernel a call talks to is the sandbox's Sentry, a Go process whose
heap holds the call's socket and pipe buffers. When the call ends the Sentry frees them
but keeps the memory: 100 unix socket pairs with full 8 MiB buffers left ~850 MiB of a
1 GiB container held, and the first later call that needed 300 MiB was killed as ``oom``
(twenty-ninth red-team round). The sandbox's own ``/proc/meminfo``, which the reset
compares with its baseline, does not count the Sentry's heap, so the reset called the
container clean. Only the host sees it: the container's cgroup counts the Sentry's
anonymous memory (``total_rss`` under cgroup v1, ``anon`` under v2), against its value
when the container became ready.

Read only where the host's cgroup files are (retool_exec on the Docker host, as the
project runs); elsewhere ``find_host_memory`` gives None and the check is skipped, which
docs/security.md states.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

log = logging.getLogger(__name__)

TOLERANCE = 64 << 20
"""Bytes of growth over the ready baseline that a reused gVisor container may show before
it is retired: what one call can take from the next at most. The Sentry's heap grows
with use too (~12 MiB over 55 mixed calls of print, numpy, sympy, scipy, threads,
subprocesses and sockets, measured on this project's machine), so a container doing
ordinary work is replaced after a few hundred calls instead of ``max_calls_per_container``."""
CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass
class HostMemory:
    """One container's memory counter on the host, and its value at the baseline."""

    path: str
    key: str
    baseline: int

    def grown(self) -> int | None:
        """Bytes above the baseline now (None: the counter cannot be read)."""
        now = _read_counter(self.path, self.key)
        return None if now is None else now - self.baseline


def find_host_memory(pid: int) -> HostMemory | None:
    """The memory counter of the cgroup holding ``pid`` (the container's first process),
    with its value now as the baseline; None where the host's cgroup files are not there."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as lines:
            entries = [line.rstrip("\n").split(":", 2) for line in lines]
    except OSError:
        return None
    for entry in entries:
        if len(entry) != 3:
            continue
        _hierarchy, controllers, path = entry
        if "memory" in controllers.split(","):  # cgroup v1
            found = _counter(os.path.join(CGROUP_ROOT, "memory", path.lstrip("/")), "total_rss")
        elif controllers == "":  # cgroup v2 (the unified line of a hybrid host has no memory)
            found = _counter(os.path.join(CGROUP_ROOT, path.lstrip("/")), "anon")
        else:
            continue
        if found is not None:
            return found
    return None


def _counter(directory: str, key: str) -> HostMemory | None:
    path = os.path.join(directory, "memory.stat")
    value = _read_counter(path, key)
    return None if value is None else HostMemory(path, key, value)


def _read_counter(path: str, key: str) -> int | None:
    try:
        with open(path, "rb") as stat:
            text = stat.read(1 << 16)
    except OSError:
        return None
    prefix = key.encode() + b" "
    for line in text.splitlines():
        if line.startswith(prefix):
            try:
                return int(line[len(prefix) :])
            except ValueError:
                return None
    return None
