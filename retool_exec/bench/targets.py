"""The Docker (and ray) backends' performance targets, judged from one run's raw figures (pure).

Every target is stated, measured and marked PASS or FAIL; a figure that was
not measured (a backend or workload left out of the run) is NOT MEASURED,
never a pass. A cell with failed calls fails its target: speed bought by
failing is not speed. A ratio to a local baseline whose interpreter cannot
import the workload's modules is NOT MEASURED too: there is no baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from retool_exec.bench.backends import LOCAL
from retool_exec.bench.environment import missing_modules
from retool_exec.bench.results import BenchResult, CellResult, SessionFigures
from retool_exec.bench.stats import percentile, ratio
from retool_exec.bench.workloads import TIMEOUT_WORKLOAD_LIMIT, WORKLOADS

__all__ = ["Target", "evaluate_targets"]

TIMEOUT_SLACK = 1.0
"""A timed-out call must return within its timeout plus this many seconds."""
SESSION_CELL_LIMIT = 1.0
"""A warm session cell's p50 over the same backend's single-call p50."""
FORK_LIMIT = 0.020
"""Seconds: p50 of ``fork()`` for a session holding 100 MB (runc)."""


@dataclass(frozen=True, slots=True)
class Target:
    """One target: what is required, what was measured, and the verdict."""

    name: str
    requirement: str
    measured: str
    passed: bool | None
    """None: not measured in this run."""

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "FAIL", None: "NOT MEASURED"}[self.passed]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _reuse_name(result: BenchResult) -> str | None:
    for name in ("docker-reuse", "docker"):
        if name in result.settings.backends:
            return name
    return None


def _p50_ratio_target(
    result: BenchResult, workload: str, limit: float, label: str, backend: str = "reuse"
) -> Target:
    requirement = f"{backend}, {label}: p50 <= {limit:g} x local p50 (concurrency 1)"
    name = f"{backend} {workload} p50"
    reuse = _reuse_name(result) if backend == "reuse" else backend
    cell = result.cell(reuse, workload, 1) if reuse in result.settings.backends else None
    local = result.cell(LOCAL, workload, 1)
    if cell is None or local is None:
        return Target(name, requirement, f"not measured (needs local and {reuse})", None)
    missing = _baseline_lacks(result, workload)
    if missing:
        return Target(
            name,
            requirement,
            f"not measured: the local baseline interpreter cannot import {', '.join(missing)} "
            "(give --local-python an interpreter with the image's math stack, as "
            "benchmarks/run.sh does)",
            None,
        )
    value = ratio(cell.summary().p50, local.summary().p50)
    measured = (
        f"{reuse} p50 {_ms(cell.summary().p50)} vs local p50 {_ms(local.summary().p50)}"
        f" = {value:.3f} x local"
        if value is not None
        else "no ratio"
    )
    failed = _failures(cell, local)
    if failed:
        return Target(name, requirement, f"{measured}; {failed}", False)
    return Target(name, requirement, measured, value is not None and value <= limit)


def _baseline_lacks(result: BenchResult, workload: str) -> list[str]:
    """Modules ``workload`` needs that the local baseline's interpreter could not import."""
    needs = next((w.needs for w in WORKLOADS if w.name == workload), ())
    local_info = result.environment.get("local_python")
    if not needs or not isinstance(local_info, dict):
        return []
    return missing_modules(local_info, needs)


def _failures(*cells: CellResult) -> str:
    bad = [f"{c.backend}: {c.failures} failed call(s)" for c in cells if c.failures]
    return "; ".join(bad)


def _fresh_undrained(result: BenchResult) -> Target:
    requirement = "fresh, pool not drained, print(2+3): p50 <= 0.5 x local p50 (sequential)"
    record = next((r for r in result.fresh_undrained if r.workload == "print"), None)
    if record is None or not record.local_latencies or not record.fresh_latencies:
        return Target("fresh undrained p50", requirement, "not measured", None)
    fresh, local = percentile(record.fresh_latencies, 50), percentile(record.local_latencies, 50)
    value = ratio(fresh, local)
    measured = f"fresh p50 {_ms(fresh)} vs local p50 {_ms(local)}" + (
        f" = {value:.3f} x local" if value is not None else ""
    )
    if record.failures:
        return Target(
            "fresh undrained p50", requirement, f"{measured}; {record.failures} failed", False
        )
    return Target("fresh undrained p50", requirement, measured, value is not None and value <= 0.5)


