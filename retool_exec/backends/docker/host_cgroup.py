"""What the host reads of a container in its cgroups: what a gVisor container's own kernel
holds, and whether a container is using the CPU.

Why the memory: under gVisor the kernel a call talks to is the sandbox's Sentry, a Go
process whose heap holds the call's socket and pipe buffers. When the call ends the
Sentry frees them but keeps the memory: 100 unix socket pairs with full 8 MiB buffers
left ~850 MiB of a 1 GiB container held, and the first later call that needed 300 MiB
was killed as ``oom`` (twenty-ninth red-team round). The sandbox's own
``/proc/meminfo``, which the reset compares with its baseline, does not count the
Sentry's heap, so the reset called the container clean. Only the host sees it: the
container's cgroup counts the Sentry's anonymous memory (``total_rss`` under cgroup v1,
``anon`` under v2), against its value when the container became ready.

Why the CPU: a call can keep its own container's agent from answering by its deadline (a
fork bomb under gVisor); the host then tells that from an agent that failed on its own
by whether the container is busy (``busy``).

Read only where the host's cgroup files are (retool_exec on the Docker host, as the
project runs); elsewhere the readers give None, which docs/security.md states.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

TOLERANCE = 32 << 20
"""Bytes of growth over the ready baseline that a reused gVisor container may show before
it is retired: what one call can take from the next at most. The Sentry's heap grows
with use too (~12 MiB over 55 mixed calls of print, numpy, sympy, scipy, threads,
subprocesses and sockets, measured on this project's machine), so a container doing
ordinary work is replaced after ~150 calls instead of ``max_calls_per_container`` (a
start of ~1-2 s each). 64 MiB was too much: the corpus case ``res-agent-starvation``
thrashes 64 MiB under the audit's limit and was killed for memory after earlier cases."""
CGROUP_ROOT = "/sys/fs/cgroup"
BUSY_SAMPLE = 0.3
"""Seconds over which ``busy`` measures the container's CPU use."""
BUSY_SHARE = 0.02
"""The share of one CPU over that time above which a container is busy. An idle container
(its agent stopped or waiting) used 0.0-0.07% of a CPU over 0.3 s, runc and gVisor alike;
twelve fork bombs on two CPUs leave each container a sixth of one on average, which one
sample of 0.1 s against 10% read as idle in 3 of 12 calls (thirtieth red-team round)."""


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


TASK_LIMIT_MARGIN = 64
"""Tasks below a gVisor container's pids limit at which a sample counts as the limit
reached (``TaskLimitHits.reached``): the Sentry died within a sample's interval of its
first refusal in 1 of 8 runs, never seen; such calls' peaks were the limit itself, and a
call's ordinary work stays thousands of tasks below it."""


@dataclass
class TaskLimitHits:
    """A container's pids cgroup on the host: its tasks and how often it refused a new
    one for its limit (``max`` of ``pids.events``).

    Why: under gVisor the Sentry's own host threads count in that cgroup, and a call's
    shell fork bomb grew them past the limit (``hardening.gvisor_pids_limit``): the
    Sentry could not make a thread and died (exit 2, no OOM), the call a
    ``sandbox_error`` in 3 of 5 runs, a failure the call chose (thirty-fourth red-team
    round; finding 47's). Inside, the sandbox's kernel keeps the call's own tasks to
    ``pids``, and the limit leaves room for the Sentry's host tasks of as many live ones
    (``GVISOR_HOST_TASKS_PER_TASK``): only a call's churn of tasks reaches it."""

    directory: str
    limit: int

    def sample(self) -> tuple[int, int] | None:
        """The refusals so far and the tasks now (None: the cgroup is gone)."""
        hits = _read_counter(os.path.join(self.directory, "pids.events"), "max")
        tasks = _read_number(os.path.join(self.directory, "pids.current"))
        return None if hits is None or tasks is None else (hits, tasks)

    def reached(self, tasks: int) -> bool:
        """Whether ``tasks`` is as good as the limit (``TASK_LIMIT_MARGIN``)."""
        return tasks >= self.limit - TASK_LIMIT_MARGIN


def find_task_limit_hits(pid: int) -> TaskLimitHits | None:
    """The pids cgroup of the container whose first process is ``pid`` (None where the
    host's cgroup files are not there, or it has no limit)."""
    for _controllers, directory in _cgroups(pid, "pids"):
        limit = _read_number(os.path.join(directory, "pids.max"))
        hits = TaskLimitHits(directory, limit or 0)
        if limit is not None and hits.sample() is not None:
            return hits
    return None


def _read_number(path: str) -> int | None:
    """A cgroup file's single number (None: unreadable, or "max", no limit)."""
    try:
        with open(path, "rb") as file:
            return int(file.read(64))
    except (OSError, ValueError):
        return None


def find_host_memory(pid: int) -> HostMemory | None:
    """The memory counter of the cgroup holding ``pid`` (the container's first process),
    with its value now as the baseline; None where the host's cgroup files are not there."""
    for controllers, directory in _cgroups(pid, "memory"):
        key = "total_rss" if controllers else "anon"  # v1, else v2
        path = os.path.join(directory, "memory.stat")
        value = _read_counter(path, key)
        if value is not None:
            return HostMemory(path, key, value)
    return None


def busy(pid: int, since: tuple[float, float] | None = None) -> bool | None:
    """Whether the cgroup holding ``pid`` used more than ``BUSY_SHARE`` of a CPU since
    ``since`` (a ``time.monotonic()`` and the cgroup's CPU seconds then), or, without it
    or less than ``BUSY_SAMPLE`` ago, over the next ``BUSY_SAMPLE`` seconds (blocks for
    them); None where it cannot be read."""
    first = cpu_seconds(pid)
    if first is None:
        return None
    if since is not None and time.monotonic() - since[0] >= BUSY_SAMPLE:
        return first - since[1] > BUSY_SHARE * (time.monotonic() - since[0])
    time.sleep(BUSY_SAMPLE)
    second = cpu_seconds(pid)
    return None if second is None else second - first > BUSY_SHARE * BUSY_SAMPLE


def cpu_seconds(pid: int) -> float | None:
    """The CPU seconds the cgroup holding ``pid`` has used (None: not readable here)."""
    for controllers, directory in _cgroups(pid, "cpuacct"):
        if controllers:  # v1: nanoseconds
            try:
                with open(os.path.join(directory, "cpuacct.usage"), "rb") as usage:
                    return int(usage.read(64)) / 1e9
            except (OSError, ValueError):
                continue
        value = _read_counter(os.path.join(directory, "cpu.stat"), "usage_usec")
        if value is not None:
            return value / 1e6
    return None


def _cgroups(pid: int, controller: str) -> list[tuple[str, str]]:
    """The directories on the host of the cgroups holding ``pid``: the v1 hierarchy that
    has ``controller`` (its controllers named), then the v2 one (controllers "").

    Not the hierarchy's root: no container's own, but where the kernel moves an
    exiting process (v1). A dying gVisor sandbox read there as the host's whole CPU
    (13,000 s), and a wait noted so compared any later read as idle."""
    found: list[tuple[str, str]] = []
    for entry in _memberships(pid):
        if len(entry) != 3:
            continue
        _hierarchy, controllers, path = entry
        if path == "/":
            continue
        if controller in controllers.split(","):
            mount = os.path.join(CGROUP_ROOT, controllers)
            if not os.path.isdir(mount):  # (a combined hierarchy may be mounted by one name)
                mount = os.path.join(CGROUP_ROOT, controller)
            found.insert(0, (controllers, os.path.join(mount, path.lstrip("/"))))
        elif controllers == "":
            found.append(("", os.path.join(CGROUP_ROOT, path.lstrip("/"))))
    return found


def _memberships(pid: int) -> list[list[str]]:
    """``/proc/PID/cgroup``'s lines, split (hierarchy, controllers, path); [] if unreadable."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as lines:
            return [line.rstrip("\n").split(":", 2) for line in lines]
    except OSError:
        return []


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
