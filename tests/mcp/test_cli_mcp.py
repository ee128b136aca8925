"""``retool-exec mcp`` as a client starts it: a subprocess over stdio, and over streamable
HTTP on 127.0.0.1, talked to with the SDK's own clients, then stopped, leaving nothing
behind (no interpreter, no container). Hosts other than 127.0.0.1 are refused."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult

from retool_exec.cli import main
from tests.conftest import SESSION_ID, TEST_LABEL, require_docker
from tests.mcp.conftest import fields, text

COMMAND = [sys.executable, "-m", "retool_exec.cli", "mcp"]
URL_LINE = re.compile(r"streamable HTTP at (http://127\.0\.0\.1:\d+/mcp)$")


@contextmanager
def http_server(*args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``retool-exec mcp --http 0 ARGS`` in a subprocess: its URL; stopped with SIGTERM after."""
    proc = subprocess.Popen(
        [*COMMAND, "--http", "0", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        said = [proc.stderr.readline().strip() for _ in range(2 if "local" in args else 1)]
        match = URL_LINE.search(said[-1])
        assert match, f"no URL on stderr: {said!r}"
        if "local" in args:
            assert "the local backend does NOT isolate the code it runs" in said[0]
        yield match.group(1), proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def stop(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """SIGTERM, as a supervisor stops it: exit status, stdout, stderr."""
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def gone(pid: int) -> bool:
    """The process no longer exists (or is a zombie, waiting only for its reaper)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return status.rsplit(")", 1)[1].split()[0] == "Z"


async def talk_over(url: str) -> list[CallToolResult]:
    async with Client(url) as client:
        ran = await client.call_tool("run_python", {"code": "print(6 * 7)"})
        opened = await client.call_tool("session_open", {})
        session_id = fields(opened)["session_id"]
        await client.call_tool("session_run", {"session_id": session_id, "code": "import os"})
        pid = await client.call_tool(
            "session_run", {"session_id": session_id, "code": "os.getpid()"}
        )
        return [ran, opened, pid]


def post_initialize(url: str, headers: dict[str, str]) -> int:
    """The status of an initialize request sent with ``headers`` (a browser's, say)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
    try:
        connection.request(
            "POST",
            parts.path,
            body=json.dumps(body),
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
                **headers,
            },
        )
        return connection.getresponse().status
    finally:
        connection.close()


def test_http_serves_the_sdk_client_then_stops_leaving_nothing() -> None:
    with http_server("--backend", "local") as (url, proc):
        # DNS rebinding: a page elsewhere that resolves its name to 127.0.0.1 is refused.
        assert post_initialize(url, {"Host": "evil.example"}) == 421
        assert post_initialize(url, {"Origin": "http://evil.example"}) == 403
        ran, _, pid = asyncio.run(talk_over(url))
        assert text(ran) == "42\n"
        assert fields(ran)["outcome"] == "success"
        interpreter = int(fields(pid)["value"])
        assert not gone(interpreter)  # the session's interpreter lives while the server does
        status, out, err = stop(proc)
    assert status == 0, err
    assert out == ""
    assert "Traceback" not in err
    deadline = time.monotonic() + 10
    while not gone(interpreter) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(interpreter), "the session's interpreter outlived the server"


@pytest.mark.docker
def test_http_on_docker_removes_its_containers_when_stopped() -> None:
    require_docker()
    import docker

    mark = uuid.uuid4().hex
    labels = {TEST_LABEL: SESSION_ID, "test.mcp": mark}
    args = ["--backend", "docker", "--set", "pool_size=1", "--set", f"labels={json.dumps(labels)}"]
    client = docker.from_env()
    try:

        def containers() -> list[str]:
            found = client.api.containers(all=True, filters={"label": f"test.mcp={mark}"})
            return [c["Id"] for c in found]

        with http_server(*args) as (url, proc):
            assert containers() == []  # the sandbox starts on the first call
            ran, _, _ = asyncio.run(talk_over(url))
            assert text(ran) == "42\n"
            assert containers()  # the pool's container and the session's
            status, _, err = stop(proc)
        assert status == 0, err
        assert containers() == [], "containers outlived the server"
    finally:
        client.close()


def test_stdio_serves_the_sdk_client() -> None:
    """A desktop client's way: it starts the command and talks on stdin/stdout."""
    params = StdioServerParameters(
        command=sys.executable, args=[*COMMAND[1:], "--backend", "local"]
    )

    async def talk() -> list[CallToolResult]:
        async with Client(params) as client:
            return [
                await client.call_tool(
                    "run_python", {"code": "import os\nos.write(1, b'not json\\n')\nprint('ok')"}
                ),
                await client.call_tool("run_python", {"code": "print('still talking')"}),
            ]

    noisy, after = asyncio.run(talk())
    assert text(noisy) == "not json\nok\n"
    assert text(after) == "still talking\n"


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_stdio_stops_on_a_signal(signum: int, status: int) -> None:
    proc = subprocess.Popen(
        [*COMMAND, "--backend", "local"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        hello = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "1"},
            },
        }
        proc.stdin.write(json.dumps(hello).encode() + b"\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        assert answer["result"]["serverInfo"]["name"] == "retool-exec"
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == status  # stdin is still open: it does not wait for it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "localhost", "::1"])
def test_http_refuses_any_host_but_127_0_0_1(host: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp", "--backend", "local", "--http", "0", "--host", host]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "127.0.0.1 only" in err


def test_a_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["mcp", "--backend", "docker", "--http", str(port)]) == 69
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"cannot listen on 127.0.0.1:{port}" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--http", "65536"], "--http must be a port"),
        (["--max-timeout", "0"], "--max-timeout must be positive"),
        (["--timeout", "100", "--max-timeout", "50"], "more than --max-timeout"),
        (["--set", "pool_size=0"], "pool_size"),
        (["--max-sessions", "-1"], "--max-sessions"),
    ],
)
def test_bad_settings_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mcp", "--backend", "docker", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert message in err


def test_help_shows_the_stdio_config_and_the_http_address() -> None:
    done = subprocess.run([*COMMAND, "--help"], capture_output=True, text=True, check=True)
    assert '"command": "retool-exec", "args": ["mcp"]' in done.stdout
    assert "http://127.0.0.1:PORT/mcp" in done.stdout
