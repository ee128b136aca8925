"""``/sessions`` over HTTP: ids, clients, caps, lost and expired sessions, admission.

Served over a FakeBackend whose session cells answer from their own history
(the code of the cells before them in their line), so every rule of the
endpoints is checked exactly and fast; ``test_docker_sessions.py`` runs the
same endpoints on real containers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from retool_exec import ExecResult, FakeBackend, RunRequest, Sandbox
from retool_exec._models import CellResult
from retool_exec.backends.base import Backend
from retool_exec.backends.fake import FakeCell, FakeSession
from retool_exec.server import OUTCOME_HEADER, ServerSettings, create_app
from retool_exec.server.access_log import SessionIdRedaction
from retool_exec.server.sessions import ID_BYTES, client_key
from tests.server.conftest import PREFIX, TOKEN, serve, verl_body

pytestmark = pytest.mark.server

ID_PATTERN = re.compile(r"\A[A-Za-z0-9_-]{32}\Z")


async def cell_answer(cell: FakeCell) -> ExecResult | str:
    """A fake interpreter whose state is its history: ``show`` prints it, and a few
    commands stand for what a real interpreter does."""
    code = cell.code
    if code.startswith("sleep "):
        await asyncio.sleep(float(code.split()[1]))
        return "slept\n"
    if code == "show":
        return ",".join(cell.history) + "\n"
    if code == "value":
        return ExecResult(
            True, "", "", 0, False, 0.01, cells=[CellResult(display=[{"text/plain": "42"}])]
        )
    if code == "raise":
        error = {"ename": "ValueError", "evalue": "boom", "traceback": ["Traceback\n", "boom\n"]}
        return ExecResult(
            False,
            "",
            "Traceback\nValueError: boom\n",
            1,
            False,
            0.01,
            cells=[CellResult(stderr="Traceback\nValueError: boom\n", error=[error])],
        )
    if code == "exit":
        return ExecResult(
            False,
            "bye\n",
            "",
            3,
            False,
            0.01,
            detail="session lost: the session's interpreter exited (status 3)",
        )
    if code == "timeout":
        return ExecResult(False, "", "KeyboardInterrupt\n", None, True, cell.timeout)
    if code == "timeout-seen":
        return f"{cell.timeout:g}\n"
    return ""


def fake_sandbox(**sandbox_options: Any) -> tuple[Sandbox, FakeBackend]:
    backend = FakeBackend(lambda _request: "one-shot\n", session_handler=cell_answer)
    return Sandbox(backend, **sandbox_options), backend


@contextlib.contextmanager
def fake_server(
    settings: ServerSettings | None = None, **sandbox_options: Any
) -> Iterator[tuple[str, Sandbox]]:
    """A server over a caller-owned fake sandbox; yields its URL and the sandbox."""
    sandbox, _backend = fake_sandbox(**sandbox_options)
    try:
        with serve(create_app(sandbox, settings=settings or ServerSettings())) as url:
            yield url, sandbox
    finally:
        sandbox.close()


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """One fake server for the tests that do not change its settings (prefix on)."""
    settings = ServerSettings(prefix=PREFIX, max_sessions_per_client=64, max_run_timeout=20.0)
    with fake_server(settings, max_sessions=256) as (base, _sandbox):
        yield base


@pytest.fixture()
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30.0) as client:
        yield client


def other_client() -> httpx.Client:
    """A client from another address (127.0.0.2): another peer, so another session holder."""
    return httpx.Client(timeout=30.0, transport=httpx.HTTPTransport(local_address="127.0.0.2"))


def open_session(url: str, http: httpx.Client, **body: Any) -> str:
    response = http.post(f"{url}/sessions", json=body) if body else http.post(f"{url}/sessions")
    assert response.status_code == 201, response.text
    session_id: str = response.json()["session_id"]
    return session_id


def run(url: str, http: httpx.Client, session_id: str, code: str, **body: Any) -> dict[str, Any]:
    response = http.post(f"{url}/sessions/{session_id}/run", json={"code": code, **body})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def fork(url: str, http: httpx.Client, session_id: str) -> str:
    response = http.post(f"{url}/sessions/{session_id}/fork")
    assert response.status_code == 201, response.text
    child: str = response.json()["session_id"]
    return child


# -- the happy path --------------------------------------------------------------------


def test_a_conversation_keeps_its_state_from_cell_to_cell(url: str, http: httpx.Client) -> None:
    created = http.post(f"{url}/sessions")
    assert created.status_code == 201
    assert created.json() == {"session_id": created.json()["session_id"], "ttl": 600.0}
    session_id = created.json()["session_id"]
    assert ID_PATTERN.match(session_id)
    run(url, http, session_id, "x = 1")
    run(url, http, session_id, "y = 2")
    answer = run(url, http, session_id, "show")
    assert answer == {
        "status": "Success",
        "message": "",
        "run_result": {
            "status": "Finished",
            "execution_time": answer["run_result"]["execution_time"],
            "return_code": 0,
            "stdout": "x = 1,y = 2\n",
            "stderr": "",
        },
        "display": [],
        "error": [],
        "session_lost": False,
    }
    assert http.delete(f"{url}/sessions/{session_id}").status_code == 204


def test_display_error_and_the_outcome_header(url: str, http: httpx.Client) -> None:
    session_id = open_session(url, http)
    value = http.post(f"{url}/sessions/{session_id}/run", json={"code": "value"})
    assert value.headers[OUTCOME_HEADER] == "success"
    assert value.json()["display"] == [{"text/plain": "42"}]
    raised = http.post(f"{url}/sessions/{session_id}/run", json={"code": "raise"})
    assert raised.headers[OUTCOME_HEADER] == "error"
    body = raised.json()
    assert (body["status"], body["run_result"]["return_code"]) == ("Failed", 1)
    assert body["error"] == [
        {"ename": "ValueError", "evalue": "boom", "traceback": ["Traceback\n", "boom\n"]}
    ]
    assert body["session_lost"] is False
    assert run(url, http, session_id, "show")["run_result"]["stdout"] == "value,raise\n"


def test_a_cell_past_its_timeout_keeps_the_session(url: str, http: httpx.Client) -> None:
    session_id = open_session(url, http)
    body = run(url, http, session_id, "timeout", timeout=2)
    assert body["run_result"]["status"] == "TimeLimitExceeded"
    assert body["status"] == "Failed"
    assert body["message"] == (
        "the cell ran longer than its 2 s limit and was interrupted; the session keeps its state"
    )
    assert body["session_lost"] is False
    assert run(url, http, session_id, "show")["run_result"]["stdout"] == "timeout\n"


def test_timeouts_default_and_are_clamped(url: str, http: httpx.Client) -> None:
    session_id = open_session(url, http)
    seen = [
        run(url, http, session_id, "timeout-seen", **body)["run_result"]["stdout"]
        for body in ({}, {"timeout": 3}, {"timeout": 999})
    ]
    assert seen == ["10\n", "3\n", "20\n"]  # default_run_timeout, as asked, max_run_timeout


def test_fork_copies_the_state_and_the_branches_never_meet(url: str, http: httpx.Client) -> None:
    root = open_session(url, http)
    run(url, http, root, "prefix")
    left, right = fork(url, http, root), fork(url, http, root)
    assert len({root, left, right}) == 3
    run(url, http, left, "left")
    run(url, http, right, "right")
    run(url, http, root, "root")
    shown = {
        name: run(url, http, session_id, "show")["run_result"]["stdout"]
        for name, session_id in (("root", root), ("left", left), ("right", right))
    }
    assert shown == {"root": "prefix,root\n", "left": "prefix,left\n", "right": "prefix,right\n"}
    assert http.delete(f"{url}/sessions/{root}").status_code == 204
    assert run(url, http, left, "show")["run_result"]["stdout"] == "prefix,left,show\n"


def test_routes_are_served_under_the_prefix_too(url: str, http: httpx.Client) -> None:
    session_id = open_session(f"{url}{PREFIX}", http)
    assert run(url, http, session_id, "a")["status"] == "Success"
    assert run(f"{url}{PREFIX}", http, session_id, "show")["run_result"]["stdout"] == "a\n"
    assert http.delete(f"{url}{PREFIX}/sessions/{session_id}").status_code == 204


def test_ids_are_unguessable_tokens(url: str, http: httpx.Client) -> None:
    ids = [open_session(url, http) for _ in range(20)]
    assert ID_BYTES * 8 >= 192
    assert len(set(ids)) == 20
    assert all(ID_PATTERN.match(session_id) for session_id in ids)
    for session_id in ids:
        http.delete(f"{url}/sessions/{session_id}")


# -- unknown, foreign, lost and expired ids ------------------------------------------------


@pytest.mark.parametrize("session_id", ["nope", "A" * 32, "..%2F..", "x" * 300])
def test_an_unknown_id_is_404_everywhere(url: str, http: httpx.Client, session_id: str) -> None:
    ran = http.post(f"{url}/sessions/{session_id}/run", json={"code": "show"})
    forked = http.post(f"{url}/sessions/{session_id}/fork")
    deleted = http.delete(f"{url}/sessions/{session_id}")
    assert [ran.status_code, forked.status_code, deleted.status_code] == [404, 404, 404]
    if "%2F" not in session_id:  # else no route matches at all: FastAPI's own 404
        assert "no such session" in ran.json()["detail"]


def test_another_clients_id_is_404_and_untouched(url: str, http: httpx.Client) -> None:
    session_id = open_session(url, http)
    run(url, http, session_id, "mine")
    with other_client() as stranger:
        for response in (
            stranger.post(f"{url}/sessions/{session_id}/run", json={"code": "theirs"}),
            stranger.post(f"{url}/sessions/{session_id}/fork"),
            stranger.delete(f"{url}/sessions/{session_id}"),
        ):
            assert response.status_code == 404, response.text
    assert run(url, http, session_id, "show")["run_result"]["stdout"] == "mine\n"


FORGED_ADDRESSES = [
    {"X-Forwarded-For": "127.0.0.2"},
    {"X-Forwarded-For": "127.0.0.2, 127.0.0.1"},
    {"Forwarded": "for=127.0.0.2"},
    {"X-Real-IP": "127.0.0.2"},
]


@pytest.mark.parametrize("headers", FORGED_ADDRESSES, ids=lambda headers: next(iter(headers)))
def test_a_forwarding_header_does_not_make_a_request_another_clients(
    url: str, http: httpx.Client, headers: dict[str, str]
) -> None:
    """uvicorn believes ``X-Forwarded-For`` from 127.0.0.1 by default: any local
    process (any client of a tunnel) was whichever client it named (thirtieth round)."""
    with other_client() as owner:
        session_id = open_session(url, owner)
        run(url, owner, session_id, "theirs")
        for response in (
            http.post(f"{url}/sessions/{session_id}/run", json={"code": "mine"}, headers=headers),
            http.post(f"{url}/sessions/{session_id}/fork", headers=headers),
            http.delete(f"{url}/sessions/{session_id}", headers=headers),
        ):
            assert response.status_code == 404, response.text
        assert run(url, owner, session_id, "show")["run_result"]["stdout"] == "theirs\n"


def test_a_forwarding_header_does_not_pass_the_cap() -> None:
    settings = ServerSettings(max_sessions_per_client=1)
    with fake_server(settings) as (base, _), httpx.Client(timeout=30) as http:
        open_session(base, http)
        for headers in FORGED_ADDRESSES:
            refused = http.post(f"{base}/sessions", headers=headers)
            assert refused.status_code == 429, (headers, refused.text)


def test_session_ids_stay_out_of_the_access_log(url: str, http: httpx.Client) -> None:
    """An id is a session's credential, and the access log writes every path."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    access = logging.getLogger("uvicorn.access")
    level = access.level
    access.setLevel(logging.INFO)
    access.addHandler(handler)
    try:
        session_id = open_session(url, http)
        run(url, http, session_id, "logged")
        assert http.post(f"{url}/sessions/{session_id}/fork").status_code == 201
        for encoded in (f"/%73essions/{session_id}/run", f"/sessions%2F{session_id}/run"):
            http.post(f"{url}{encoded}", json={"code": "again"})  # (routed or not: logged)
        assert http.delete(f"{url}/sessions/{session_id}").status_code == 204
    finally:
        access.removeHandler(handler)
        access.setLevel(level)
    assert len(lines) == 6, lines
    assert all(session_id not in line and "/sessions" in line for line in lines), lines
    assert "/sessions/<id>/run" in lines[1], lines


