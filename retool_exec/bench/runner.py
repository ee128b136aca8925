"""Runs the benchmark: every workload, on every backend, at every concurrency level.

Fairness on a small, shared machine is the point of the design:

- **Interleaved.** For each workload and concurrency level the calls are cut
  into batches of ``concurrency`` simultaneous callers, and the backends take
  turns batch by batch (the order rotates every round), so a slow minute on
  the machine hits every backend alike. Ratios to the local backend come
  from the same rounds.
- **Settled.** After each batch of a Docker backend the runner waits (not
  timed) until its pool is full again and Docker has removed the used
  containers, so its background container starts, removals and resets never
  run during another backend's batch.
- **Warmed up.** Each backend first runs a few unrecorded calls of each
  workload (page cache, imports, pool churn); the slow workloads (sleep,
  timeout) have nothing to warm and skip this.

Latency is ``ExecResult.latency``: from the call's submission to its result,
including any wait for a slot or a container; throughput is calls divided by
the wall time of the batches.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import os
import time
from collections.abc import Sequence

from retool_exec._models import ExecResult
from retool_exec._sandbox import Sandbox
from retool_exec.bench import extras
from retool_exec.bench.backends import LOCAL, bench_config, is_docker
from retool_exec.bench.environment import collect_environment, missing_modules
from retool_exec.bench.pools import settle
from retool_exec.bench.progress import Progress
from retool_exec.bench.results import BackendInfo, BenchResult, BenchSettings, CellResult
from retool_exec.bench.workloads import Workload

__all__ = ["IMAGE_PROBE", "cell_calls", "planned_calls", "run_bench"]

_MAX_FAILURE_EXAMPLES = 3

IMAGE_PROBE = """\
import importlib, json, sys
found = {}
for name in ("numpy", "sympy", "scipy", "mpmath"):
    try:
        found[name] = importlib.import_module(name).__version__
    except Exception:
        found[name] = None
print(json.dumps({"python": sys.version.split()[0], "modules": found}))
"""


def cell_calls(workload: Workload, concurrency: int, *, calls: int, slow_rounds: int) -> int:
    """Recorded calls of one cell: at least ``calls`` (slow workloads: ``slow_rounds``
    batches), always whole batches of ``concurrency``."""
    if workload.slow:
        return concurrency * slow_rounds
    return concurrency * math.ceil(max(calls, concurrency) / concurrency)


def _warmup_calls(settings: BenchSettings, workload: Workload) -> int:
    """Slow workloads (sleep, timeout) take seconds per call and warm nothing up: none."""
    return 0 if workload.slow else settings.warmup


def planned_calls(settings: BenchSettings, workloads: Sequence[Workload]) -> int:
    """Every call the run will make (for the progress bar)."""
    backends = len(settings.backends)
    total = 0
    for workload in workloads:
        total += backends * _warmup_calls(settings, workload)
        for concurrency in settings.concurrency:
            total += backends * cell_calls(
                workload, concurrency, calls=settings.calls, slow_rounds=settings.slow_rounds
            )
    if settings.extras:
        total += extras.planned_calls(settings, [w.name for w in workloads])
    return total


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


async def _batch(
    sandbox: Sandbox, workload: Workload, concurrency: int, progress: Progress
) -> tuple[list[ExecResult], float]:
    """``concurrency`` simultaneous calls; their results and the batch's wall time."""

    async def one() -> ExecResult:
        result = await sandbox.arun_code(workload.code, timeout=workload.timeout)
        progress.advance()
        return result

    started = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(concurrency)))
    return list(results), time.perf_counter() - started


def _record(cell: CellResult, workload: Workload, results: list[ExecResult], wall: float) -> None:
    cell.segment_walls.append(wall)
    cell.segment_calls.append(len(results))
    for result in results:
        cell.latencies.append(result.latency)
        cell.queue_waits.append(result.queue_wait)
        cell.outcomes.append(result.outcome.value)
        why = workload.failure(result)
        if why is not None:
            cell.failures += 1
            if len(cell.failure_examples) < _MAX_FAILURE_EXAMPLES:
                cell.failure_examples.append(why)


