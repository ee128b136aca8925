"""Real servers for the server tests: uvicorn on 127.0.0.1, a free port, a thread.

Tests talk to them with httpx over TCP, exactly as verl's ``requests`` client
does, so body limits, status codes and headers are those a client sees (not
an in-process test client's). Each server is shut down and its thread joined
when its fixture ends; a server the tests build owns its sandbox and closes
it (containers included) on shutdown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from retool_exec import DockerConfig, ExecResult, FakeBackend, LocalConfig, Outcome, RunRequest
from retool_exec.server import ServerSettings, create_app, uvicorn_config
from tests.conftest import LABELS, require_docker

PREFIX = "/faas/sandbox"
TOKEN = "test-token-0123456789"


def verl_body(code: str, **overrides: Any) -> dict[str, Any]:
    """Exactly the body verl's SandboxFusion client posts (timeouts 30 s, 1024 MB)."""
    body: dict[str, Any] = {
        "compile_timeout": 30,
        "run_timeout": 30,
        "code": code,
        "stdin": None,
        "memory_limit_MB": 1024,
        "language": "python",
        "files": {},
        "fetch_files": [],
    }
    body.update(overrides)
    return body


@contextlib.contextmanager
def serve(app: Any, *, startup_timeout: float = 120.0, **options: Any) -> Iterator[str]:
    """Run ``app`` under uvicorn in a thread; yield its base URL; stop it after.
    ``options`` go to ``uvicorn.Config`` (``timeout_keep_alive``, ...)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # As `retool-exec serve` runs it: the header timeout and connection bound apply.
    config = uvicorn_config(app, log_level="warning", lifespan="on", loop="asyncio", **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive():
            sock.close()
            pytest.fail("the test server failed to start (see the log above)")
        if time.monotonic() > deadline:
            server.should_exit = True
            thread.join(30)
            sock.close()
            pytest.fail(f"the test server did not start within {startup_timeout} s")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()
        assert not thread.is_alive(), "the test server did not shut down"


LOCAL_SETTINGS = ServerSettings(
    prefix=PREFIX,
    max_concurrency=4,
    max_body_bytes=256 * 1024,
    max_file_bytes=16 * 1024,
    max_files_total_bytes=64 * 1024,
    max_fetch_bytes=4096,
    max_run_timeout=20.0,
)


@pytest.fixture(scope="session")
def local_url() -> Iterator[str]:
    """A server over the local backend (fast; NOT isolated), also under ``PREFIX``."""
    with serve(create_app(LocalConfig(timeout=10.0), settings=LOCAL_SETTINGS)) as url:
        yield url


@pytest.fixture(scope="session")
def docker_url() -> Iterator[str]:
    """A server over the Docker backend (reuse policy, 2 warm containers)."""
    require_docker()
    config = DockerConfig(timeout=10.0, policy="reuse", pool_size=2, labels=LABELS)
    settings = ServerSettings(max_concurrency=2, max_queue=256, max_run_timeout=20.0)
    with serve(create_app(config, settings=settings)) as url:
        yield url


@pytest.fixture()
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=70.0) as http:
        yield http


def sandbox_failure(_request: RunRequest) -> ExecResult:
    """A FakeBackend handler: the sandbox broke (not the code)."""
    return ExecResult(
        ok=False,
        stdout="",
        stderr="",
        returncode=None,
        timed_out=False,
        latency=0.01,
        outcome=Outcome.SANDBOX_ERROR,
        backend="fake",
        detail="injected failure: the container vanished",
    )


@pytest.fixture()
def fake_server() -> Iterator[tuple[str, FakeBackend]]:
    """A server over a FakeBackend that answers with a sandbox failure."""
    backend = FakeBackend(sandbox_failure)
    with serve(create_app(backend)) as url:
        yield url, backend


@dataclasses.dataclass
class ServeProcess:
    """A ``retool-exec serve`` process (see ``serve_process``)."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    """Its stdout and stderr together (a file: a flood of lines cannot block it)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


_SERVE = """
import resource, sys
from retool_exec.cli import main
args = sys.argv[1:]
if args[0] != "serve":  # the RLIMIT_NOFILE to start with: soft, hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(args[0]), int(args[1])))
    args = args[2:]
sys.exit(main(args))
"""
"""``retool-exec ARGS``, under an ``RLIMIT_NOFILE`` set first if given (no ``preexec_fn``,
which is unsafe in a process with threads)."""


@contextlib.contextmanager
def serve_process(
    log_dir: Path, *args: str, nofile: tuple[int, int] | None = None, wait: bool = True
) -> Iterator[ServeProcess]:
    """``retool-exec serve ARGS --port P`` as a process, under ``RLIMIT_NOFILE`` ``nofile``
    (soft, hard) when given; yields once ``/v1/ping`` answers (``wait``). The process is
    killed at the end if it still runs."""
    port = free_port()
    log = log_dir / f"serve-{port}.log"
    limits = [str(value) for value in nofile or ()]
    command = [sys.executable, "-c", _SERVE, *limits, "serve", *args, "--port", str(port)]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    server = ServeProcess(process, port, log)
    try:
        deadline = time.monotonic() + 60
        while wait:
            try:
                if httpx.get(f"{server.url}/v1/ping", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, server.output()
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(30)


def open_files(pid: int) -> tuple[int, int]:
    """``(soft, hard)`` RLIMIT_NOFILE of a running process."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open-files limit for process {pid}")


def raise_own_descriptor_limit(needed: int) -> None:
    """Let this test process hold ``needed`` sockets, or skip the test."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} file descriptors; the hard limit is {hard}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