def test_the_redaction_reads_paths_as_the_router_does_and_scopes_too() -> None:
    """uvicorn's trace level logs each request's scope, a dict with the path twice."""
    session_id = "nYdpoX07rFwjDwlqopwAP3u-XC8i2JqF"
    scope = {"path": f"/sessions/{session_id}/run", "raw_path": f"/sessions/{session_id}".encode()}
    record = logging.LogRecord("uvicorn.asgi", 5, __file__, 1, "%s scope=%s", ("ASGI", scope), None)
    assert SessionIdRedaction().filter(record)
    assert session_id not in record.getMessage()
    assert "/sessions/<id>/run" in record.getMessage()
    quoted = logging.LogRecord(
        "uvicorn.access", 20, __file__, 1, '%s - "%s %s" %d', ("a", "POST", "", 200), None
    )
    for path in (
        f"/%73essions/{session_id}",
        f"/sessions%2F{session_id}",
        f"/x/sessions/{session_id}?a=1",
    ):
        quoted.args = ("a", "POST", path, 200)
        assert SessionIdRedaction().filter(quoted)
        assert session_id not in quoted.getMessage() and "<id>" in quoted.getMessage(), path


def test_a_lost_session_answers_410_until_deleted(url: str, http: httpx.Client) -> None:
    session_id = open_session(url, http)
    last = run(url, http, session_id, "exit")
    assert last["session_lost"] is True
    assert last["run_result"]["stdout"] == "bye\n"
    assert last["run_result"]["return_code"] == 3
    assert last["status"] == "Failed"
    assert last["message"] == "session lost: the session's interpreter exited (status 3)"
    again = http.post(f"{url}/sessions/{session_id}/run", json={"code": "show"})
    assert again.status_code == 410
    assert again.json()["detail"] == (
        "this session is gone: the session's interpreter exited (status 3); its state is "
        "lost (open a new session)"
    )
    assert http.post(f"{url}/sessions/{session_id}/fork").status_code == 410
    assert http.delete(f"{url}/sessions/{session_id}").status_code == 204
    assert http.delete(f"{url}/sessions/{session_id}").status_code == 404


