"""Whether more callers add throughput, and how busy the machine is while they do not.

    python benchmarks/throughput_ceiling.py --pool-size 8 --concurrency 1,16,64

Starts a docker-reuse pool, runs ``--calls`` ``print(2+3)`` calls in batches of
each concurrency, and prints per batch size the calls per second, how busy the
machine's CPUs were (``/proc/stat`` before and after: everything on the machine,
the containers and dockerd included), the CPU that makes per call, and the CPU
this process used per call. Throughput that stays flat while the CPUs are idle
means a serialization outside the calls' own work. Linux only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import time

from retool_exec import Sandbox
from retool_exec.backends.config import DockerConfig

LABELS = {"org.retool_exec.test": "throughput-ceiling"}
CODE = "print(2+3)"


def machine_ticks() -> tuple[int, int]:
    """All CPU ticks so far, and the idle (idle + iowait) ones, from ``/proc/stat``."""
    with open("/proc/stat") as handle:
        values = [int(value) for value in handle.readline().split()[1:]]
    return sum(values), values[3] + values[4]


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(pool_size: int, levels: list[int], calls: int) -> None:
    config = DockerConfig(policy="reuse", pool_size=pool_size, labels=LABELS)
    async with Sandbox(config, max_workers=max(levels)) as sandbox:
        await asyncio.gather(*(sandbox.arun_code(CODE) for _ in range(pool_size * 2)))
        cpus = os.cpu_count() or 1
        for level in levels:
            batches = max(1, calls // level)
            (all_before, idle_before), mine, started = (
                machine_ticks(),
                own_cpu(),
                time.perf_counter(),
            )
            for _ in range(batches):
                await asyncio.gather(*(sandbox.arun_code(CODE) for _ in range(level)))
            wall, mine = time.perf_counter() - started, own_cpu() - mine
            all_after, idle_after = machine_ticks()
            busy = 1 - (idle_after - idle_before) / max(1, all_after - all_before)
            done = batches * level
            print(
                f"{level:3d} callers: {done / wall:6.0f} calls/s, machine busy {busy:4.0%} of "
                f"{cpus} CPUs, {busy * cpus * wall / done * 1000:.2f} ms CPU per call "
                f"({mine / done * 1000:.2f} ms of it in this process)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--concurrency", default="1,16,64", help="comma list of batch sizes")
    parser.add_argument("--calls", type=int, default=480, help="calls per batch size")
    args = parser.parse_args()
    levels = [int(level) for level in args.concurrency.split(",")]
    asyncio.run(measure(args.pool_size, levels, args.calls))


if __name__ == "__main__":
    main()
