"""``retool-exec bench``: its exit status follows the targets, a baseline without the math
stack is NOT MEASURED (not FAIL), backend names and settings come from the table, and pool
figures come from ``DockerBackend.pool_stats()``."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from retool_exec import ConfigError, DockerConfig, LocalConfig, Sandbox
from retool_exec.backends.docker.backend import DockerBackend, PoolStats
from retool_exec.bench import runner
from retool_exec.bench.backends import bench_config, is_docker, parse_backends
from retool_exec.bench.results import BenchResult, BenchSettings, CellResult
from retool_exec.bench.targets import evaluate_targets
from retool_exec.cli import build_parser, main
from retool_exec.cli.cmd_bench import build_settings
from tests.bench_settings import bench_settings
from tests.conftest import LABELS, require_docker


def _settings(backends: list[str]) -> BenchSettings:
    return bench_settings(backends=backends, workloads=["print", "sympy"], calls=3)


def _cell(backend: str, workload: str, latency: float, failures: int = 0) -> CellResult:
    return CellResult(
        backend=backend,
        workload=workload,
        concurrency=1,
        latencies=[latency] * 3,
        queue_waits=[0.0] * 3,
        outcomes=["error" if failures else "success"] * 3,
        failures=failures,
        segment_walls=[latency] * 3,
        segment_calls=[1, 1, 1],
    )


def _result(*, local_has_sympy: bool, reuse_print: float = 0.005) -> BenchResult:
    result = BenchResult(started_at="now", settings=_settings(["local", "docker"]))
    result.environment["local_python"] = {
        "modules": {"numpy": None, "sympy": "1.12" if local_has_sympy else None}
    }
    result.cells = [
        _cell("local", "print", 0.030),
        _cell("docker", "print", reuse_print),
        _cell("local", "sympy", 0.600, failures=0 if local_has_sympy else 3),
        _cell("docker", "sympy", 0.020),
    ]
    return result


def _verdict(result: BenchResult, name: str) -> str:
    return next(t.verdict for t in evaluate_targets(result) if t.name == name)


def test_a_baseline_without_sympy_is_not_measured_not_failed() -> None:
    result = _result(local_has_sympy=False)
    assert _verdict(result, "reuse sympy p50") == "NOT MEASURED"
    measured = next(t.measured for t in evaluate_targets(result) if t.name == "reuse sympy p50")
    assert "cannot import sympy" in measured and "--local-python" in measured
    assert _verdict(result, "reuse print p50") == "PASS"


def test_a_baseline_with_sympy_is_measured() -> None:
    assert _verdict(_result(local_has_sympy=True), "reuse sympy p50") == "PASS"


def _bench_returning(
    monkeypatch: pytest.MonkeyPatch, result: BenchResult, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    async def fake_run_bench(settings: BenchSettings, workloads: Any, **_: Any) -> BenchResult:
        return result

    monkeypatch.setattr(runner, "run_bench", fake_run_bench)
    status = main(["bench", "--backends", "local,docker", "--no-progress", "--no-extras"])
    return status, capsys.readouterr().err


def test_bench_exits_0_when_no_target_failed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _ = _bench_returning(monkeypatch, _result(local_has_sympy=False), capsys)
    assert status == 0


def test_bench_exits_1_when_a_target_failed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = _result(local_has_sympy=True, reuse_print=0.029)  # 0.97 x local > 0.3 x
    status, err = _bench_returning(monkeypatch, slow, capsys)
    assert status == 1
    assert "1 target(s) FAILED: reuse print p50" in err


def test_bench_backends_come_from_the_table() -> None:
    assert parse_backends("local,docker-runsc,fake") == ("local", "docker-runsc", "fake")
    assert is_docker("docker-runsc") and not is_docker("local") and not is_docker("fake")
    with pytest.raises(ConfigError, match="same backend"):
        parse_backends("docker-reuse,docker")


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", *argv])


def test_bench_settings_reach_the_docker_configs_only() -> None:
    args = _args(
        "--backends", "local,docker-runsc", "--set", "pids=64", "--docker-host", "tcp://h:1"
    )
    settings, _ = build_settings(args)
    assert settings.backend_settings == {"pids": 64, "docker_host": "tcp://h:1"}
    assert "--set pids=64" in settings.command
    runsc = bench_config(
        "docker-runsc", timeout=5, pool_size=2, labels=LABELS, settings=settings.backend_settings
    )
    assert isinstance(runsc, DockerConfig)
    assert (runsc.runtime, runsc.pids, runsc.pool_size) == ("runsc", 64, 2)
    assert runsc.docker_host == "tcp://h:1"
    assert runsc.labels == LABELS
    local = bench_config("local", timeout=5, pool_size=2, settings=settings.backend_settings)
    assert isinstance(local, LocalConfig)


def test_bench_flags_own_their_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--backends", "docker", "--set", "pool_size=2"]) == 2
    assert "--pool-size" in capsys.readouterr().err
    assert main(["bench", "--backends", "local", "--set", "pool_sise=2"]) == 2
    assert "unknown setting 'pool_sise'" in capsys.readouterr().err


def test_pool_stats_is_none_before_start() -> None:
    assert DockerBackend(DockerConfig()).pool_stats() is None


@pytest.mark.docker
def test_pool_stats_of_a_started_pool() -> None:
    require_docker()
    with Sandbox(DockerConfig(pool_size=1, labels=LABELS, preload=())) as sandbox:
        sandbox.start()
        backend = sandbox.backend
        assert isinstance(backend, DockerBackend)
        stats = backend.pool_stats()
        assert isinstance(stats, PoolStats)
        assert (stats.size, stats.ready, stats.started) == (1, 1, 1)
        assert stats.pool_id
        with pytest.raises(AttributeError):
            stats.size = 2  # type: ignore[misc]
    assert backend.pool_stats() is None
