"""What one benchmark run measured: every raw figure, as JSON-round-trippable models.

The tables, the targets and the plot are all computed from these models, so
``--json`` output can be re-rendered later (``benchmarks/make_report.py``)
without running anything again, and nothing shown is not backed by raw data.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from retool_exec.bench.stats import Summary, summarize, throughput

__all__ = [
    "SCHEMA",
    "BackendInfo",
    "BenchResult",
    "BenchSettings",
    "CellResult",
    "ContainerMemory",
    "CpuPerCall",
    "FreshSustained",
    "FreshUndrained",
    "PoolMemory",
    "SessionFigures",
]

SCHEMA = "retool_exec.bench/1"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BenchSettings(_Model):
    """How the run was configured (everything needed to repeat it)."""

    backends: list[str]
    workloads: list[str]
    concurrency: list[int]
    calls: int
    """Calls per (backend, workload, concurrency) cell, rounded up to a multiple of it."""
    slow_rounds: int
    """Batches per cell for slow workloads (sleep, timeout): ``concurrency x slow_rounds`` calls."""
    warmup: int
    """Unrecorded calls per backend before each workload."""
    pool_size: int
    """Warm containers per Docker backend in the main matrix."""
    timeout: float
    """Sandbox timeout (the timeout workload sets its own, shorter one)."""
    quick: bool
    extras: bool
    """Whether start-up, fresh-policy, CPU-per-call and memory figures were measured."""
    undrained_calls: int
    sustained_calls: int
    sustained_concurrency: int
    sustained_pool_size: int
    cpu_calls: int
    local_python: str
    backend_settings: dict[str, Any] = Field(default_factory=dict)
    """``--config``/``--set`` settings, given to every backend that has them."""
    command: str


class CellResult(_Model):
    """Every call of one backend running one workload at one concurrency level."""

    backend: str
    workload: str
    concurrency: int
    latencies: list[float] = Field(default_factory=list)
    """``ExecResult.latency`` of each call, seconds (from submission, queueing included)."""
    queue_waits: list[float] = Field(default_factory=list)
    """``ExecResult.queue_wait`` of each call: time spent waiting for a slot or container."""
    outcomes: list[str] = Field(default_factory=list)
    failures: int = 0
    """Calls whose outcome (or output) was not the workload's expected one."""
    failure_examples: list[str] = Field(default_factory=list)
    segment_walls: list[float] = Field(default_factory=list)
    """Wall time of each batch of ``concurrency`` simultaneous callers."""
    segment_calls: list[int] = Field(default_factory=list)

    @property
    def wall_seconds(self) -> float:
        return sum(self.segment_walls)

    @property
    def throughput(self) -> float:
        """Calls per second while this cell's batches ran."""
        return throughput(sum(self.segment_calls), self.wall_seconds)

    def summary(self) -> Summary:
        return summarize(self.latencies)


class BackendInfo(_Model):
    """A backend as configured for the run, and how long it took to get ready."""

    name: str
    config: dict[str, Any]
    startup_seconds: float | None = None
    """``DockerBackend.startup_seconds``: connect, image check, and a full warm pool."""
    pool_size: int | None = None


class FreshUndrained(_Model):
    """Sequential calls on ``docker-fresh`` with the pool refilled before each one.

    Paired with local calls of the same workload, one after the other, so the
    ratio compares calls made under the same machine conditions.
    """

    workload: str
    local_latencies: list[float] = Field(default_factory=list)
    fresh_latencies: list[float] = Field(default_factory=list)
    refill_waits: list[float] = Field(default_factory=list)
    """Seconds spent waiting for ``ready_count == size`` before each call (not counted)."""
    failures: int = 0


class FreshSustained(_Model):
    """Many concurrent calls on a small ``docker-fresh`` pool, so it runs drained."""

    pool_size: int
    concurrency: int
    calls: int
    wall_seconds: float
    finish_times: list[float]
    """Seconds from the start of the burst to each call's completion."""
    latencies: list[float]
    failures: int
    steady_throughput: float
    """Calls/s after the first ``pool_size`` completions (the pre-warmed ones)."""

    @property
    def overall_throughput(self) -> float:
        return throughput(self.calls, self.wall_seconds)


