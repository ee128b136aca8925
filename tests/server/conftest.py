"""Real servers for the server tests: uvicorn on 127.0.0.1, a free port, a thread.

Tests talk to them with httpx over TCP, exactly as verl's ``requests`` client
does, so body limits, status codes and headers are those a client sees (not
an in-process test client's). Each server is shut down and its thread joined
when its fixture ends; a server the tests build owns its sandbox and closes
it (containers included) on shutdown.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
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
