"""A supervisor's stop (SIGTERM) with requests in hand: each gets an explicit JSON answer.

uvicorn waits ``timeout_graceful_shutdown`` (``retool-exec serve --shutdown-grace``) for the
requests in hand, then cancels what still runs; a cancelled request used to get
uvicorn's own ``500 text/plain "Internal Server Error"``, and so did one still queued
for a run slot, after the same 10 s (red-team round B). These run ``retool-exec serve``
as a process over the local backend and signal it, as systemd or Kubernetes does.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import ServeProcess, serve_process, verl_body

pytestmark = pytest.mark.server

GRACE = 5.0
"""Seconds these servers give running calls once told to stop (``--shutdown-grace``; the
default, 10, would answer the long call outside the bound its test sets)."""


class Call:
    """A ``/run_code`` request in a thread: its answer and when it came."""

    def __init__(self, url: str, code: str, **overrides: Any) -> None:
        self.answer: httpx.Response | BaseException | None = None
        self.at = 0.0
        self._thread = threading.Thread(target=self._post, args=(url, verl_body(code, **overrides)))
        self._thread.start()

    def _post(self, url: str, body: dict[str, Any]) -> None:
        try:
            self.answer = httpx.post(f"{url}/run_code", json=body, timeout=120)
        except BaseException as exc:  # kept for the assertion
            self.answer = exc
        self.at = time.monotonic()

    def result(self, timeout: float = 60) -> httpx.Response:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "no answer"
        assert isinstance(self.answer, httpx.Response), self.answer
        return self.answer


def gauge(server: ServeProcess, name: str) -> float:
    value: float = httpx.get(f"{server.url}/v1/metrics", timeout=5).json()[name]
    return value


def wait_for(condition: Any, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def shutting_down(answer: httpx.Response) -> str:
    """The ``detail`` of a JSON 504 (the status verl retries), never uvicorn's plain 500."""
    assert answer.status_code == 504, (answer.status_code, answer.text[:200])
    assert answer.headers["content-type"] == "application/json", answer.headers
    detail: str = answer.json()["detail"]
    return detail


def test_sigterm_answers_queued_and_running_calls_in_json(tmp_path: Path) -> None:
    """The queued call is answered at once, the call that ends within the grace period
    gets its own answer, and the one that outlives it an explicit 504 in JSON."""
    with serve_process(
        tmp_path,
        "--backend",
        "local",
        "--max-concurrency",
        "2",
        "--max-queue",
        "4",
        "--shutdown-grace",
        str(GRACE),
    ) as server:
        short = Call(server.url, "import time; time.sleep(2); print('done')")
        long = Call(server.url, "import time; time.sleep(100)", run_timeout=100)
        wait_for(lambda: gauge(server, "server/running") == 2)
        queued = Call(server.url, "print('queued')")
        wait_for(lambda: gauge(server, "server/waiting") == 1)
        stopped = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        answers = {
            name: call.result()
            for name, call in (("queued", queued), ("short", short), ("long", long))
        }
        seen = {
            name: (
                answer.status_code,
                answer.headers.get("content-type"),
                answer.text[:80],
                round(call.at - stopped, 1),
            )
            for (name, answer), call in zip(answers.items(), (queued, short, long), strict=True)
        }

        assert all(status != 500 for status, *_ in seen.values()), seen
        detail = shutting_down(answers["queued"])
        assert "shutting down" in detail, seen
        assert "did not run" in detail, seen
        assert queued.at - stopped < 2.0, seen  # at once, not after the grace period

        assert answers["short"].status_code == 200, seen
        assert answers["short"].json()["run_result"]["stdout"] == "done\n"

        assert "shut down" in shutting_down(answers["long"]), seen
        assert GRACE - 1 < long.at - stopped < GRACE + 4, seen  # the flag's grace, not 10 s

        assert server.process.wait(60) == 0
    output = server.output()
    assert "Internal Server Error" not in output
    assert "Exception in ASGI application" not in output
    assert "Traceback" not in output


def test_a_request_that_reaches_the_app_during_shutdown_is_refused_in_json(
    tmp_path: Path,
) -> None:
    """A request whose body was still coming when the stop began reaches the app after
    it: it is refused at once, explicitly, even with every run slot free. New
    connections are refused by the closed listening socket."""
    with serve_process(tmp_path, "--backend", "local", "--max-concurrency", "2") as server:
        body = json.dumps(verl_body("print('late')")).encode()
        head = (
            b"POST /run_code HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(head + body[:10])
            time.sleep(0.3)
            server.process.send_signal(signal.SIGTERM)
            time.sleep(0.5)  # uvicorn sees the signal within 0.1 s and stops listening
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
            sent = time.monotonic()
            sock.sendall(body[10:])
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert time.monotonic() - sent < 3.0
        head_part, _, payload = answer.partition(b"\r\n\r\n")
        assert head_part.startswith(b"HTTP/1.1 504"), answer[:300]
        assert b"content-type: application/json" in head_part.lower()
        assert "shutting down" in json.loads(payload)["detail"]
        assert server.process.wait(30) == 0
    assert "Traceback" not in server.output()


def test_a_session_cell_running_at_the_stop_gets_a_json_answer_verl_retries(
    tmp_path: Path,
) -> None:
    """The session endpoints answered 503 (which verl does not retry) in their own race
    with the closing sandbox, where everything else answers 504 (the thirty-sixth round)."""
    with serve_process(tmp_path, "--backend", "local") as server:
        opened = httpx.post(f"{server.url}/sessions", timeout=30)
        assert opened.status_code == 201, opened.text
        cell_url = f"{server.url}/sessions/{opened.json()['session_id']}/run"
        answers: list[httpx.Response] = []
        body = {"code": "import time; time.sleep(100)", "timeout": 100}
        running = threading.Thread(
            target=lambda: answers.append(httpx.post(cell_url, json=body, timeout=120))
        )
        running.start()
        wait_for(lambda: gauge(server, "server/running") == 1)
        server.process.send_signal(signal.SIGTERM)
        running.join(60)
        [answer] = answers
        assert answer.status_code not in (500, 503), (answer.status_code, answer.text[:200])
        assert answer.headers["content-type"] == "application/json", answer.headers
        if answer.status_code != 200:  # (200: the cell came back, its session lost)
            assert "shut" in shutting_down(answer)
