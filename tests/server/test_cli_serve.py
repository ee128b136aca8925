"""``retool-exec serve``: arguments, refusals, and one real run as a subprocess."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import docker
import httpx
import pytest

from retool_exec.backends.config import DockerConfig, LocalConfig
from retool_exec.cli import build_parser, main
from retool_exec.cli.cmd_serve import TOKEN_ENV, build_config, is_loopback
from tests.conftest import TEST_LABEL, require_docker

pytestmark = pytest.mark.server


def test_defaults_bind_to_loopback_with_docker() -> None:
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.backend) == ("127.0.0.1", 8080, "docker")
    config = build_config(args)
    assert isinstance(config, DockerConfig)
    assert config.policy == "reuse"
    assert config.memory_mb == 1024


def test_options_reach_the_config() -> None:
    args = build_parser().parse_args(
        ["serve", "--max-concurrency", "6", "--max-memory-mb", "2048", "--policy", "fresh"]
    )
    config = build_config(args)
    assert isinstance(config, DockerConfig)
    assert (config.pool_size, config.memory_mb, config.policy) == (6, 2048, "fresh")
    local = build_config(build_parser().parse_args(["serve", "--backend", "local"]))
    assert isinstance(local, LocalConfig)


def test_the_body_limit_is_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """verl's JSON spends up to 6 bytes on a character of stdin (``\\uXXXX``): a 4.5 MB
    input in a non-Latin script needs a body limit above the default 8 MiB."""
    assert build_parser().parse_args(["serve"]).max_body_bytes == 8 << 20
    args = build_parser().parse_args(["serve", "--max-body-mb", "40.5"])
    assert args.max_body_bytes == int(40.5 * (1 << 20))
    for bad in ("nan", "inf", "0", "-1", "lots"):
        with pytest.raises(SystemExit) as stopped:
            build_parser().parse_args(["serve", "--max-body-mb", bad])
        assert stopped.value.code == 2
        assert "--max-body-mb" in capsys.readouterr().err


def test_the_shutdown_grace_is_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """Calls may run past the default 10 s (``--max-run-timeout``): the grace they get
    at a stop is the operator's to set, within bounds (``test_shutdown.py`` runs it)."""
    assert build_parser().parse_args(["serve"]).shutdown_grace == 10
    assert build_parser().parse_args(["serve", "--shutdown-grace", "0"]).shutdown_grace == 0
    assert build_parser().parse_args(["serve", "--shutdown-grace", "75.5"]).shutdown_grace == 75.5
    for bad in ("nan", "inf", "-1", "3601", "soon"):
        with pytest.raises(SystemExit) as stopped:
            build_parser().parse_args(["serve", "--shutdown-grace", bad])
        assert stopped.value.code == 2
        assert "--shutdown-grace" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-concurrency", "0"),
        ("--max-concurrency", "-2"),
        ("--max-queue", "-1"),
        ("--queue-timeout", "0"),
        ("--queue-timeout", "-1"),
        ("--queue-timeout", "inf"),
        ("--queue-timeout", "nan"),
    ],
)
def test_serve_refuses_a_limit_out_of_range(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """One line naming the flag, before anything starts (``--max-concurrency 0`` was the
    CPU count). ``--port 70000``: a value let through stops the command there instead."""
    assert main(["serve", "--backend", "fake", "--port", "70000", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"retool-exec serve: {flag} must be "), err
    assert value in err


def test_serve_takes_the_edges_of_its_limits(capsys: pytest.CaptureFixture[str]) -> None:
    limits = ["--max-concurrency", "1", "--max-queue", "0", "--queue-timeout", "0.5"]
    config = build_config(build_parser().parse_args(["serve", *limits]))
    assert isinstance(config, DockerConfig) and config.pool_size == 1
    # Let through, they stop the command at the bad port instead.
    assert main(["serve", "--backend", "fake", "--port", "70000", *limits]) == 2
    assert "--port must be between 0 and 65535" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.5", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_local_backend_is_refused_off_loopback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--backend", "local", "--host", "0.0.0.0"]) == 2
    assert "without isolation" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_serve_runs_as_a_process_with_a_token_from_the_environment() -> None:
    port = _free_port()
    env = {**os.environ, TOKEN_ENV: "env-token"}
    command = [
        sys.executable,
        "-m",
        "retool_exec.cli",
        "serve",
        "--backend",
        "local",
        "--port",
        str(port),
        "--root-path",
        "/faas/sandbox/",
        "--max-body-mb",
        "1",
        "--log-level",
        "warning",
    ]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/v1/ping", timeout=1).json() == "pong":
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.communicate()[1].decode()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        body = {"code": "print(6 * 7)"}
        assert httpx.post(f"{base}/faas/sandbox/run_code", json=body).status_code == 401
        response = httpx.post(
            f"{base}/faas/sandbox/run_code",
            json=body,
            headers={"Authorization": "Bearer env-token"},
            timeout=30,
        )
        assert response.json()["run_result"]["stdout"] == "42\n"
        too_large = {"code": "print(1)", "stdin": "x" * (1 << 20)}  # the body limit: 1 MiB
        refused = httpx.post(
            f"{base}/faas/sandbox/run_code",
            json=too_large,
            headers={"Authorization": "Bearer env-token"},
            timeout=30,
        )
        assert refused.status_code == 413
        # Headers that never end are cut off (408) before the token is checked (no 401).
        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            started = time.monotonic()
            slow.sendall(b"POST /faas/sandbox/run_code HTTP/1.1\r\nHost: x\r\n")
            answer = b""
            while chunk := slow.recv(4096):
                answer += chunk
            assert time.monotonic() - started < 8
            assert answer.startswith(b"HTTP/1.1 408")
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
    # A clean shutdown on Ctrl-C: uvicorn re-raises SIGINT, `main` maps it to 130.
    assert process.returncode == 130
    assert b"Traceback" not in stderr