def test_an_idle_session_expires_with_a_404() -> None:
    with fake_server(session_ttl=1.0) as (base, sandbox), httpx.Client(timeout=30) as http:
        idle, busy = open_session(base, http), open_session(base, http)
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            run(base, http, busy, "a")  # use keeps a session alive
            time.sleep(0.2)
        expired = http.post(f"{base}/sessions/{idle}/run", json={"code": "show"})
        assert expired.status_code == 404
        assert expired.json()["detail"] == (
            "this session was closed: it was idle for more than 1 s (session_ttl)"
        )
        assert run(base, http, busy, "b")["status"] == "Success"
        metrics = http.get(f"{base}/v1/metrics").json()
        assert metrics["server/sessions_expired"] == 1.0
        assert metrics["server/sessions"] == 1.0
        assert sandbox.open_sessions == 1


# -- caps ------------------------------------------------------------------------------------


def test_each_client_holds_at_most_its_cap() -> None:
    settings = ServerSettings(max_sessions_per_client=2)
    with fake_server(settings) as (base, _), httpx.Client(timeout=30) as http:
        first = open_session(base, http)
        fork(base, http, first)  # a fork counts
        refused = http.post(f"{base}/sessions")
        assert refused.status_code == 429
        assert refused.json()["detail"] == (
            "this client already holds 2 open sessions, the most it may "
            "(max_sessions_per_client=2); delete one first"
        )
        assert http.post(f"{base}/sessions/{first}/fork").status_code == 429
        with other_client() as neighbour:  # another client has a cap of its own
            assert neighbour.post(f"{base}/sessions").status_code == 201
        assert http.delete(f"{base}/sessions/{first}").status_code == 204
        assert http.post(f"{base}/sessions").status_code == 201


