"""Figures beyond the latency matrix: the fresh policy, client CPU, pool memory, sessions.

- **fresh, pool not drained**: sequential calls on ``docker-fresh``, each made
  only once the pool is full again (the wait is not counted), paired
  call-by-call with the local backend for the ratio.
- **fresh, pool drained**: many concurrent callers on a small fresh pool; the
  sustained rate is what container starts allow.
- **client CPU per call**: ``time.process_time()`` (this process, every
  thread) over N sequential calls, divided by N; for ``fresh`` this includes
  creating and removing the replacement containers.
- **memory**: what the warm containers of each Docker pool hold.
- **sessions**: a warm cell against a stateless call, a multi-turn conversation
  with and without a session, and ``fork()`` of a 100 MB session, on every
  backend that has sessions (``retool_exec.bench.sessions``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from retool_exec._sandbox import Sandbox
from retool_exec.bench import sessions
from retool_exec.bench.backends import LOCAL, bench_config, is_docker
from retool_exec.bench.pools import read_pool_memory, settle
from retool_exec.bench.progress import Progress
from retool_exec.bench.results import (
    BenchResult,
    BenchSettings,
    CpuPerCall,
    FreshSustained,
    FreshUndrained,
)
from retool_exec.bench.stats import steady_throughput
from retool_exec.bench.workloads import WORKLOADS, Workload

__all__ = ["UNDRAINED_WORKLOADS", "measure_all", "planned_calls"]

FRESH = "docker-fresh"
UNDRAINED_WORKLOADS = ("print", "sympy")
_CPU_CODE = "print(2+3)"
_BY_NAME = {w.name: w for w in WORKLOADS}


def planned_calls(settings: BenchSettings, workload_names: Sequence[str]) -> int:
    """Calls the extra measurements make (for the progress bar)."""
    total = settings.cpu_calls * len(settings.backends) + sessions.planned_calls(settings)
    if FRESH in settings.backends:
        undrained = [n for n in UNDRAINED_WORKLOADS if n in workload_names]
        pairs = 2 if LOCAL in settings.backends else 1
        total += settings.undrained_calls * len(undrained) * pairs
        total += settings.sustained_calls
    return total


async def fresh_undrained(
    sandboxes: Mapping[str, Sandbox], workload: Workload, calls: int, progress: Progress
) -> FreshUndrained:
    """Sequential fresh calls with a full pool each time, paired with local calls."""
    fresh = sandboxes[FRESH]
    local = sandboxes.get(LOCAL)
    record = FreshUndrained(workload=workload.name)
    for index in range(calls):
        # Alternate who goes first, so neither always runs right after the other.
        for turn in (0, 1) if index % 2 == 0 else (1, 0):
            if turn == 0 and local is not None:
                result = await local.arun_code(workload.code, timeout=workload.timeout)
                record.local_latencies.append(result.latency)
                progress.advance()
            elif turn == 1:
                record.refill_waits.append(await settle(fresh))
                result = await fresh.arun_code(workload.code, timeout=workload.timeout)
                record.fresh_latencies.append(result.latency)
                progress.advance()
            else:
                continue
            if workload.failure(result) is not None:
                record.failures += 1
    await settle(fresh)
    return record


async def fresh_sustained(
    settings: BenchSettings, labels: Mapping[str, str] | None, progress: Progress
) -> FreshSustained:
    """Closed-loop callers on a small fresh pool, so every call needs a new container."""
    config = bench_config(
        FRESH,
        timeout=settings.timeout,
        pool_size=settings.sustained_pool_size,
        labels=labels,
        settings=settings.backend_settings,
    )
    workload = _BY_NAME["print"]
    async with Sandbox(config, max_workers=settings.sustained_concurrency) as sandbox:
        await sandbox.astart()
        await settle(sandbox)
        remaining = settings.sustained_calls
        finish: list[float] = []
        latencies: list[float] = []
        failures = 0
        started = time.perf_counter()

        async def caller() -> None:
            nonlocal remaining, failures
            while remaining > 0:
                remaining -= 1
                result = await sandbox.arun_code(workload.code)
                finish.append(time.perf_counter() - started)
                latencies.append(result.latency)
                failures += workload.failure(result) is not None
                progress.advance()

        await asyncio.gather(*(caller() for _ in range(settings.sustained_concurrency)))
        wall = time.perf_counter() - started
    return FreshSustained(
        pool_size=settings.sustained_pool_size,
        concurrency=settings.sustained_concurrency,
        calls=settings.sustained_calls,
        wall_seconds=wall,
        finish_times=finish,
        latencies=latencies,
        failures=failures,
        steady_throughput=steady_throughput(finish, settings.sustained_pool_size),
    )


async def cpu_per_call(name: str, sandbox: Sandbox, calls: int, progress: Progress) -> CpuPerCall:
    """This process's CPU time over ``calls`` sequential calls (and the pool's refill)."""
    await settle(sandbox)
    cpu_started, wall_started = time.process_time(), time.perf_counter()
    for _ in range(calls):
        await sandbox.arun_code(_CPU_CODE)
        progress.advance()
    # The background work a call causes (a fresh container's replacement, a reset)
    # belongs to it, so the clock stops once the pool is whole again.
    await settle(sandbox)
    return CpuPerCall(
        backend=name,
        calls=calls,
        cpu_seconds=time.process_time() - cpu_started,
        wall_seconds=time.perf_counter() - wall_started,
    )


async def measure_all(
    sandboxes: Mapping[str, Sandbox],
    settings: BenchSettings,
    *,
    workloads: Sequence[Workload],
    result: BenchResult,
    progress: Progress,
    labels: Mapping[str, str] | None,
) -> None:
    """Every extra figure the selected backends allow, appended to ``result``."""
    for name, sandbox in sandboxes.items():
        progress.phase(f"client CPU per call: {name}")
        result.cpu_per_call.append(await cpu_per_call(name, sandbox, settings.cpu_calls, progress))
    for name, sandbox in sandboxes.items():
        if is_docker(name):
            progress.phase(f"memory: {name}")
            await settle(sandbox)
            result.memory.append(await asyncio.to_thread(read_pool_memory, sandbox, name))
    await sessions.measure_sessions(sandboxes, settings, result=result, progress=progress)
    if FRESH not in sandboxes:
        return
    names = {w.name for w in workloads}
    for workload_name in UNDRAINED_WORKLOADS:
        if workload_name in names:
            progress.phase(f"fresh, pool not drained: {workload_name}")
            result.fresh_undrained.append(
                await fresh_undrained(
                    sandboxes, _BY_NAME[workload_name], settings.undrained_calls, progress
                )
            )
    progress.phase(
        f"fresh, pool drained: {settings.sustained_concurrency} callers, "
        f"pool {settings.sustained_pool_size}"
    )
    result.fresh_sustained = await fresh_sustained(settings, labels, progress)