SCALING_LIMIT = 1.5
"""docker-reuse throughput at many callers over its own throughput at one."""
SCALING_WORKLOADS = ("print", "numpy", "sympy", "error")
FRESH_SUSTAINED_LIMIT = 8.0
"""Calls/s of docker-fresh with its pool drained."""
CLIENT_CPU_LIMIT = 0.0005
"""Seconds of this process's CPU per sequential docker-reuse call."""
WORKING_SET_LIMIT = 40 * 1024 * 1024
"""Bytes of working set of one warm docker-reuse container."""


def _scaling_targets(result: BenchResult) -> list[Target]:
    """docker-reuse's throughput at 16 and 64 callers against its own at 1, per workload."""
    reuse = _reuse_name(result)
    targets = []
    for workload in SCALING_WORKLOADS:
        for concurrency in (16, 64):
            name = f"reuse scaling {workload} x{concurrency}"
            requirement = (
                f"reuse, {workload}: throughput at {concurrency} callers >= "
                f"{SCALING_LIMIT:g} x its throughput at 1 caller"
            )
            one = result.cell(reuse, workload, 1) if reuse else None
            many = result.cell(reuse, workload, concurrency) if reuse else None
            if one is None or many is None:
                targets.append(Target(name, requirement, "not measured", None))
                continue
            value = ratio(many.throughput, one.throughput)
            measured = f"{many.throughput:.1f} vs {one.throughput:.1f} calls/s" + (
                f" = {value:.2f} x" if value is not None else ""
            )
            failed = _failures(one, many)
            if failed:
                targets.append(Target(name, requirement, f"{measured}; {failed}", False))
                continue
            ok = value is not None and value >= SCALING_LIMIT
            targets.append(Target(name, requirement, measured, ok))
    return targets


def _client_cpu_target(result: BenchResult) -> Target:
    requirement = f"reuse: client-side CPU per sequential call <= {CLIENT_CPU_LIMIT * 1000:g} ms"
    reuse = _reuse_name(result)
    record = next((r for r in result.cpu_per_call if r.backend == reuse), None)
    if record is None or not record.calls:
        return Target("reuse client CPU", requirement, "not measured", None)
    measured = f"{record.per_call * 1000:.2f} ms per call over {record.calls} calls"
    return Target("reuse client CPU", requirement, measured, record.per_call <= CLIENT_CPU_LIMIT)


def _working_set_target(result: BenchResult) -> Target:
    limit_mib = WORKING_SET_LIMIT / 1024 / 1024
    requirement = f"reuse: working set of one warm container <= {limit_mib:g} MiB"
    reuse = _reuse_name(result)
    pool = next((p for p in result.memory if p.backend == reuse), None)
    if pool is None or not pool.containers:
        return Target("reuse working set", requirement, "not measured", None)
    worst = max(c.working_set_bytes for c in pool.containers)
    measured = f"largest of {len(pool.containers)} warm containers {worst / 1024 / 1024:.1f} MiB"
    return Target("reuse working set", requirement, measured, worst <= WORKING_SET_LIMIT)


def _fresh_sustained(result: BenchResult) -> Target:
    requirement = f"fresh, pool drained: sustained throughput >= {FRESH_SUSTAINED_LIMIT:g} calls/s"
    sustained = result.fresh_sustained
    if sustained is None:
        return Target("fresh sustained", requirement, "not measured", None)
    rate = sustained.steady_throughput
    measured = (
        f"{rate:.2f} calls/s ({sustained.calls} calls, {sustained.concurrency} callers, "
        f"pool {sustained.pool_size}; overall {sustained.overall_throughput:.2f} calls/s)"
    )
    ok = not math.isnan(rate) and rate >= FRESH_SUSTAINED_LIMIT and sustained.failures == 0
    if sustained.failures:
        measured += f"; {sustained.failures} failed"
    return Target("fresh sustained", requirement, measured, ok)