def test_a_lost_session_no_longer_counts_against_the_cap() -> None:
    settings = ServerSettings(max_sessions_per_client=1)
    with fake_server(settings) as (base, sandbox), httpx.Client(timeout=30) as http:
        session_id = open_session(base, http)
        assert run(base, http, session_id, "exit")["session_lost"] is True
        assert sandbox.open_sessions == 0  # the server closed it at once
        assert http.post(f"{base}/sessions").status_code == 201


def test_the_sandboxs_cap_is_503_with_retry_after() -> None:
    settings = ServerSettings(max_sessions_per_client=10)
    with fake_server(settings, max_sessions=2) as (base, _), httpx.Client(timeout=30) as http:
        first = open_session(base, http)
        open_session(base, http)
        for refused in (http.post(f"{base}/sessions"), http.post(f"{base}/sessions/{first}/fork")):
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert "all the sessions it may (2, all clients together)" in refused.json()["detail"]


def test_the_token_is_the_client() -> None:
    settings = ServerSettings(token=SecretStr(TOKEN), max_sessions_per_client=1)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with fake_server(settings) as (base, _), httpx.Client(timeout=30, headers=auth) as http:
        assert httpx.post(f"{base}/sessions").status_code == 401
        session_id = open_session(base, http)
        with other_client() as elsewhere:
            elsewhere.headers.update(auth)  # same token, other address: the same client
            assert elsewhere.post(f"{base}/sessions").status_code == 429
            ran = elsewhere.post(f"{base}/sessions/{session_id}/run", json={"code": "show"})
            assert ran.status_code == 200
    assert client_key(token=TOKEN, peer="10.0.0.1") == client_key(token=TOKEN, peer="10.0.0.2")
    assert client_key(token=None, peer="10.0.0.1") != client_key(token=None, peer="10.0.0.2")
    assert TOKEN not in client_key(token=TOKEN, peer=None)


