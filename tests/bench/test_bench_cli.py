"""``retool-exec bench --quick`` end to end, with a reduced call count so it stays fast.

Checks what a reader relies on: a table per workload with the ratio to local,
a JSON file with every raw latency and the environment, and a PNG when
matplotlib is there (a clear install hint when it is not).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from retool_exec.bench import runner
from retool_exec.bench.workloads import WORKLOADS
from retool_exec.cli import main
from tests.conftest import LABELS, require_docker

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
_LABEL_ARGS = [arg for key, value in LABELS.items() for arg in ("--label", f"{key}={value}")]
# Small enough to finish in seconds: two concurrency levels, a few calls each.
_FAST = [
    "--quick",
    "--calls",
    "2",
    "--concurrency",
    "1,2",
    "--cpu-calls",
    "2",
    "--undrained-calls",
    "2",
    "--sustained-calls",
    "6",
    "--no-progress",
]


def _run(
    backends: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[str, dict[str, object]]:
    out_json = tmp_path / "bench.json"
    args = ["bench", "--backends", backends, *_FAST, "--json", str(out_json), *extra]
    if HAVE_MATPLOTLIB:
        args += ["--plot", str(tmp_path / "bench.png")]
    status = main(args)
    text = capsys.readouterr().out
    data: dict[str, object] = json.loads(out_json.read_text())
    # The exit status is the targets' verdict: 1 exactly when one of them FAILED.
    summary = data["summary"]
    assert isinstance(summary, dict)
    failed = [t["name"] for t in summary["targets"] if t["verdict"] == "FAIL"]
    assert status == (1 if failed else 0), failed
    return text, data


def _check_common(text: str, data: dict[str, object], backends: list[str], tmp_path: Path) -> None:
    for workload in WORKLOADS:
        assert f"== {workload.name}:" in text
    assert "p50 vs local" in text
    assert "== targets" in text
    cells = data["cells"]
    assert isinstance(cells, list)
    assert {c["backend"] for c in cells} == set(backends)
    for cell in cells:
        # Every raw latency is there, not only the percentiles.
        assert len(cell["latencies"]) == len(cell["outcomes"]) == sum(cell["segment_calls"])
        assert all(lat > 0 for lat in cell["latencies"])
    env = data["environment"]
    assert isinstance(env, dict)
    assert env["cpu_count"]
    assert env["kernel"]
    packages = env["packages"]
    assert {"retool_exec", "docker", "pydantic", "python"} <= set(packages)
    summary = data["summary"]
    assert isinstance(summary, dict)
    assert summary["targets"]
    if HAVE_MATPLOTLIB:
        assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_quick_local_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, data = _run("local", tmp_path, capsys)
    _check_common(text, data, ["local"], tmp_path)
    # Errors and timeouts are the expected outcomes of their workloads, not failures.
    for cell in data["cells"]:  # type: ignore[attr-defined]
        if cell["workload"] in {"print", "error", "timeout", "sleep", "flood"}:
            assert cell["failures"] == 0, cell["failure_examples"]
    sessions = data["sessions"]
    assert isinstance(sessions, list) and len(sessions) == 1
    figures = sessions[0]
    assert figures["backend"] == "local" and figures["error"] is None, figures["error"]
    assert len(figures["cell_latencies"]) == len(figures["call_latencies"]) == 10
    assert len(figures["fork_latencies"]) == 5 and figures["fork_failures"] == 0
    assert "== sessions: print(2+3) as a cell of a warm session" in text


@pytest.mark.docker
def test_bench_quick_local_and_docker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_docker()
    text, data = _run("local,docker", tmp_path, capsys, "--pool-size", "2", *_LABEL_ARGS)
    _check_common(text, data, ["local", "docker"], tmp_path)
    assert "docker" in text
    for cell in data["cells"]:  # type: ignore[attr-defined]
        if cell["backend"] == "docker":
            assert cell["failures"] == 0, cell["failure_examples"]
    env = data["environment"]
    assert isinstance(env, dict)
    docker_env = env["docker"]
    assert docker_env["server_version"]
    assert "runc" in docker_env["runtimes"]
    assert docker_env["image"]["id"].startswith("sha256:")
    backends = {b["name"]: b for b in data["backends"]}  # type: ignore[attr-defined]
    assert backends["docker"]["startup_seconds"] > 0
    assert backends["docker"]["pool_size"] == 2
    memory = data["memory"]
    assert isinstance(memory, list)
    assert memory[0]["containers"], memory
    assert all(c["usage_bytes"] > 0 for c in memory[0]["containers"])
    docker = next(f for f in data["sessions"] if f["backend"] == "docker")  # type: ignore[attr-defined]
    assert docker["error"] is None, docker["error"]
    assert docker["turns"] == 3 and len(docker["conversation_session"]) == 1  # --quick
    assert docker["conversation_failures"] == docker["fork_failures"] == 0
    assert len(docker["fork_latencies"]) == 5
    summary = data["summary"]
    assert isinstance(summary, dict)
    names = {t["name"]: t["verdict"] for t in summary["targets"]}
    assert names["reuse session conversation"] != "NOT MEASURED"


def test_plot_without_matplotlib_says_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    status = main(["bench", "--backends", "local", "--plot", str(tmp_path / "x.png")])
    assert status == 2
    err = capsys.readouterr().err
    assert "pip install 'retool_exec[bench]'" in err
    assert not (tmp_path / "x.png").exists()


def test_bench_rejects_an_unknown_backend(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--backends", "local,nope"]) == 2
    assert "unknown backend" in capsys.readouterr().err


def test_bench_rejects_an_unknown_workload(capsys: pytest.CaptureFixture[str]) -> None:
    """As --backends nope: one line naming the bad and the known ones, status 2 (not 1,
    which says a target FAILED)."""
    assert main(["bench", "--backends", "local", "--workloads", "print,nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "unknown workload(s) nope" in err
    assert "choose from " + ", ".join(w.name for w in WORKLOADS) in err


def _refuse_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    async def run_bench(*_: object, **__: object) -> None:
        pytest.fail("the benchmark ran before its output paths were checked")

    monkeypatch.setattr(runner, "run_bench", run_bench)


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_bench_refuses_an_output_it_cannot_write_before_it_runs(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if flag == "--plot" and not HAVE_MATPLOTLIB:
        pytest.skip("--plot needs matplotlib")
    _refuse_to_run(monkeypatch)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for path in ("/proc/x.out", str(a_file / "x.out"), str(tmp_path)):
        assert main(["bench", "--backends", "local", "--no-progress", flag, path]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"retool-exec bench: {flag} {path}: cannot write it: "), err


def test_bench_output_checks_leave_no_file_and_keep_an_existing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check writes nothing: a new path is not left behind as an empty file when the
    run stops, and an existing one is not truncated; a missing folder is made, as the
    writes at the end always did."""
    if not HAVE_MATPLOTLIB:
        pytest.skip("--plot needs matplotlib")
    _refuse_to_run(monkeypatch)
    new = tmp_path / "made" / "new.json"
    kept = tmp_path / "kept.json"
    kept.write_text("keep")
    for json_path in (new, kept):
        argv = ["bench", "--backends", "local", "--json", str(json_path), "--plot", "/proc/x.png"]
        assert main(argv) == 2
        assert "--plot /proc/x.png: cannot write it" in capsys.readouterr().err
    assert not new.exists() and new.parent.is_dir()
    assert kept.read_text() == "keep"


def test_an_output_that_is_a_link_to_nothing_or_a_folder_is_judged_as_its_write_would(
    tmp_path: Path,
) -> None:
    """A link to nothing was refused ("No such file or directory") though the write at the
    end makes its target; a folder is refused in one line (the review of the round)."""
    from retool_exec.cli._common import UsageError, check_output_file

    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / "target.json")
    check_output_file(link, "--json")
    assert link.is_symlink() and not (tmp_path / "target.json").exists()
    with pytest.raises(UsageError, match=r"--json .*: cannot write it"):
        check_output_file(tmp_path, "--json")