def _throughput_target(result: BenchResult, concurrency: int = 16) -> Target:
    requirement = f"reuse, {concurrency} concurrent callers, print(2+3): throughput >= 2 x local"
    name = f"reuse throughput x{concurrency}"
    reuse = _reuse_name(result)
    cell = result.cell(reuse, "print", concurrency) if reuse else None
    local = result.cell(LOCAL, "print", concurrency)
    if cell is None or local is None:
        return Target(name, requirement, "not measured", None)
    value = ratio(cell.throughput, local.throughput)
    measured = f"{reuse} {cell.throughput:.1f} calls/s vs local {local.throughput:.1f} calls/s" + (
        f" = {value:.2f} x local" if value is not None else ""
    )
    failed = _failures(cell, local)
    if failed:
        return Target(name, requirement, f"{measured}; {failed}", False)
    return Target(name, requirement, measured, value is not None and value >= 2.0)


def _timeout_target(result: BenchResult, backend: str) -> Target:
    limit = TIMEOUT_WORKLOAD_LIMIT
    requirement = (
        f"{backend}: a timed-out call returns within timeout + {TIMEOUT_SLACK:g} s "
        f"(timeout {limit:g} s)"
    )
    name = f"timeout {backend}"
    cells = [c for c in result.cells if c.backend == backend and c.workload == "timeout"]
    if not cells:
        return Target(name, requirement, "not measured", None)
    # Once a call has its container: latency minus the wait for a slot or container.
    service = [
        lat - wait - limit
        for c in cells
        for lat, wait in zip(c.latencies, c.queue_waits, strict=True)
    ]
    sequential = [lat - limit for c in cells if c.concurrency == 1 for lat in c.latencies]
    worst_service = max(service)
    parts = [
        f"max(latency - queue wait - timeout) = {worst_service:+.3f} s over {len(service)} calls"
    ]
    worst = [worst_service]
    if sequential:
        parts.append(f"at concurrency 1 max(latency - timeout) = {max(sequential):+.3f} s")
        worst.append(max(sequential))
    failed = _failures(*cells)
    if failed:
        parts.append(failed)
    ok = max(worst) <= TIMEOUT_SLACK and not failed
    return Target(name, requirement, "; ".join(parts), ok)


def _session_figures(result: BenchResult) -> tuple[str | None, SessionFigures | None]:
    reuse = _reuse_name(result)
    figures = next((f for f in result.sessions if f.backend == reuse), None)
    return reuse, figures


def _not_measured_why(reuse: str | None, figures: SessionFigures | None) -> str:
    if reuse is None:
        return "not measured (needs docker-reuse)"
    if figures is None:
        return "not measured (no session figures: run with the extras)"
    return f"not measured: {figures.error}" if figures.error else "not measured"


def _session_cell_target(result: BenchResult) -> Target:
    requirement = (
        f"reuse, a cell in a warm session, print(2+3): p50 <= {SESSION_CELL_LIMIT:.1f} x "
        "the reuse single-call p50 (interleaved)"
    )
    name = "reuse session cell p50"
    reuse, figures = _session_figures(result)
    if figures is None or not figures.cell_latencies or not figures.call_latencies:
        return Target(name, requirement, _not_measured_why(reuse, figures), None)
    cell = percentile(figures.cell_latencies, 50)
    call = percentile(figures.call_latencies, 50)
    value = ratio(cell, call)
    measured = f"session cell p50 {_ms(cell)} vs {reuse} call p50 {_ms(call)}" + (
        f" = {value:.2f} x" if value is not None else ""
    )
    if figures.cell_failures:
        return Target(name, requirement, f"{measured}; {figures.cell_failures} failed", False)
    return Target(name, requirement, measured, value is not None and value <= SESSION_CELL_LIMIT)


def _conversation_target(result: BenchResult) -> Target:
    reuse, figures = _session_figures(result)
    turns = figures.turns if figures is not None else 10
    requirement = (
        f"reuse, {turns}-turn sympy/numpy conversation: a session (open + cells) takes less "
        "time than re-running the earlier turns as stateless calls (ratio > 1)"
    )
    name = "reuse session conversation"
    if figures is None or figures.conversation_ratio is None:
        why = _not_measured_why(reuse, figures)
        if figures is not None and figures.conversation_skipped:
            why = f"not measured: {figures.conversation_skipped}"
        return Target(name, requirement, why, None)
    rounds = len(figures.conversation_session)
    session = sum(figures.conversation_session) / rounds
    stateless = sum(figures.conversation_stateless) / len(figures.conversation_stateless)
    value = figures.conversation_ratio
    assert value is not None
    measured = (
        f"session {_ms(session)} vs stateless {_ms(stateless)} per conversation "
        f"(mean of {rounds}) = {value:.1f} x faster"
    )
    if figures.conversation_failures:
        return Target(
            name, requirement, f"{measured}; {figures.conversation_failures} failed", False
        )
    return Target(name, requirement, measured, value > 1.0)


