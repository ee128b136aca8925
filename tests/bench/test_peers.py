"""benchmarks/peers.py: the pure parts (results, statistics, table, section, image recipe).

None of these tests needs Docker or the peers' venvs, so ``make test`` runs them
anywhere. The one test that drives a real peer worker needs both and runs
only with RETOOL_EXEC_PEERS=1 (after ``benchmarks/peers/setup.sh``).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from retool_exec import Outcome
from retool_exec.bench.results import CellResult
from retool_exec.bench.workloads import select_workloads

ROOT = Path(__file__).resolve().parents[2]


def _load_peers() -> ModuleType:
    """benchmarks/ is not a package: load the script by path (registered, for pydantic)."""
    spec = importlib.util.spec_from_file_location("peers", ROOT / "benchmarks" / "peers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["peers"] = module
    spec.loader.exec_module(module)
    return module


peers = _load_peers()
PRINT, ERROR = select_workloads(["print", "error"])


def _cell(backend: str, workload: str, latencies: list[float], failures: int = 0) -> CellResult:
    return CellResult(
        backend=backend,
        workload=workload,
        concurrency=1,
        latencies=latencies,
        failures=failures,
        failure_examples=["boom"] * failures,
    )


def _result(cells: list[CellResult], names: tuple[str, ...] = ("local", "epicbox")) -> Any:
    return peers.PeersResult(
        started_at="2026-01-01T00:00:00+00:00",
        duration_seconds=90.0,
        command="python benchmarks/peers.py --quick",
        quick=True,
        calls=5,
        warmup=1,
        timeout=30.0,
        memory_mb=1024,
        image="retool-exec-sandbox:0123456789abcdef",
        peer_image="retool-exec-bench-peers:fedcba9876543210",
        backends=[peers.PeerBackend(name=n, peer=n in peers.PEERS) for n in names],
        cells=cells,
        environment={"source": {"commit": "a" * 40, "dirty": False}},
    )


def _rows(table: Any) -> dict[tuple[str, str], list[str]]:
    return {(row[0], row[1]): row for row in table.rows}


def test_table_has_percentiles_and_ratio_to_local_p50() -> None:
    # local: p50 = 0.020, epicbox p50 = 0.300 (15x); p95 of 1..5 ms-steps by linear rank.
    result = _result(
        [
            _cell("local", "print", [0.010, 0.020, 0.030]),
            _cell("epicbox", "print", [0.100, 0.200, 0.300, 0.400, 0.500], failures=1),
        ]
    )
    rows = _rows(peers.peers_table(result))
    assert rows[("print", "local")][2:] == ["3", "20.0", "29.0", "1.00x", "0"]
    # epicbox: p50 300 ms, p95 = 400 + 0.8 * 100 = 480 ms, 300 / 20 = 15x.
    assert rows[("print", "epicbox")][2:] == ["5", "300.0", "480.0", "15.00x", "1"]


def test_table_without_local_has_no_ratio() -> None:
    result = _result([_cell("epicbox", "sympy", [0.5, 0.7])])
    assert _rows(peers.peers_table(result))[("sympy", "epicbox")][5] == "-"


def test_table_keeps_backend_order_and_lists_failure_examples() -> None:
    result = _result(
        [_cell("epicbox", "print", [0.2], failures=1), _cell("local", "print", [0.02])],
        names=("local", "epicbox"),
    )
    table = peers.peers_table(result)
    assert [row[1] for row in table.rows] == ["local", "epicbox"]
    assert table.notes == ["epicbox print: boom"]


@pytest.mark.parametrize(
    ("reply", "outcome", "workload", "fails"),
    [
        ({"exit_code": 0, "stdout": "5\n", "stderr": ""}, Outcome.SUCCESS, PRINT, False),
        ({"exit_code": 0, "stdout": "6\n", "stderr": ""}, Outcome.SUCCESS, PRINT, True),
        (
            {"exit_code": 1, "stdout": "", "stderr": "ZeroDivisionError"},
            Outcome.ERROR,
            ERROR,
            False,
        ),
        ({"exit_code": None, "timed_out": True}, Outcome.TIMEOUT, PRINT, True),
        ({"exit_code": 137, "oom_killed": True}, Outcome.OOM, PRINT, True),
        ({"error": "DockerError: gone"}, Outcome.SANDBOX_ERROR, PRINT, True),
    ],
)
def test_worker_replies_are_judged_like_our_results(
    reply: dict[str, object], outcome: Outcome, workload: Any, fails: bool
) -> None:
    result = peers.peer_exec_result("epicbox", {"latency": 0.25, **reply})
    assert result.outcome is outcome
    assert result.latency == 0.25
    assert result.backend == "epicbox"
    assert (workload.failure(result) is not None) is fails


def test_section_has_command_table_and_what_each_peer_does() -> None:
    result = _result(
        [_cell("local", "print", [0.02]), _cell("epicbox", "print", [0.3])],
        names=("local", "epicbox"),
    )
    section = peers.render_section(result, json_name="benchmarks-peers.json")
    assert section.startswith("## Peers\n")
    assert "python benchmarks/peers.py" in section
    assert "`python benchmarks/peers.py --quick`" in section
    assert "2026-01-01T00:00:00+00:00" in section and "aaaaaaaaaaaa" in section
    assert peers.PER_CALL["epicbox"] in section
    assert "| print | epicbox | 1 | 300.0 | 300.0 | 15.00x | 0 |" in section


def test_result_round_trips_through_json() -> None:
    result = _result([_cell("local", "print", [0.02, 0.03])])
    again = peers.PeersResult.model_validate_json(result.model_dump_json(by_alias=True))
    assert again == result
    assert json.loads(result.model_dump_json(by_alias=True))["schema"] == peers.SCHEMA


def test_peer_image_recipe_is_content_addressed() -> None:
    tag = peers.peer_image_tag("sha256:aaa", "retool-exec-sandbox:1")
    assert tag == peers.peer_image_tag("sha256:aaa", "retool-exec-sandbox:1")
    assert tag.startswith("retool-exec-bench-peers:")
    assert tag != peers.peer_image_tag("sha256:bbb", "retool-exec-sandbox:1")
    with tarfile.open(fileobj=io.BytesIO(peers._derive_tar())) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["usr/local/bin/python"].linkname == "/usr/bin/python3"
    assert members["sandbox"].isdir()
    conf = peers._derive_conf("retool-exec-sandbox:1")
    # No entry point (the peers give their own commands); not listed as our sandbox image.
    assert conf["Entrypoint"] == []
    assert conf["Labels"]["org.retool_exec.image"] != "1"
    assert conf["Labels"][peers.LABEL] == "image"


def test_backends_must_include_local() -> None:
    with pytest.raises(SystemExit):
        peers.parse_args(["--backends", "docker-reuse,epicbox"])
    args = peers.parse_args(["--quick", "--backends", "local,llm-sandbox"])
    assert (args.calls, args.warmup, args.backends) == (3, 1, ["local", "llm-sandbox"])


@pytest.mark.docker
@pytest.mark.skipif(
    os.environ.get("RETOOL_EXEC_PEERS") != "1",
    reason="needs Docker and the peers' venvs: set RETOOL_EXEC_PEERS=1 after "
    "benchmarks/peers/setup.sh (and a peers run or `benchmarks/peers.py` once for the image)",
)
def test_epicbox_worker_answers_a_call() -> None:
    from retool_exec.backends.docker.client import connect
    from retool_exec.backends.docker.image import ensure_image

    client = connect()
    image = peers.ensure_peer_image(client, ensure_image(client).tag)
    command = peers.worker_command("epicbox", peers.parse_args([]), image, "test")
    request = json.dumps({"code": "print(2+3)", "timeout": 30}) + "\n"
    done = subprocess.run(
        command, input=request, capture_output=True, text=True, timeout=120, check=True
    )
    ready, reply = (json.loads(line) for line in done.stdout.splitlines())
    assert ready["ready"] and ready["versions"]["epicbox"] == "1.1.0"
    assert peers.peer_exec_result("epicbox", reply).stdout == "5\n"
    assert peers.sweep(client) == 0


def test_make_report_adds_the_peers_section_and_its_link_only_with_a_peers_run() -> None:
    from retool_exec.bench.results import BenchResult
    from tests.bench_settings import bench_settings

    spec = importlib.util.spec_from_file_location(
        "make_report", ROOT / "benchmarks" / "make_report.py"
    )
    assert spec is not None and spec.loader is not None
    make_report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_report)
    bench = BenchResult(started_at="2026-01-01T00:00:00+00:00", settings=bench_settings())
    plain = make_report.render(bench, plot_name="b.png", json_name="b.json")
    assert "## Peers" not in plain and "(#peers)" not in plain
    result = _result([_cell("local", "print", [0.02]), _cell("epicbox", "print", [0.3])])
    page = make_report.render(bench, plot_name="b.png", json_name="b.json", peers_result=result)
    assert "[Peers](#peers)" in page
    assert page.count("\n## Peers\n") == 1
    assert "| print | epicbox | 1 | 300.0 | 300.0 | 15.00x | 0 |" in page