@pytest.mark.docker
def test_sigterm_stops_a_docker_server_and_removes_its_containers() -> None:
    """A supervisor (systemd, Kubernetes) stops a service with SIGTERM: the server closes
    its sandbox as on Ctrl-C and exits 0, leaving none of its containers behind."""
    require_docker()
    port = _free_port()
    label = f"sigterm-{os.getpid()}"
    command = [
        *(sys.executable, "-m", "retool_exec.cli", "serve", "--backend", "docker"),
        *("--port", str(port), "--max-concurrency", "2", "--log-level", "warning"),
        *("--set", f'labels={{"{TEST_LABEL}": "{label}"}}'),
    ]
    client = docker.from_env()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = httpx.post(
                    f"http://127.0.0.1:{port}/run_code", json={"code": "print(6 * 7)"}, timeout=30
                )
                break
            except httpx.TransportError:
                assert process.poll() is None, process.communicate()[1].decode()
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert answer.json()["run_result"]["stdout"] == "42\n"
        ours = {"label": f"{TEST_LABEL}={label}"}
        assert client.api.containers(all=True, filters=ours)  # the pool is up
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=40)
        assert process.returncode == 0, stderr.decode()
        assert client.api.containers(all=True, filters=ours) == []
    finally:
        _stop_and_sweep(process, client, {"label": f"{TEST_LABEL}={label}"})


@pytest.mark.docker
def test_sigterm_while_the_pool_starts_removes_its_containers() -> None:
    """A stop can come while the pool warms up (seconds): the sandbox is closed then too,
    rather than the process ending with its first containers left behind."""
    require_docker()
    label = f"sigterm-start-{os.getpid()}"
    command = [
        *(sys.executable, "-m", "retool_exec.cli", "serve", "--backend", "docker"),
        *("--port", str(_free_port()), "--max-concurrency", "2", "--log-level", "warning"),
        *("--set", f'labels={{"{TEST_LABEL}": "{label}"}}', "--set", "pool_size=6"),
    ]
    client = docker.from_env()
    ours = {"label": f"{TEST_LABEL}={label}"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not client.api.containers(all=True, filters=ours):  # the first is being made
            assert process.poll() is None, process.communicate()[1].decode()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr.decode()
        assert client.api.containers(all=True, filters=ours) == []
    finally:
        _stop_and_sweep(process, client, ours)


def _stop_and_sweep(
    process: subprocess.Popen[bytes], client: docker.DockerClient, ours: dict[str, str]
) -> None:
    """Leave nothing behind: the server process, then any container it left."""
    if process.poll() is None:
        process.kill()
        process.communicate()
    for container in client.api.containers(all=True, filters=ours):
        client.api.remove_container(container["Id"], force=True)
    client.close()
