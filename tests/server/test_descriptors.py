"""``retool-exec serve`` within its file-descriptor limit.

With the common soft limit of 1024 and the default ``max_connections`` of 1024, idle
connections alone ran the process out of descriptors: asyncio logged "socket.accept()
out of system resource" with a traceback ~150,000 times in 10 s (60 MB), container
starts failed with EMFILE, and requests waited seconds for their connection to be
accepted (red-team round B). These start the server as a process with a given
``RLIMIT_NOFILE`` and hold real connections to it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import (
    ServeProcess,
    open_files,
    raise_own_descriptor_limit,
    serve_process,
    verl_body,
)

pytestmark = pytest.mark.server

TIGHT = (1024, 1024)
"""The soft limit most shells start with, as the hard limit too: nothing to raise to."""

OUT_OF_DESCRIPTORS = "Too many open files"
"""EMFILE, as asyncio's report of a failed accept and this server's line about it both say."""


def _hold(port: int, count: int) -> list[socket.socket]:
    """``count`` connections that send nothing (fewer if the server closes some first)."""
    held = []
    for _ in range(count):
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            break
    return held


def _close(held: list[socket.socket]) -> None:
    for sock in held:
        sock.close()


def _answered_in_time(server: ServeProcess, seconds: float) -> httpx.Response | None:
    """A request's answer if it came within ``seconds``, else None."""
    try:
        return httpx.post(f"{server.url}/run_code", json=verl_body("print(6 * 7)"), timeout=seconds)
    except httpx.TimeoutException:
        return None


def test_serve_raises_its_soft_descriptor_limit_to_the_hard_one(tmp_path: Path) -> None:
    raise_own_descriptor_limit(4096)
    with serve_process(tmp_path, "--backend", "fake", nofile=(1024, 4096)) as server:
        assert open_files(server.process.pid) == (4096, 4096)


def test_an_explicit_max_connections_that_does_not_fit_is_one_line(tmp_path: Path) -> None:
    with serve_process(
        tmp_path, "--backend", "fake", "--max-connections", "1000", nofile=TIGHT, wait=False
    ) as server:
        assert server.process.wait(60) == 2
    lines = server.output().splitlines()
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("retool-exec serve: --max-connections 1000 ")
    assert "1024" in line  # the limit
    assert "ulimit" in line  # how to raise it
    assert "--max-connections" in line


def test_the_default_max_connections_is_lowered_to_fit_with_one_warning(
    tmp_path: Path,
) -> None:
    """The red team's flood: more idle connections than descriptors. The server keeps to
    its bound, answers at once (504 past it, its answer once they are gone), and its log
    stays a few lines."""
    raise_own_descriptor_limit(4096)
    with serve_process(
        tmp_path,
        "--backend",
        "local",
        "--max-concurrency",
        "1",
        "--log-level",
        "warning",
        nofile=TIGHT,
    ) as server:
        warnings = [line for line in server.output().splitlines() if "max_connections" in line]
        assert len(warnings) == 1, server.output()
        assert "1024" in warnings[0]
        held = _hold(server.port, 1100)
        try:
            time.sleep(1.0)
            started = time.monotonic()
            answer = _answered_in_time(server, 10)
            assert answer is not None
            assert time.monotonic() - started < 2.0
            if answer.status_code == 504:  # past the bound: retry, in the usual shape
                assert "connections" in answer.json()["detail"]
            else:
                assert answer.status_code == 200
        finally:
            _close(held)
        time.sleep(0.5)
        answer = _answered_in_time(server, 10)
        assert answer is not None
        assert answer.status_code == 200
        assert answer.json()["run_result"]["stdout"] == "42\n"
        output = server.output()
    assert OUT_OF_DESCRIPTORS not in output
    assert "Traceback" not in output
    assert len(output.splitlines()) < 10, output[:3000]


def test_connections_that_piled_up_do_not_run_the_server_out(tmp_path: Path) -> None:
    """Connections that pile up while the server cannot accept (here: it is stopped) were
    all accepted in one pass when it went on, past the descriptors it had: asyncio then
    reported EMFILE with a traceback for every remaining accept of the pass (2048), and
    again at every retry. Now a pass accepts a few, those past the bound are refused
    and closed as they come, and the server goes on serving."""
    raise_own_descriptor_limit(4096)
    with serve_process(
        tmp_path,
        "--backend",
        "local",
        "--max-concurrency",
        "1",
        "--log-level",
        "warning",
        nofile=TIGHT,
    ) as server:
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            held = _hold(server.port, 1300)  # the kernel completes them into the backlog
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        try:
            time.sleep(3.0)
            answer = _answered_in_time(server, 10)  # at once: 504 past the bound
            assert answer is not None
        finally:
            _close(held)
        time.sleep(0.5)
        answer = _answered_in_time(server, 10)
        assert answer is not None
        assert answer.status_code == 200
        output = server.output()
    assert OUT_OF_DESCRIPTORS not in output
    assert "Traceback" not in output
    assert len(output.splitlines()) < 10, output[:3000]


_EXHAUSTED_SERVER = """
import asyncio, resource, socket, sys
from retool_exec.server.descriptors import ListeningSocket, quiet_accept_errors

resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

async def main():
    listener = ListeningSocket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    with quiet_accept_errors(interval=1.0):
        loop = asyncio.get_running_loop()
        server = await loop.create_server(asyncio.Protocol, sock=listener, backlog=1024)
        print(listener.getsockname()[1], flush=True)
        await asyncio.sleep(float(sys.argv[1]))
        server.close()

asyncio.run(main())
"""
"""An asyncio server over ``ListeningSocket`` that keeps every connection open, in a
process that may open 64 descriptors: one it cannot serve without running out."""


def test_running_out_of_descriptors_is_one_line_a_second_not_one_per_accept(
    tmp_path: Path,
) -> None:
    """Where descriptors do run out (a backend that holds more than its reserve), each
    pause of asyncio's accepting is reported once, and the log has one line per
    interval: asyncio alone reported every remaining accept of a pass (2048 tracebacks)
    and scheduled as many retries, each of which did it again."""
    raise_own_descriptor_limit(4096)
    seconds = 4.5
    log = tmp_path / "exhausted.log"
    with (
        log.open("wb") as sink,
        subprocess.Popen(
            [sys.executable, "-c", _EXHAUSTED_SERVER, str(seconds)],
            stdout=subprocess.PIPE,
            stderr=sink,
        ) as process,
    ):
        try:
            assert process.stdout is not None
            port = int(process.stdout.readline())
            held = _hold(port, 1000)  # 60 are served; the rest wait in the backlog
            try:
                assert process.wait(30) == 0
            finally:
                _close(held)
        finally:
            if process.poll() is None:
                process.kill()
    lines = log.read_text().splitlines()
    assert 3 <= len(lines) <= 6, lines  # a line a second
    assert all(line.startswith("cannot accept connections") for line in lines), lines
    assert "Traceback" not in log.read_text()
    for line in lines[1:]:  # a pass a second: one report each, none held back per accept
        assert "more like it" not in line or "(and 1 more" in line, line
