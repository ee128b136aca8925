"""Tables from a run's raw figures: one per workload, the extra figures, and the targets.

Tables are plain (headers, rows) data rendered twice: aligned text for the
terminal and Markdown for ``docs/benchmarks.md``, so both always show the
same numbers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from retool_exec.bench.backends import LOCAL
from retool_exec.bench.results import BenchResult
from retool_exec.bench.stats import percentile, ratio, summarize
from retool_exec.bench.targets import evaluate_targets
from retool_exec.bench.workloads import WORKLOADS

__all__ = [
    "Table",
    "extra_tables",
    "render_markdown_table",
    "render_text",
    "render_text_table",
    "session_tables",
    "summary_json",
    "target_table",
    "workload_tables",
]

_TITLES = {w.name: w for w in WORKLOADS}


@dataclass
class Table:
    """A titled table; ``notes`` are lines printed under it."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def fmt_ms(seconds: float | None) -> str:
    """Seconds as milliseconds, with the precision the size deserves."""
    if seconds is None or math.isnan(seconds):
        return "-"
    ms = seconds * 1000
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 1000 else f"{ms:.0f}"


def fmt_rate(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def fmt_ratio(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.3f}x" if value < 0.1 else f"{value:.2f}x"


def fmt_mib(value: float) -> str:
    return f"{value / (1 << 20):.1f}"


def workload_tables(result: BenchResult) -> list[Table]:
    """One table per workload: every backend at every concurrency level."""
    tables = []
    headers = [
        "backend",
        "conc",
        "calls",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "mean ms",
        "max ms",
        "calls/s",
        "p50 vs local",
        "calls/s vs local",
        "failures",
    ]
    for workload in result.settings.workloads:
        rows = []
        for concurrency in result.settings.concurrency:
            local = result.cell(LOCAL, workload, concurrency)
            local_p50 = local.summary().p50 if local else None
            local_rate = local.throughput if local else None
            for backend in result.settings.backends:
                cell = result.cell(backend, workload, concurrency)
                if cell is None:
                    continue
                summary = cell.summary()
                rows.append(
                    [
                        backend,
                        str(concurrency),
                        str(summary.count),
                        fmt_ms(summary.p50),
                        fmt_ms(summary.p95),
                        fmt_ms(summary.p99),
                        fmt_ms(summary.mean),
                        fmt_ms(summary.max),
                        fmt_rate(cell.throughput),
                        fmt_ratio(ratio(summary.p50, local_p50)),
                        fmt_ratio(ratio(cell.throughput, local_rate)),
                        str(cell.failures),
                    ]
                )
        spec = _TITLES.get(workload)
        notes = []
        for backend in result.settings.backends:
            for concurrency in result.settings.concurrency:
                cell = result.cell(backend, workload, concurrency)
                if cell and cell.failure_examples:
                    notes.append(
                        f"{backend} x{concurrency} failures, e.g.: {cell.failure_examples[0]}"
                    )
        title = f"{workload}: {spec.title}" if spec else workload
        if spec:
            title += f"  [expected: {spec.expected.value}]"
        tables.append(Table(title, headers, rows, notes))
    return tables


def extra_tables(result: BenchResult) -> list[Table]:
    """Start-up, fresh-policy, client-CPU and memory figures (those that were measured)."""
    tables = []
    startup = [b for b in result.backends if b.pool_size is not None]
    if startup:
        tables.append(
            Table(
                "pool start-up (DockerBackend.startup_seconds: connect, image check, full pool)",
                ["backend", "pool size", "start-up s"],
                [
                    [b.name, str(b.pool_size), f"{b.startup_seconds or math.nan:.2f}"]
                    for b in startup
                ],
            )
        )
    if result.fresh_undrained:
        rows = []
        for record in result.fresh_undrained:
            fresh = summarize(record.fresh_latencies)
            local_p50 = percentile(record.local_latencies, 50) if record.local_latencies else None
            rows.append(
                [
                    record.workload,
                    str(fresh.count),
                    fmt_ms(fresh.p50),
                    fmt_ms(fresh.p95),
                    fmt_ms(local_p50),
                    fmt_ratio(ratio(fresh.p50, local_p50)),
                    fmt_ms(summarize(record.refill_waits).p50),
                    str(record.failures),
                ]
            )
        tables.append(
            Table(
                "docker-fresh, pool not drained (sequential; each call waits, untimed, "
                "for ready_count == size), paired with local",
                [
                    "workload",
                    "calls",
                    "fresh p50 ms",
                    "fresh p95 ms",
                    "local p50 ms",
                    "p50 vs local",
                    "refill wait p50 ms",
                    "failures",
                ],
                rows,
            )
        )
    sustained = result.fresh_sustained
    if sustained is not None:
        lat = summarize(sustained.latencies)
        tables.append(
            Table(
                "docker-fresh, pool drained (closed loop)",
                [
                    "pool size",
                    "callers",
                    "calls",
                    "sustained calls/s",
                    "overall calls/s",
                    "p50 ms",
                    "p95 ms",
                    "failures",
                ],
                [
                    [
                        str(sustained.pool_size),
                        str(sustained.concurrency),
                        str(sustained.calls),
                        fmt_rate(sustained.steady_throughput),
                        fmt_rate(sustained.overall_throughput),
                        fmt_ms(lat.p50),
                        fmt_ms(lat.p95),
                        str(sustained.failures),
                    ]
                ],
                [
                    f"sustained = calls completed after the first {sustained.pool_size} "
                    "(pre-warmed) ones, divided by the time they took"
                ],
            )
        )
    if result.cpu_per_call:
        tables.append(
            Table(
                "client-side CPU per call (time.process_time of this process over N sequential "
                "print(2+3) calls, incl. pool refill, / N)",
                ["backend", "calls", "CPU ms per call", "wall ms per call"],
                [
                    [
                        c.backend,
                        str(c.calls),
                        fmt_ms(c.per_call),
                        fmt_ms(c.wall_seconds / c.calls if c.calls else None),
                    ]
                    for c in result.cpu_per_call
                ],
            )
        )
    if result.memory:
        rows = []
        notes = []
        for pool in result.memory:
            count = len(pool.containers)
            rows.append(
                [
                    pool.backend,
                    str(count),
                    fmt_mib(pool.total_usage),
                    fmt_mib(pool.total_working_set),
                    fmt_mib(pool.total_working_set / count) if count else "-",
                    pool.containers[0].source if pool.containers else "-",
                ]
            )
            if pool.error:
                notes.append(f"{pool.backend}: {pool.error}")
        tables.append(
            Table(
                "host memory of the warm containers (sum over the pool)",
                [
                    "backend",
                    "containers",
                    "usage MiB",
                    "working set MiB",
                    "per container MiB",
                    "source",
                ],
                rows,
                [
                    *notes,
                    "working set = usage minus inactive file cache (what `docker stats` shows)",
                ],
            )
        )
    tables.extend(session_tables(result))
    return tables


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def session_tables(result: BenchResult) -> list[Table]:
    """The session figures (``retool_exec.bench.sessions``), where measured."""
    if not result.sessions:
        return []
    problems = [f"{f.backend}: {f.error}" for f in result.sessions if f.error]
    cells = []
    for f in result.sessions:
        if not f.cell_latencies:
            continue
        cell, call = summarize(f.cell_latencies), summarize(f.call_latencies)
        cells.append(
            [
                f.backend,
                str(cell.count),
                fmt_ms(cell.p50),
                fmt_ms(cell.p95),
                fmt_ms(call.p50),
                fmt_ms(call.p95),
                fmt_ratio(ratio(cell.p50, call.p50)),
                str(f.cell_failures),
            ]
        )
    talks = []
    skipped = []
    for f in result.sessions:
        if f.conversation_skipped:
            skipped.append(f"{f.backend}: not run: {f.conversation_skipped}")
        if not f.conversation_session:
            continue
        talks.append(
            [
                f.backend,
                str(f.turns),
                str(len(f.conversation_session)),
                fmt_ms(_mean(f.conversation_session)),
                fmt_ms(_mean(f.conversation_open)),
                fmt_ms(_mean(f.conversation_close)),
                fmt_ms(_mean(f.conversation_stateless)),
                fmt_ratio(f.conversation_ratio),
                str(f.conversation_failures),
            ]
        )
    forks = []
    for f in result.sessions:
        if not f.fork_latencies:
            continue
        fork = summarize(f.fork_latencies)
        forks.append(
            [
                f.backend,
                str(f.fork_state_mb),
                str(fork.count),
                fmt_ms(fork.p50),
                fmt_ms(fork.p95),
                fmt_ms(fork.max),
                str(f.fork_failures),
            ]
        )
    tables = [
        Table(
            "sessions: print(2+3) as a cell of a warm session vs as a stateless call on the "
            "same backend (interleaved)",
            [
                "backend",
                "calls each",
                "cell p50 ms",
                "cell p95 ms",
                "call p50 ms",
                "call p95 ms",
                "cell vs call",
                "failures",
            ],
            cells,
            [
                *problems,
                "seconds spent on the session figures: "
                + ", ".join(f"{f.backend} {f.seconds:.1f}" for f in result.sessions),
            ],
        ),
        Table(
            "sessions: a sympy/numpy conversation, each turn using earlier turns' variables: "
            "one session vs re-running turns 1..k as one stateless call per turn",
            [
                "backend",
                "turns",
                "rounds",
                "session ms",
                "of which open ms",
                "close ms",
                "stateless ms",
                "stateless / session",
                "failures",
            ],
            talks,
            [
                *skipped,
                "session = open + every turn as a cell; close shown apart; "
                "stateless = the sum of the turns' call latencies (means over the rounds)",
            ],
        ),
        Table(
            "sessions: fork() of a session holding its state (every page written), "
            "until the copy is ready",
            ["backend", "state MB", "forks", "p50 ms", "p95 ms", "max ms", "failures"],
            forks,
        ),
    ]
    return [t for index, t in enumerate(tables) if t.rows or (index == 0 and problems)]


def target_table(result: BenchResult) -> Table:
    targets = evaluate_targets(result)
    return Table(
        "targets",
        ["target", "measured", "verdict"],
        [[t.requirement, t.measured, t.verdict] for t in targets],
    )


def render_text_table(table: Table) -> str:
    widths = [len(h) for h in table.headers]
    for row in table.rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.ljust(width) if index == 0 else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    out = [f"== {table.title}", line(table.headers), line(["-" * w for w in widths])]
    out.extend(line(row) for row in table.rows)
    out.extend(f"   {note}" for note in table.notes)
    return "\n".join(out)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


_NUMBER = re.compile(r"^(-|[-+]?[\d.]+x?)$")


def _numeric(table: Table, column: int) -> bool:
    """Whether a column holds figures (right-aligned) rather than words."""
    return bool(table.rows) and all(_NUMBER.match(row[column]) for row in table.rows)


def render_markdown_table(table: Table, *, heading: str | None = None) -> str:
    out = [heading] if heading else []
    out.append("| " + " | ".join(_md_cell(h) for h in table.headers) + " |")
    aligns = ["---:" if _numeric(table, i) else "---" for i in range(len(table.headers))]
    out.append("|" + "|".join(aligns) + "|")
    out.extend("| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows)
    if table.notes:
        out.append("")
        out.extend(f"- {_md_cell(note)}" for note in table.notes)
    return "\n".join(out)


def render_text(result: BenchResult) -> str:
    """The whole report for the terminal."""
    blocks = [render_text_table(t) for t in workload_tables(result)]
    blocks.extend(render_text_table(t) for t in extra_tables(result))
    targets = target_table(result)
    blocks.append(
        "== targets\n"
        + "\n".join(f"{row[2]:>12}  {row[0]}\n              {row[1]}" for row in targets.rows)
    )
    if result.notes:
        blocks.append("== notes\n" + "\n".join(f"- {note}" for note in result.notes))
    return "\n\n".join(blocks) + "\n"


def summary_json(result: BenchResult) -> dict[str, Any]:
    """Derived figures for the JSON's readers: per-cell statistics and the targets."""
    cells = []
    for cell in result.cells:
        summary = cell.summary()
        local = result.cell(LOCAL, cell.workload, cell.concurrency)
        cells.append(
            {
                "backend": cell.backend,
                "workload": cell.workload,
                "concurrency": cell.concurrency,
                "calls": summary.count,
                "p50": summary.p50,
                "p95": summary.p95,
                "p99": summary.p99,
                "mean": summary.mean,
                "max": summary.max,
                "throughput": cell.throughput,
                "p50_ratio_to_local": ratio(summary.p50, local.summary().p50) if local else None,
                "throughput_ratio_to_local": ratio(cell.throughput, local.throughput)
                if local
                else None,
                "failures": cell.failures,
            }
        )
    return {
        "cells": cells,
        "targets": [
            {
                "name": t.name,
                "requirement": t.requirement,
                "measured": t.measured,
                "verdict": t.verdict,
            }
            for t in evaluate_targets(result)
        ],
    }