def test_sessions_can_be_turned_off() -> None:
    settings = ServerSettings(max_sessions_per_client=0)
    with fake_server(settings) as (base, _), httpx.Client(timeout=30) as http:
        assert http.post(f"{base}/sessions").status_code == 403
        assert http.post(f"{base}/sessions/x/run", json={"code": "1"}).status_code == 403
        assert http.post(f"{base}/run_code", json=verl_body("1")).status_code == 200


class _NoSessions(Backend):
    name = "nosessions"

    async def run(self, request: RunRequest) -> ExecResult:
        return ExecResult(True, "", "", 0, False, 0.0)


def test_a_backend_without_sessions_is_501() -> None:
    with serve(create_app(_NoSessions())) as base, httpx.Client(timeout=30) as http:
        refused = http.post(f"{base}/sessions")
        assert refused.status_code == 501
        assert refused.json()["detail"] == "the nosessions backend has no sessions"


# -- one cell at a time, and admission ----------------------------------------------------------


def test_a_session_runs_one_cell_at_a_time_409(url: str, http: httpx.Client) -> None:
    session_id = open_session(url, http)
    started = threading.Event()

    def slow() -> int:
        started.set()
        with httpx.Client(timeout=30) as own:
            return own.post(
                f"{url}/sessions/{session_id}/run", json={"code": "sleep 1.5"}
            ).status_code

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(slow)
        started.wait()
        time.sleep(0.5)
        clash = http.post(f"{url}/sessions/{session_id}/run", json={"code": "show"})
        fork_clash = http.post(f"{url}/sessions/{session_id}/fork")
        assert first.result() == 200
    assert clash.status_code == 409
    assert fork_clash.status_code == 409
    assert "one at a time" in clash.json()["detail"]
    assert run(url, http, session_id, "show")["run_result"]["stdout"] == "sleep 1.5\n"


def test_cells_take_run_slots_like_any_request() -> None:
    settings = ServerSettings(max_concurrency=1, max_queue=0, max_sessions_per_client=8)
    with fake_server(settings) as (base, _), httpx.Client(timeout=30) as http:
        busy, other = open_session(base, http), open_session(base, http)
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(http.post, f"{base}/sessions/{busy}/run", json={"code": "sleep 1.5"})
            time.sleep(0.5)
            refused = [
                http.post(f"{base}/sessions/{other}/run", json={"code": "show"}),
                http.post(f"{base}/sessions"),
                http.post(f"{base}/sessions/{other}/fork"),
                http.post(f"{base}/run_code", json=verl_body("1")),
            ]
            assert slow.result().status_code == 200
        assert [response.status_code for response in refused] == [504, 504, 504, 504]
        assert run(base, http, other, "show")["run_result"]["stdout"] == "\n"


# -- bodies --------------------------------------------------------------------------------------


def test_bad_bodies_are_4xx(url: str, http: httpx.Client) -> None:
    session_id = open_session(url, http)
    endpoint = f"{url}/sessions/{session_id}/run"
    assert http.post(endpoint, json={}).status_code == 422
    assert http.post(endpoint, json={"code": "1", "language": "python"}).status_code == 422
    assert http.post(endpoint, json={"code": "1", "timeout": 0}).status_code == 422
    assert http.post(endpoint, content=b"{not json").status_code == 400
    assert http.post(endpoint, json={"code": "x" * (16 * 1024 * 1024 + 1)}).status_code == 413
    assert http.post(f"{url}/sessions", json={"memory_mb": 0}).status_code == 422
    assert http.post(f"{url}/sessions", json={"nope": 1}).status_code == 422
    assert http.post(f"{url}/sessions", json={"memory_mb": 256}).status_code == 201
    assert run(url, http, session_id, "show")["run_result"]["stdout"] == "\n"