class CpuPerCall(_Model):
    """The library's own CPU (this process, all threads) per sequential call."""

    backend: str
    calls: int
    cpu_seconds: float
    wall_seconds: float

    @property
    def per_call(self) -> float:
        return self.cpu_seconds / self.calls if self.calls else float("nan")


class ContainerMemory(_Model):
    """One warm container's memory as its cgroup reports it."""

    id: str
    usage_bytes: int
    working_set_bytes: int
    """Usage minus inactive file cache (what ``docker stats`` shows)."""
    source: str


class PoolMemory(_Model):
    """Host memory held by a Docker backend's warm containers."""

    backend: str
    pool_size: int
    containers: list[ContainerMemory]
    error: str | None = None

    @property
    def total_usage(self) -> int:
        return sum(c.usage_bytes for c in self.containers)

    @property
    def total_working_set(self) -> int:
        return sum(c.working_set_bytes for c in self.containers)


class SessionFigures(_Model):
    """One backend's session figures (see ``retool_exec.bench.sessions``)."""

    backend: str
    error: str | None = None
    """Why a figure is missing (no sessions, a session or fork that failed)."""
    open_seconds: float | None = None
    """Opening the session the warm cells and forks ran on."""
    cell_latencies: list[float] = Field(default_factory=list)
    """``print(2+3)`` as a cell of a warm session."""
    call_latencies: list[float] = Field(default_factory=list)
    """``print(2+3)`` as a stateless call on the same backend, interleaved with the cells."""
    cell_failures: int = 0
    turns: int = 0
    """Turns of the conversation in this run (``--quick``: 3)."""
    conversation_session: list[float] = Field(default_factory=list)
    """Per round: seconds to open a session and run every turn as a cell."""
    conversation_open: list[float] = Field(default_factory=list)
    """Per round: the opening part of ``conversation_session``."""
    conversation_close: list[float] = Field(default_factory=list)
    """Per round: closing the session afterwards (not in ``conversation_session``)."""
    conversation_stateless: list[float] = Field(default_factory=list)
    """Per round: the sum of the latencies of the stateless calls re-running turns 1..k."""
    conversation_failures: int = 0
    conversation_skipped: str | None = None
    fork_state_mb: int = 0
    fork_latencies: list[float] = Field(default_factory=list)
    """``fork()`` of a session holding ``fork_state_mb`` MB, to the copy being ready."""
    fork_failures: int = 0
    seconds: float = 0.0
    """Wall time of all of this backend's session figures (pool settling included)."""

    @property
    def conversation_ratio(self) -> float | None:
        """Stateless total over session total (sums over the rounds): how many times faster."""
        session, stateless = sum(self.conversation_session), sum(self.conversation_stateless)
        if not self.conversation_session or not self.conversation_stateless or session <= 0:
            return None
        return stateless / session


class BenchResult(_Model):
    """One whole run: settings, environment, and every measurement."""

    schema_: str = Field(default=SCHEMA, alias="schema")
    started_at: str
    finished_at: str = ""
    duration_seconds: float = 0.0
    settings: BenchSettings
    environment: dict[str, Any] = Field(default_factory=dict)
    backends: list[BackendInfo] = Field(default_factory=list)
    cells: list[CellResult] = Field(default_factory=list)
    fresh_undrained: list[FreshUndrained] = Field(default_factory=list)
    fresh_sustained: FreshSustained | None = None
    cpu_per_call: list[CpuPerCall] = Field(default_factory=list)
    memory: list[PoolMemory] = Field(default_factory=list)
    sessions: list[SessionFigures] = Field(default_factory=list)
    """Session figures per backend (with the extras)."""
    notes: list[str] = Field(default_factory=list)
    """Warnings met during the run (a baseline that cannot import sympy, ...)."""
    summary: dict[str, Any] = Field(default_factory=dict)
    """Derived figures (tables and targets) for readers of the JSON; recomputed on load."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def cell(self, backend: str, workload: str, concurrency: int) -> CellResult | None:
        for cell in self.cells:
            if (cell.backend, cell.workload, cell.concurrency) == (backend, workload, concurrency):
                return cell
        return None
