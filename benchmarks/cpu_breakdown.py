"""Where the CPU of a call goes: the client, Docker's daemons, and each agent process.

    python benchmarks/cpu_breakdown.py --code 'print(2+3)' --calls 1500 --callers 16
    python benchmarks/cpu_breakdown.py --policy fresh --calls 60 --callers 16 --pool-size 4
    python benchmarks/cpu_breakdown.py --client --calls 2000

Reuse: the containers' CPU (their cgroups) split into the supervisor, the
zygotes (told apart by uid) and the call processes (the rest), plus this
process and dockerd/containerd/shims, per call, and the containers' page
faults per call (mostly a child's copies of the zygote's pages). Fresh: the CPU of every host
process (children reaped by a process count for it) per call, by command
name, so the container runtime's own cost shows. ``--client``: this process's
CPU per sequential call, by layer (the backend alone, ``arun_code`` on the
sandbox's own loop, ``arun_code`` from another loop as an application calls
it). Linux only; run it on a quiet machine, it reads whole-host counters.
"""

from __future__ import annotations

import argparse
import glob
import os
import time
from collections.abc import Callable
from typing import Any

from retool_exec import Sandbox
from retool_exec.backends.config import DockerConfig
from retool_exec.backends.docker.hardening import agent_role

HZ = os.sysconf("SC_CLK_TCK")
LABELS = {"org.retool_exec.test": "cpu-breakdown"}
DAEMONS = ("dockerd", "containerd", "containerd-shim-runc-v2", "containerd-shim")


def _stat(pid: str) -> list[str]:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rpartition(")")[2].split()


def host_cpu() -> dict[str, tuple[str, int, int]]:
    """pid -> (command, own ticks, own + reaped children's ticks)."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as handle:
                comm = handle.read().strip()
            fields = _stat(pid)
        except OSError:
            continue
        own = int(fields[11]) + int(fields[12])
        found[pid] = (comm, own, own + int(fields[13]) + int(fields[14]))
    return found


def agent_cpu() -> dict[str, tuple[int, int]]:
    """pid -> (uid, ticks) of every agent process (supervisors and zygotes) on the host."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read()
            if b"agent.pyz" not in command and b"agent.supervisor" not in command:
                continue
            with open(f"/proc/{pid}/status") as handle:
                uid = int(next(line for line in handle if line.startswith("Uid")).split()[1])
            fields = _stat(pid)
        except (OSError, StopIteration):
            continue
        found[pid] = (uid, int(fields[11]) + int(fields[12]))
    return found


def containers_cpu() -> float:
    """Seconds of CPU of every Docker container (cgroup v1 cpuacct or v2 cpu.stat)."""
    total = 0.0
    for path in glob.glob("/sys/fs/cgroup/cpuacct/docker/*/cpuacct.usage"):
        with open(path) as handle:
            total += int(handle.read()) / 1e9
    for path in glob.glob("/sys/fs/cgroup/system.slice/docker-*.scope/cpu.stat"):
        with open(path) as handle:
            for line in handle:
                if line.startswith("usage_usec"):
                    total += int(line.split()[1]) / 1e6
    return total