def _fork_target(result: BenchResult) -> Target:
    reuse, figures = _session_figures(result)
    mb = figures.fork_state_mb if figures is not None and figures.fork_state_mb else 100
    requirement = f"reuse (runc), fork() of a session holding {mb} MB: p50 <= {_ms(FORK_LIMIT)}"
    name = "reuse session fork p50"
    if figures is None or not figures.fork_latencies:
        return Target(name, requirement, _not_measured_why(reuse, figures), None)
    p50 = percentile(figures.fork_latencies, 50)
    measured = (
        f"fork p50 {_ms(p50)}, max {_ms(max(figures.fork_latencies))} "
        f"over {len(figures.fork_latencies)} forks"
    )
    if figures.fork_failures:
        return Target(name, requirement, f"{measured}; {figures.fork_failures} failed", False)
    return Target(name, requirement, measured, p50 <= FORK_LIMIT)


RAY_P50_MARGIN = 0.003
"""Seconds the ray backend's print p50 may exceed docker-reuse's (its routing overhead)."""
RAY_THROUGHPUT_RATIO = 0.8
"""The ray backend's throughput at 16 callers over docker-reuse's, at least."""


def _ray_targets(result: BenchResult, concurrency: int = 16) -> list[Target]:
    """The ray backend against docker-reuse in the same run (only when ray was run)."""
    if "ray" not in result.settings.backends:
        return []
    reuse = _reuse_name(result)
    ray_one, ray_many = result.cell("ray", "print", 1), result.cell("ray", "print", concurrency)
    reuse_one = result.cell(reuse, "print", 1) if reuse else None
    reuse_many = result.cell(reuse, "print", concurrency) if reuse else None
    name, requirement = (
        "ray routing p50",
        f"ray, print(2+3): p50 <= docker-reuse p50 + {_ms(RAY_P50_MARGIN)} (concurrency 1)",
    )
    if ray_one is None or reuse_one is None:
        p50 = Target(name, requirement, "not measured (needs ray and docker-reuse)", None)
    else:
        mine, theirs = ray_one.summary().p50, reuse_one.summary().p50
        measured = f"ray p50 {_ms(mine)} vs {reuse} p50 {_ms(theirs)} = +{_ms(mine - theirs)}"
        failed = _failures(ray_one, reuse_one)
        p50 = Target(
            name,
            requirement,
            f"{measured}; {failed}" if failed else measured,
            not failed and mine <= theirs + RAY_P50_MARGIN,
        )
    name = f"ray throughput x{concurrency}"
    requirement = (
        f"ray, {concurrency} concurrent callers, print(2+3): throughput >= "
        f"{RAY_THROUGHPUT_RATIO:g} x docker-reuse"
    )
    if ray_many is None or reuse_many is None:
        return [p50, Target(name, requirement, "not measured (needs ray and docker-reuse)", None)]
    value = ratio(ray_many.throughput, reuse_many.throughput)
    measured = (
        f"ray {ray_many.throughput:.1f} calls/s vs {reuse} {reuse_many.throughput:.1f} calls/s"
        + (f" = {value:.2f} x" if value is not None else "")
    )
    failed = _failures(ray_many, reuse_many)
    ok = not failed and value is not None and value >= RAY_THROUGHPUT_RATIO
    return [p50, Target(name, requirement, f"{measured}; {failed}" if failed else measured, ok)]


def evaluate_targets(result: BenchResult) -> list[Target]:
    """Every target with its measured value and verdict, in the order the issue lists them."""
    targets = [
        _p50_ratio_target(result, "print", 0.3, "print(2+3)"),
        _p50_ratio_target(result, "sympy", 0.05, "import sympy and solve a small equation"),
        _p50_ratio_target(result, "print", 1.0, "print(2+3)", backend="docker-runsc"),
        _fresh_undrained(result),
        _fresh_sustained(result),
        _throughput_target(result),
        *_scaling_targets(result),
        _client_cpu_target(result),
        _working_set_target(result),
    ]
    targets.extend(_timeout_target(result, name) for name in result.settings.backends)
    targets += [_session_cell_target(result), _conversation_target(result), _fork_target(result)]
    return targets + _ray_targets(result)
