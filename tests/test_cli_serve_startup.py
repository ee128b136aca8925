"""``retool-exec serve``: any backend of the table, every setting, and start-up failures
that are one line (daemon down, unknown runtime, bad or taken port), not a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from retool_exec import DockerConfig, FakeConfig
from retool_exec.cli import build_parser, main
from retool_exec.cli.cmd_serve import build_config
from tests.conftest import require_docker

pytestmark = pytest.mark.server


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "retool_exec.cli", "serve", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line_error(done: subprocess.CompletedProcess[str], status: int) -> str:
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("retool-exec serve: ")
    return lines[0]


@pytest.mark.parametrize(
    ("name", "policy", "runtime"),
    [
        ("docker", "reuse", None),
        ("docker-fresh", "fresh", None),
        ("docker-runsc", "reuse", "runsc"),
    ],
)
def test_serve_takes_every_docker_name_of_the_table(
    name: str, policy: str, runtime: str | None
) -> None:
    config = build_config(build_parser().parse_args(["serve", "--backend", name]))
    assert isinstance(config, DockerConfig)
    assert (config.policy, config.runtime) == (policy, runtime)


def test_serve_takes_the_fake_backend_too() -> None:
    config = build_config(build_parser().parse_args(["serve", "--backend", "fake"]))
    assert isinstance(config, FakeConfig)


def test_serve_settings_from_config_and_set(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text('memory_mb = 512\npolicy = "fresh"\n')
    args = build_parser().parse_args(
        ["serve", "--config", str(path), "--set", "pids=64", "--max-concurrency", "3"]
    )
    config = build_config(args)
    assert isinstance(config, DockerConfig)
    assert (config.memory_mb, config.policy, config.pids, config.pool_size) == (512, "fresh", 64, 3)
    # The command's own flags win over --set.
    args = build_parser().parse_args(["serve", "--set", "policy=fresh", "--policy", "reuse"])
    assert build_config(args).policy == "reuse"  # type: ignore[attr-defined]


def test_serve_unknown_backend_or_setting_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--backend", "dokcer"]) == 2
    assert main(["serve", "--set", "pool_sise=2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert "no backend named 'dokcer'" in err[0]
    assert "unknown setting 'pool_sise'" in err[1]


def test_serve_bad_port_is_one_line() -> None:
    line = one_line_error(serve("--backend", "fake", "--port", "70000"), 2)
    assert "--port must be between 0 and 65535" in line


def test_serve_taken_port_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        line = one_line_error(serve("--backend", "fake", "--port", str(port)), 69)
    assert f"cannot listen on 127.0.0.1:{port}" in line


def test_serve_daemon_down_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-daemon.sock"
    line = one_line_error(serve("--docker-host", f"unix://{missing}", "--port", "0"), 69)
    assert "cannot reach the Docker daemon" in line


@pytest.mark.docker
def test_serve_unknown_runtime_is_one_line() -> None:
    require_docker()
    line = one_line_error(serve("--runtime", "no-such-runtime", "--port", "0"), 69)
    assert "no runtime 'no-such-runtime'" in line