class _Run:
    """State of one run: the sandboxes, the result being filled in, the progress bar."""

    def __init__(
        self,
        settings: BenchSettings,
        workloads: Sequence[Workload],
        progress: Progress,
        labels: dict[str, str],
    ) -> None:
        self.settings = settings
        self.workloads = list(workloads)
        self.progress = progress
        self.labels = labels
        self.sandboxes: dict[str, Sandbox] = {}
        self.result = BenchResult(started_at=_now(), settings=settings)

    async def settle(self, name: str) -> None:
        try:
            await settle(self.sandboxes[name], drain_removals=True)
        except TimeoutError as exc:
            self.result.notes.append(f"{name}: {exc}")

    async def open_backends(self) -> None:
        """Start each backend in turn (so start-up times do not compete) and time it."""
        workers = max(self.settings.concurrency)
        for name in self.settings.backends:
            config = bench_config(
                name,
                timeout=self.settings.timeout,
                pool_size=self.settings.pool_size,
                labels=self.labels,
                local_python=self.settings.local_python,
                settings=self.settings.backend_settings,
            )
            self.progress.phase(f"starting {name}")
            sandbox = Sandbox(config, max_workers=workers)
            self.sandboxes[name] = sandbox
            started = time.perf_counter()
            await sandbox.astart()
            elapsed = time.perf_counter() - started
            startup = getattr(sandbox.backend, "startup_seconds", None)
            pool_size = getattr(config, "pool_size", None)
            self.result.backends.append(
                BackendInfo(
                    name=name,
                    config=config.model_dump(mode="json"),
                    startup_seconds=startup if startup is not None else elapsed,
                    pool_size=pool_size,
                )
            )

    async def probe_image(self) -> None:
        """The Python and math-module versions inside the sandbox image."""
        docker_names = [n for n in self.settings.backends if is_docker(n)]
        if not docker_names:
            return
        result = await self.sandboxes[docker_names[0]].arun_code(IMAGE_PROBE)
        try:
            probed: object = json.loads(result.stdout)
        except ValueError:
            probed = {"error": f"probe failed: {result.outcome.value}: {result.stderr[-200:]}"}
        self.result.environment["image_python"] = probed
        await self.settle(docker_names[0])

    async def matrix(self) -> None:
        names = list(self.settings.backends)
        for workload in self.workloads:
            warm = _warmup_calls(self.settings, workload)
            self.progress.phase(f"{workload.name}: warm-up")
            for name in names:
                for _ in range(warm):
                    await _batch(self.sandboxes[name], workload, 1, self.progress)
                await self.settle(name)
            for concurrency in self.settings.concurrency:
                await self.cell_rounds(workload, concurrency, names)

    async def cell_rounds(self, workload: Workload, concurrency: int, names: list[str]) -> None:
        cells = {
            name: CellResult(backend=name, workload=workload.name, concurrency=concurrency)
            for name in names
        }
        total = cell_calls(
            workload,
            concurrency,
            calls=self.settings.calls,
            slow_rounds=self.settings.slow_rounds,
        )
        rounds = total // concurrency
        self.progress.phase(f"{workload.name} x{concurrency}")
        for index in range(rounds):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                results, wall = await _batch(
                    self.sandboxes[name], workload, concurrency, self.progress
                )
                _record(cells[name], workload, results, wall)
                await self.settle(name)
        self.result.cells.extend(cells.values())

    async def close(self) -> None:
        for sandbox in self.sandboxes.values():
            await sandbox.aclose()


async def run_bench(
    settings: BenchSettings,
    workloads: Sequence[Workload],
    *,
    progress: Progress,
    labels: dict[str, str] | None = None,
    docker_host: str | None = None,
) -> BenchResult:
    """Run the whole benchmark and return every measurement."""
    run = _Run(settings, workloads, progress, dict(labels or {}))
    result = run.result
    started = time.perf_counter()
    progress.phase("environment")
    result.environment = await asyncio.to_thread(
        collect_environment,
        local_python=settings.local_python,
        docker=any(is_docker(n) for n in settings.backends),
        docker_host=docker_host,
    )
    if LOCAL in settings.backends:
        needed = tuple(dict.fromkeys(m for w in workloads for m in w.needs))
        missing = missing_modules(result.environment["local_python"], needed)
        if missing:
            result.notes.append(
                f"the local baseline interpreter {settings.local_python} cannot import "
                f"{', '.join(missing)}: its {', '.join(missing)} calls fail and their ratios "
                "mean nothing; pass --local-python with an interpreter that has them"
            )
    try:
        await run.open_backends()
        await run.probe_image()
        await run.matrix()
        if settings.extras:
            await extras.measure_all(
                run.sandboxes,
                settings,
                workloads=workloads,
                result=result,
                progress=progress,
                labels=labels,
            )
    finally:
        progress.phase("closing backends")
        await run.close()
        progress.close()
    try:
        result.environment["load_average_at_end"] = list(os.getloadavg())
    except OSError:
        result.environment["load_average_at_end"] = None
    result.finished_at = _now()
    result.duration_seconds = time.perf_counter() - started
    return result
