"""Targets, tables and progress from synthetic figures: verdicts follow the numbers, never fudge."""

from __future__ import annotations

from retool_exec import ExecResult, Outcome
from retool_exec.bench.report import render_markdown_table, render_text, summary_json
from retool_exec.bench.results import (
    BenchResult,
    BenchSettings,
    CellResult,
    ContainerMemory,
    CpuPerCall,
    FreshSustained,
    FreshUndrained,
    PoolMemory,
)
from retool_exec.bench.targets import evaluate_targets
from retool_exec.bench.workloads import WORKLOADS
from tests.bench_settings import bench_settings

_BY_NAME = {w.name: w for w in WORKLOADS}


def _settings(backends: list[str]) -> BenchSettings:
    return bench_settings(
        backends=backends,
        workloads=["print", "sympy", "timeout"],
        concurrency=[1, 16],
        calls=4,
        pool_size=8,
        timeout=30.0,
        extras=True,
        undrained_calls=4,
        sustained_calls=10,
        sustained_concurrency=16,
        sustained_pool_size=4,
        cpu_calls=4,
        command="retool-exec bench --backends local,docker-reuse",
    )


def _cell(
    backend: str, workload: str, concurrency: int, latency: float, *, rate: float = 10.0
) -> CellResult:
    calls = 4
    outcome = "timeout" if workload == "timeout" else "success"
    return CellResult(
        backend=backend,
        workload=workload,
        concurrency=concurrency,
        latencies=[latency] * calls,
        queue_waits=[0.0] * calls,
        outcomes=[outcome] * calls,
        segment_walls=[calls / rate],
        segment_calls=[calls],
    )


def _result(reuse_print: float = 0.005, reuse_rate: float = 50.0) -> BenchResult:
    result = BenchResult(started_at="t", settings=_settings(["local", "docker-reuse"]))
    result.cells = [
        _cell("local", "print", 1, 0.030),
        _cell("docker-reuse", "print", 1, reuse_print),
        _cell("local", "print", 16, 0.2, rate=20.0),
        _cell("docker-reuse", "print", 16, 0.1, rate=reuse_rate),
        _cell("local", "sympy", 1, 0.700),
        _cell("docker-reuse", "sympy", 1, 0.020),
        _cell("local", "timeout", 1, 1.05),
        _cell("docker-reuse", "timeout", 1, 1.01),
    ]
    return result


def _verdicts(result: BenchResult) -> dict[str, str]:
    return {t.name: t.verdict for t in evaluate_targets(result)}


def test_targets_pass_when_the_numbers_do() -> None:
    verdicts = _verdicts(_result())
    assert verdicts["reuse print p50"] == "PASS"
    assert verdicts["reuse sympy p50"] == "PASS"
    assert verdicts["reuse throughput x16"] == "PASS"
    assert verdicts["timeout local"] == "PASS"
    assert verdicts["timeout docker-reuse"] == "PASS"


def test_targets_fail_when_the_numbers_do() -> None:
    verdicts = _verdicts(_result(reuse_print=0.010, reuse_rate=30.0))
    assert verdicts["reuse print p50"] == "FAIL"  # 10/30 = 0.33 > 0.3
    assert verdicts["reuse throughput x16"] == "FAIL"  # 30/20 = 1.5 < 2


def test_targets_without_figures_are_not_measured_never_passed() -> None:
    verdicts = _verdicts(_result())
    assert verdicts["fresh undrained p50"] == "NOT MEASURED"
    assert verdicts["fresh sustained"] == "NOT MEASURED"


def test_a_fast_cell_with_failed_calls_fails_its_target() -> None:
    result = _result()
    cell = result.cell("docker-reuse", "sympy", 1)
    assert cell is not None
    cell.failures = 1
    assert _verdicts(result)["reuse sympy p50"] == "FAIL"


def test_timeout_target_uses_service_time_and_concurrency_one() -> None:
    result = _result()
    slow = _cell("docker-reuse", "timeout", 16, 4.0)
    slow.queue_waits = [2.9] * 4  # queued behind other calls: 4.0 - 2.9 - 1.0 = 0.1 s
    result.cells.append(slow)
    assert _verdicts(result)["timeout docker-reuse"] == "PASS"
    slow.queue_waits = [1.0] * 4  # 4.0 - 1.0 - 1.0 = 2.0 s > 1 s
    assert _verdicts(result)["timeout docker-reuse"] == "FAIL"