def containers_faults() -> int:
    """Page faults of every Docker container so far (their memory cgroups' ``pgfault``)."""
    total = 0
    for pattern in (
        "/sys/fs/cgroup/memory/docker/*/memory.stat",
        "/sys/fs/cgroup/system.slice/docker-*.scope/memory.stat",
    ):
        for path in glob.glob(pattern):
            with open(path) as handle:
                for line in handle:
                    if line.startswith("pgfault "):
                        total += int(line.split()[1])
    return total


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent not idle (/proc/stat)."""
    with open("/proc/stat") as handle:
        ticks = [int(value) for value in handle.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / HZ


def snapshot() -> tuple[Any, ...]:
    """Every counter ``measure`` compares, read now."""
    return (
        host_cpu(),
        agent_cpu(),
        containers_cpu(),
        time.process_time(),
        busy_seconds(),
        containers_faults(),
    )


def measure(sandbox: Sandbox, code: str, calls: int) -> tuple[float, Callable[[], dict[str, Any]]]:
    sandbox.run_many([code] * 32)
    time.sleep(1.0)
    before = snapshot()
    started = time.perf_counter()
    sandbox.run_many([code] * calls)
    wall = time.perf_counter() - started
    after = snapshot()

    def per_call() -> dict[str, Any]:
        ms = 1000 / calls
        hosts0, agents0, cg0, client0, busy0, faults0 = before
        hosts1, agents1, cg1, client1, busy1, faults1 = after
        roles = {"supervisor": 0, "zygote": 0}
        for pid, (uid, ticks) in agents1.items():
            role = agent_role(uid)
            if pid in agents0 and role is not None:
                roles[role] += ticks - agents0[pid][1]
        daemons = sum(
            hosts1[p][1] - hosts0[p][1] for p in hosts1 if p in hosts0 and hosts1[p][0] in DAEMONS
        )
        by_command: dict[str, float] = {}
        for pid, (comm, _own, total) in hosts1.items():
            by_command[comm] = by_command.get(comm, 0) + total - hosts0.get(pid, (comm, 0, 0))[2]
        return {
            "containers": (cg1 - cg0) * ms,
            "supervisor": roles["supervisor"] / HZ * ms,
            "zygote": roles["zygote"] / HZ * ms,
            "client": (client1 - client0) * ms,
            "daemons": daemons / HZ * ms,
            "machine": (busy1 - busy0) * ms,
            "faults": (faults1 - faults0) / calls,
            "by_command": {k: v / HZ * ms for k, v in by_command.items()},
        }

    return calls / wall, per_call


def client_layers(sandbox: Sandbox, code: str, calls: int) -> dict[str, float]:
    """This process's CPU ms per sequential call, measured at each layer in turn."""
    import asyncio

    from retool_exec.backends.base import RunRequest

    request = RunRequest(code=code, timeout=30.0)

    async def timed(call: Callable[[], Any]) -> float:
        for _ in range(50):
            await call()
        started = time.process_time()
        for _ in range(calls):
            await call()
        return (time.process_time() - started) / calls * 1000

    return {
        "backend.run on the sandbox's loop": sandbox._call_in_loop(
            timed(lambda: sandbox.backend.run(request))
        ),
        "arun_code on the sandbox's loop": sandbox._call_in_loop(
            timed(lambda: sandbox.arun_code(code))
        ),
        "arun_code from another loop": asyncio.run(timed(lambda: sandbox.arun_code(code))),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", default="print(2+3)")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--policy", choices=("reuse", "fresh"), default="reuse")
    parser.add_argument("--runtime", default=None)
    parser.add_argument("--client", action="store_true", help="the client's CPU by layer")
    parser.add_argument(
        "--max-calls",
        type=int,
        default=1_000_000,
        help="max_calls_per_container (default: none retired, so the per-container "
        "figures hold; with retirements only the machine's total is meaningful)",
    )
    args = parser.parse_args()
    # By default no container is retired mid-run (its cgroup, and its CPU, would vanish).
    config = DockerConfig(
        policy=args.policy,
        pool_size=args.pool_size,
        runtime=args.runtime,
        labels=LABELS,
        max_calls_per_container=args.max_calls,
    )
    with Sandbox(backend=config, max_workers=args.callers) as sandbox:
        if args.client:
            for layer, value in client_layers(sandbox, args.code, args.calls).items():
                print(f"  {layer:<36} {value:.3f} ms per call")
            return 0
        rate, per_call = measure(sandbox, args.code, args.calls)
    figures = per_call()
    print(
        f"{rate:.1f} calls/s, {args.callers} callers, {args.policy}; CPU ms per call: "
        f"the whole machine {figures['machine']:.2f}"
    )
    if args.policy == "reuse":
        children = figures["containers"] - figures["supervisor"] - figures["zygote"]
        print(
            f"  containers {figures['containers']:.2f} (supervisor {figures['supervisor']:.2f}, "
            f"zygote {figures['zygote']:.2f}, call processes {children:.2f}), "
            f"client {figures['client']:.2f}, docker daemons {figures['daemons']:.2f}"
        )
        print(f"  page faults per call in the containers: {figures['faults']:.0f}")
    else:
        top = sorted(figures["by_command"].items(), key=lambda item: -item[1])[:8]
        for command, value in top:
            print(f"  {command:<28} {value:7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
