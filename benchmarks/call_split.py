"""The CPU of one reuse call, on its path and after it: what the throughput ratio weighs.

    python benchmarks/call_split.py --code 'print(2+3)' --calls 300
    python benchmarks/call_split.py --code 'import numpy; print(numpy.arange(3).sum())'

One container (a pool of 1), one caller. Around each call it reads the
container's cgroup CPU and each of its processes' CPU (``schedstat``): before
the call, when its result is back, and once the pool has settled (the reset
confirmed, the next spare child forked and waiting). Printed, as medians in
ms per call: the latency; the container's CPU during the call and after it;
the call's own process (its code, its end and its exit, what is left of the
container's CPU during the call); the supervisor's and the zygotes' CPU over
the whole cycle (the supervisor's reset starts as soon as the result is
written, so most of it falls in "during"); and the next spare child's CPU
from its fork to waiting for its request.

Why: at one caller the background work (the reset, the zygote's next fork,
the spare's steps) runs beside the next call, so the one-caller throughput is
about 1 / latency, and at 16 or 64 callers about 2 CPUs / CPU per call;
only CPU that is not on a call's path raises their ratio (issue 16, see
docs/performance.md). Linux: cgroup v1 with Docker's cgroupfs driver, or v2
with its systemd driver; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import statistics
import time

from retool_exec import Sandbox
from retool_exec.backends.config import DockerConfig
from retool_exec.backends.docker.hardening import agent_role
from retool_exec.bench.pools import settle

LABELS = {"org.retool_exec.test": "call-split"}


CGROUPS = (
    ("/sys/fs/cgroup/cpuacct/docker/*/tasks", "cpuacct.usage"),
    ("/sys/fs/cgroup/system.slice/docker-*.scope/cgroup.threads", "cpu.stat"),
)
"""Where a container's tasks and CPU counter are: cgroup v1 (cgroupfs), v2 (systemd)."""


def _cgroup() -> tuple[str, str]:
    """The only container's tasks file and its CPU counter file."""
    found = [
        (tasks, os.path.join(os.path.dirname(tasks), usage))
        for pattern, usage in CGROUPS
        for tasks in glob.glob(pattern)
    ]
    if len(found) != 1:
        raise SystemExit("run it with no other container on the machine")
    return found[0]


def _container_cpu(usage_file: str) -> float:
    with open(usage_file) as handle:
        text = handle.read()
    if usage_file.endswith("cpuacct.usage"):
        return int(text) / 1e9
    fields = dict(line.split() for line in text.splitlines())
    return int(fields["usage_usec"]) / 1e6


def _tasks(tasks_file: str) -> dict[str, tuple[str | None, float]]:
    """Each task of the container: its agent role (None for a call's) and its CPU seconds."""
    found = {}
    with open(tasks_file) as handle:
        pids = handle.read().split()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat") as handle:
                cpu = int(handle.read().split()[0]) / 1e9
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue  # gone meanwhile
        found[pid] = (agent_role(uid), cpu)
    return found


async def _measure(code: str, calls: int) -> dict[str, list[float]]:
    config = DockerConfig(
        policy="reuse", pool_size=1, max_calls_per_container=1_000_000, labels=LABELS
    )
    rows: dict[str, list[float]] = {}
    async with Sandbox(backend=config, max_workers=1) as sandbox:
        for _ in range(30):  # the container's first calls (the zygotes' own first forks)
            await sandbox.arun_code(code)
            await settle(sandbox)
        tasks_file, usage_file = _cgroup()
        for _ in range(calls):
            await asyncio.sleep(0.01)
            cpu0, tasks0 = _container_cpu(usage_file), _tasks(tasks_file)
            started = time.perf_counter()
            await sandbox.arun_code(code)
            latency = time.perf_counter() - started
            cpu1, tasks1 = _container_cpu(usage_file), _tasks(tasks_file)
            await settle(sandbox)
            await asyncio.sleep(0.005)
            cpu2, tasks2 = _container_cpu(usage_file), _tasks(tasks_file)
            agents = [p for p in tasks2 if tasks2[p][0] is not None and p in tasks0 and p in tasks1]
            spares = [p for p in tasks2 if tasks2[p][0] is None and p not in tasks0]
            if len(spares) != 1:
                continue  # a retirement or a stray process: not a plain cycle
            spare = spares[0]
            # The spare may be forked before the second reading: its CPU is not the call's.
            not_the_call = sum(tasks1[p][1] - tasks0[p][1] for p in agents)
            not_the_call += tasks1[spare][1] if spare in tasks1 else 0.0
            cycle = {role: 0.0 for role in ("supervisor", "zygote")}
            for pid in agents:
                cycle[str(tasks2[pid][0])] += tasks2[pid][1] - tasks0[pid][1]
            for name, value in (
                ("latency", latency),
                ("container CPU during the call", cpu1 - cpu0),
                ("container CPU after it", cpu2 - cpu1),
                ("the call's process (code, end, exit)", cpu1 - cpu0 - not_the_call),
                ("supervisor, whole cycle", cycle["supervisor"]),
                ("zygotes, whole cycle", cycle["zygote"]),
                ("next spare, fork to waiting", tasks2[spare][1]),
            ):
                rows.setdefault(name, []).append(value)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", default="print(2+3)")
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    rows = asyncio.run(_measure(args.code, args.calls))
    kept = len(rows.get("latency", []))
    print(f"{args.code!r}: {kept} of {args.calls} calls, medians in ms")
    for name, values in rows.items():
        print(f"  {name:<40} {1000 * statistics.median(values):7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