def test_fresh_targets_from_their_own_measurements() -> None:
    result = _result()
    result.settings.backends.append("docker-fresh")
    result.fresh_undrained = [
        FreshUndrained(
            workload="print",
            local_latencies=[0.030] * 3,
            fresh_latencies=[0.010] * 3,
            refill_waits=[0.4] * 3,
        )
    ]
    result.fresh_sustained = FreshSustained(
        pool_size=4,
        concurrency=16,
        calls=8,
        wall_seconds=3.0,
        finish_times=[0.1, 0.1, 0.1, 0.1, 0.6, 1.1, 1.6, 2.1],
        latencies=[0.1] * 8,
        failures=0,
        steady_throughput=2.0,
    )
    verdicts = _verdicts(result)
    assert verdicts["fresh undrained p50"] == "PASS"
    assert verdicts["fresh sustained"] == "FAIL"  # 2 calls/s < 8
    result.fresh_sustained.steady_throughput = 8.5
    assert _verdicts(result)["fresh sustained"] == "PASS"


def test_scaling_targets_compare_reuse_with_itself() -> None:
    result = _result(reuse_rate=50.0)
    result.cells.append(_cell("docker-reuse", "print", 64, 0.1, rate=80.0))
    one = result.cell("docker-reuse", "print", 1)
    assert one is not None
    one.segment_walls = [4 / 40.0]  # 40 calls/s alone
    verdicts = _verdicts(result)
    assert verdicts["reuse scaling print x16"] == "FAIL"  # 50 / 40 = 1.25
    assert verdicts["reuse scaling print x64"] == "PASS"  # 80 / 40 = 2.0
    assert verdicts["reuse scaling sympy x16"] == "NOT MEASURED"


def test_runsc_print_is_judged_against_local() -> None:
    result = _result()
    result.settings.backends.append("docker-runsc")
    result.cells.append(_cell("docker-runsc", "print", 1, 0.025))
    assert _verdicts(result)["docker-runsc print p50"] == "PASS"  # 25 / 30 ms
    result.cells[-1] = _cell("docker-runsc", "print", 1, 0.045)
    assert _verdicts(result)["docker-runsc print p50"] == "FAIL"


def test_client_cpu_and_working_set_targets() -> None:
    result = _result()
    assert _verdicts(result)["reuse client CPU"] == "NOT MEASURED"
    result.cpu_per_call = [
        CpuPerCall(backend="docker-reuse", calls=100, cpu_seconds=0.04, wall_seconds=1.0)
    ]
    result.memory = [
        PoolMemory(
            backend="docker-reuse",
            pool_size=1,
            containers=[
                ContainerMemory(
                    id="x", usage_bytes=50 << 20, working_set_bytes=45 << 20, source="cgroup"
                )
            ],
        )
    ]
    verdicts = _verdicts(result)
    assert verdicts["reuse client CPU"] == "PASS"  # 0.4 ms
    assert verdicts["reuse working set"] == "FAIL"  # 45 MiB > 40


def test_result_round_trips_through_json() -> None:
    result = _result()
    result.summary = summary_json(result)
    again = BenchResult.model_validate_json(result.model_dump_json(by_alias=True))
    assert again.cells == result.cells
    assert '"schema"' in result.model_dump_json(by_alias=True)


def test_text_report_shows_ratio_to_local_and_verdicts() -> None:
    text = render_text(_result())
    assert "== print" in text
    assert "0.17x" in text  # 5 ms / 30 ms
    assert "PASS" in text


def test_markdown_table_escapes_pipes() -> None:
    from retool_exec.bench.report import Table

    rendered = render_markdown_table(Table("t", ["a", "b"], [["x|y", "1"]]))
    assert "x\\|y" in rendered
    assert rendered.splitlines()[1] == "|---|---:|"  # words left, figures right


def test_workload_failure_checks_outcome_and_output() -> None:
    sympy = _BY_NAME["sympy"]
    good = ExecResult(True, "[2, 3]\n", "", 0, False, 0.02)
    missing = ExecResult(False, "", "ModuleNotFoundError: No module named 'sympy'", 1, False, 0.02)
    wrong = ExecResult(True, "[]\n", "", 0, False, 0.02)
    assert sympy.failure(good) is None
    assert "ModuleNotFoundError" in (sympy.failure(missing) or "")
    assert "lacks" in (sympy.failure(wrong) or "")
    timeout = _BY_NAME["timeout"]
    assert timeout.failure(ExecResult(False, "", "", None, True, 1.0)) is None
    assert timeout.expected is Outcome.TIMEOUT


def test_progress_prints_plain_lines_when_not_a_terminal() -> None:
    import io

    from retool_exec.bench.progress import Progress

    stream = io.StringIO()
    progress = Progress(4, stream=stream)
    progress.phase("print x1")
    progress.advance(4)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("0%  print x1")
    assert lines[-1].endswith("done: 4 calls")
    assert "\r" not in stream.getvalue()


def test_progress_can_be_silenced() -> None:
    import io

    from retool_exec.bench.progress import Progress

    stream = io.StringIO()
    progress = Progress(1, stream=stream, enabled=False)
    progress.phase("x")
    progress.advance()
    progress.close()
    assert stream.getvalue() == ""