def test_run_code_and_run_jupyter_are_unchanged(url: str, http: httpx.Client) -> None:
    body = http.post(f"{url}/run_code", json=verl_body("print(1)")).json()
    assert body["run_result"]["stdout"] == "one-shot\n"


def test_shutdown_closes_the_servers_sessions() -> None:
    sandbox, _ = fake_sandbox()
    try:
        with serve(create_app(sandbox)) as base, httpx.Client(timeout=30) as http:
            open_session(base, http)
            fork(base, http, open_session(base, http))
            assert sandbox.open_sessions == 3
        assert sandbox.open_sessions == 0
        assert not sandbox.closed  # the caller's sandbox stays open
    finally:
        sandbox.close()


def test_metrics_count_sessions(url: str, http: httpx.Client) -> None:
    before = http.get(f"{url}/v1/metrics").json()
    session_id = open_session(url, http)
    fork(url, http, session_id)
    after = http.get(f"{url}/v1/metrics").json()
    assert after["server/sessions_opened"] - before["server/sessions_opened"] == 2
    assert after["server/sessions"] - before["server/sessions"] == 2


def test_ended_sessions_are_remembered_within_a_bound(
    url: str, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("retool_exec.server.sessions.MAX_ENDED", 2)
    ids = [open_session(url, http) for _ in range(3)]
    for session_id in ids:
        assert run(url, http, session_id, "exit")["session_lost"] is True
    statuses = [
        http.post(f"{url}/sessions/{session_id}/run", json={"code": "show"}).status_code
        for session_id in ids
    ]
    assert statuses == [404, 410, 410]  # the oldest ended one is forgotten first


def test_a_session_that_expires_while_its_cell_waits_is_404() -> None:
    settings = ServerSettings(max_concurrency=1, max_queue=4)
    with fake_server(settings, session_ttl=1.0) as (base, _), httpx.Client(timeout=30) as http:
        busy, waiting = open_session(base, http), open_session(base, http)
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(http.post, f"{base}/sessions/{busy}/run", json={"code": "sleep 2.5"})
            time.sleep(0.3)
            late = http.post(f"{base}/sessions/{waiting}/run", json={"code": "show"})
            assert slow.result().status_code == 200
        assert late.status_code == 404
        assert "idle for more than 1 s" in late.json()["detail"]
        assert http.get(f"{base}/v1/metrics").json()["server/sessions_expired"] == 1.0


def _post_and_leave(base: str, path: str) -> None:
    """A client that sends ``POST path`` and closes its connection before the answer."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as raw:
        raw.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n".encode())
        time.sleep(0.05)


def test_a_session_whose_client_left_while_it_opened_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the admission queue, a session was added under an id nobody got: it held its
    container and the client's cap until its idle time ran out (red team, the
    thirty-sixth round). Now it is closed once made, and so is such a fork."""
    opened, forked = FakeBackend.open_session, FakeSession.fork

    async def slow_open(self: FakeBackend, *, memory_mb: int | None = None) -> FakeSession:
        await asyncio.sleep(0.5)
        return await opened(self, memory_mb=memory_mb)

    async def slow_fork(self: FakeSession) -> FakeSession:
        await asyncio.sleep(0.5)
        return await forked(self)

    with fake_server() as (base, sandbox), httpx.Client(timeout=30) as http:
        kept = open_session(base, http)
        monkeypatch.setattr(FakeBackend, "open_session", slow_open)
        monkeypatch.setattr(FakeSession, "fork", slow_fork)
        for _ in range(3):
            _post_and_leave(base, "/sessions")
        _post_and_leave(base, f"/sessions/{kept}/fork")
        deadline = time.monotonic() + 10
        while sandbox.open_sessions > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.7)  # (one still being made would be counted by now)
        assert sandbox.open_sessions == 1
        assert http.get(f"{base}/v1/metrics").json()["server/sessions"] == 1.0
        assert run(base, http, kept, "show")["run_result"]["status"] == "Finished"
