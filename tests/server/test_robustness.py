"""Bad input, the token, overload and a broken sandbox: clear answers, and the server lives on."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from retool_exec import ExecResult, FakeBackend, LocalConfig, RunRequest
from retool_exec.server import ServerSettings, create_app
from tests.server.conftest import TOKEN, serve, verl_body

pytestmark = pytest.mark.server


def still_serving(url: str, client: httpx.Client) -> None:
    response = client.post(f"{url}/run_code", json={"code": "print('alive')"})
    assert response.status_code == 200
    assert response.json()["run_result"]["stdout"] == "alive\n"


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"", b'{"code": "print(1)"', b"\xff\xfe", b"[1, 2"],
    ids=["broken", "empty", "unterminated", "binary", "broken-array"],
)
def test_malformed_json_is_400(local_url: str, client: httpx.Client, raw: bytes) -> None:
    response = client.post(
        f"{local_url}/run_code", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["detail"].startswith("the request body is not valid JSON")
    still_serving(local_url, client)


def test_lone_surrogate_escapes_are_read_as_python_writes_them(
    local_url: str, client: httpx.Client
) -> None:
    """``json.dumps`` writes a lone surrogate as ``"\\ud800"`` and SandboxFusion reads it;
    this server answered 400 "not valid JSON: unexpected end of hex escape" (thirty-seventh
    round's new-user pass). The code then fails as through the Python API; in the stdin
    the server makes it ``?`` (it encodes stdin with ``replace``). NaN stays refused, and
    a wrong shape is still a 422."""
    surrogate = "\ud800"
    body = json.dumps({"code": f"x = {surrogate!r}\nprint(len(x))\nprint(x)"})
    assert "\\ud800" in body
    response = client.post(
        f"{local_url}/run_code", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    result = response.json()["run_result"]
    assert result["stdout"] == "1\n"
    assert "UnicodeEncodeError" in result["stderr"]
    read = json.dumps({"code": "import sys; print(sys.stdin.buffer.read())", "stdin": surrogate})
    response = client.post(
        f"{local_url}/run_code", content=read, headers={"content-type": "application/json"}
    )
    assert response.json()["run_result"]["stdout"] == "b'?'\n"
    echoed = json.dumps({"code": "print(1)", "request_id": surrogate})
    response = client.post(
        f"{local_url}/run_code", content=echoed, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text  # was a 500 after the code ran
    assert response.json()["request_id"] == surrogate
    deep = '{"code": "\\ud800", "a": ' + "[" * 3000 + "]" * 3000 + "}"
    for refused, status in (
        (json.dumps({"code": surrogate, "run_timeout": float("nan")}), 400),
        (json.dumps({"code": surrogate, "run_timeout": "soon"}), 422),
        (deep, 400),  # json.loads's RecursionError was a 500
    ):
        response = client.post(
            f"{local_url}/run_code", content=refused, headers={"content-type": "application/json"}
        )
        assert response.status_code == status, response.text
    still_serving(local_url, client)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"code": 5}, "code"),
        ({"language": "python"}, "code"),
        ({"code": "1", "run_timeout": "soon"}, "run_timeout"),
        ({"code": "1", "files": ["a.txt"]}, "files"),
        ({"code": "1", "fetch_files": "a.txt"}, "fetch_files"),
        ({"code": "1", "memory_limit_MB": "lots"}, "memory_limit_MB"),
        (["print(1)"], "body"),
    ],
)
def test_wrong_types_are_422_naming_the_field(
    local_url: str, client: httpx.Client, body: object, field: str
) -> None:
    response = client.post(f"{local_url}/run_code", json=body)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail.startswith("invalid RunCodeRequest: ")
    assert field in detail or "valid dictionary" in detail
    still_serving(local_url, client)


def test_form_content_type_is_still_read_as_json(local_url: str, client: httpx.Client) -> None:
    # ``curl -d '{...}'`` sends application/x-www-form-urlencoded.
    response = client.post(
        f"{local_url}/run_code",
        content=b'{"code": "print(9)"}',
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 200
    assert response.json()["run_result"]["stdout"] == "9\n"


def test_oversized_body_is_413(local_url: str, client: httpx.Client) -> None:
    code = "#" * (300 * 1024)  # the test server's limit is 256 KiB
    response = client.post(f"{local_url}/run_code", json={"code": code})
    assert response.status_code == 413
    assert "larger than 262144 bytes" in response.json()["detail"]
    still_serving(local_url, client)


def test_oversized_chunked_body_is_413(local_url: str, client: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"code": "'
        for _ in range(40):
            yield b"#" * 8192
        yield b'"}'

    response = client.post(f"{local_url}/run_code", content=chunks())
    assert response.status_code == 413
    still_serving(local_url, client)


def test_too_large_file_is_413(local_url: str, client: httpx.Client) -> None:
    content = base64.b64encode(b"x" * (17 * 1024)).decode()  # the limit is 16 KiB
    response = client.post(
        f"{local_url}/run_code", json=verl_body("print(1)", files={"big.bin": content})
    )
    assert response.status_code == 413
    assert "big.bin" in response.json()["detail"]


def test_sandbox_failure_is_sandbox_error_with_http_200(
    fake_server: tuple[str, FakeBackend], client: httpx.Client
) -> None:
    url, backend = fake_server
    response = client.post(f"{url}/run_code", json=verl_body("print(1)"))
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "SandboxError"
    assert body["run_result"]["status"] == "Error"
    assert body["run_result"]["return_code"] is None
    assert "injected failure: the container vanished" in body["message"]
    assert len(backend.requests) == 1


def test_printed_records_are_not_read_from_a_backends_output(client: httpx.Client) -> None:
    # The old in-sandbox helper's records, as a backend's stdout: just text now.
    def printing(request: RunRequest) -> ExecResult:
        record = '{"kind":"setup_error","error":"disk full"}'
        files = '{"kind":"files","files":{"a.txt":"eA=="},"errors":{}}'
        stdout = "".join(
            f"<<retool-exec:{n}>>{r}<<end:{n}>>" for n in ("00", "ab") for r in (record, files)
        )
        return ExecResult(True, stdout, "", 0, False, 0.01)

    with serve(create_app(FakeBackend(printing))) as url:
        body = verl_body(
            "print(1)", files={"a.txt": base64.b64encode(b"x").decode()}, fetch_files=["a.txt"]
        )
        response = client.post(f"{url}/run_code", json=body)
    answer = response.json()
    assert answer["status"] == "Success"
    assert answer["run_result"]["stdout"].count("disk full") == 2
    assert answer["files"] == {}
    assert response.headers["x-retool-exec-outcome"] == "success"


def test_limits_are_clamped_to_the_server_maxima(client: httpx.Client) -> None:
    backend = FakeBackend(lambda _request: "")
    settings = ServerSettings(max_run_timeout=5.0, max_memory_mb=512)
    with serve(create_app(backend, settings=settings)) as url:
        client.post(f"{url}/run_code", json=verl_body("1", run_timeout=3600, memory_limit_MB=8192))
        client.post(f"{url}/run_code", json=verl_body("1", run_timeout=2, memory_limit_MB=-1))
        client.post(f"{url}/run_code", json={"code": "1"})
    seen = [(request.timeout, request.memory_mb) for request in backend.requests]
    assert seen == [(5.0, 512), (2.0, 512), (5.0, 512)]  # the default 10 s is clamped too


def test_a_memory_limit_above_the_stack_bound_is_clamped_not_refused(
    client: httpx.Client,
) -> None:
    """The stack limit follows ``memory_limit_MB`` (SandboxFusion's runner); with no
    server maximum, 65537 MB and more was a 400 from the stack limit's own bound
    (twenty-eighth red-team round)."""
    backend = FakeBackend(lambda _request: "")
    with serve(create_app(backend)) as url:
        for memory in (65536, 65537, 1 << 40):
            response = client.post(f"{url}/run_code", json=verl_body("1", memory_limit_MB=memory))
            assert response.status_code == 200, response.text
    seen = [(request.memory_mb, request.stack_mb) for request in backend.requests]
    assert seen == [(65536, 65536), (65537, 65536), (1 << 40, 65536)]


class _Gate:
    """A FakeBackend handler that holds every call until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    async def __call__(self, _request: RunRequest) -> str:
        await asyncio.to_thread(self.release.wait, 30)
        return "done\n"


def test_504_only_when_the_queue_is_full(client: httpx.Client) -> None:
    gate = _Gate()
    settings = ServerSettings(max_concurrency=1, max_queue=1, queue_timeout=None)
    with serve(create_app(FakeBackend(gate), settings=settings)) as url:
        results: list[int] = []

        def post() -> None:
            with httpx.Client(timeout=30) as own:
                results.append(own.post(f"{url}/run_code", json={"code": "1"}).status_code)

        holders = [threading.Thread(target=post) for _ in range(2)]  # one runs, one waits
        for thread in holders:
            thread.start()
        deadline = time.monotonic() + 10
        while client.get(f"{url}/v1/metrics").json()["server/waiting"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        refused = client.post(f"{url}/run_code", json={"code": "1"})
        assert refused.status_code == 504
        assert "capacity" in refused.json()["detail"]
        gate.release.set()
        for thread in holders:
            thread.join(10)
        assert results == [200, 200]
        assert client.post(f"{url}/run_code", json={"code": "1"}).status_code == 200


def test_504_after_waiting_longer_than_the_queue_timeout(client: httpx.Client) -> None:
    gate = _Gate()
    settings = ServerSettings(max_concurrency=1, max_queue=4, queue_timeout=0.3)
    with serve(create_app(FakeBackend(gate), settings=settings)) as url:
        holder = threading.Thread(
            target=lambda: httpx.post(f"{url}/run_code", json={"code": "1"}, timeout=30)
        )
        holder.start()
        deadline = time.monotonic() + 10
        while client.get(f"{url}/v1/metrics").json()["server/running"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        started = time.monotonic()
        refused = client.post(f"{url}/run_code", json={"code": "1"})
        assert refused.status_code == 504
        assert 0.25 < time.monotonic() - started < 5
        gate.release.set()
        holder.join(10)


def test_token_is_enforced_when_set(client: httpx.Client) -> None:
    settings = ServerSettings(token=TOKEN, prefix="/p")
    with serve(create_app(LocalConfig(timeout=10.0), settings=settings)) as url:
        body = {"code": "print(1)"}
        missing = client.post(f"{url}/run_code", json=body)
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = client.post(f"{url}/run_code", json=body, headers={"Authorization": "Bearer no"})
        assert wrong.status_code == 401
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert client.post(f"{url}/run_code", json=body, headers=bearer).status_code == 200
        assert client.post(f"{url}/p/run_code", json=body, headers=bearer).status_code == 200
        # verl cannot set headers, but honours credentials in the URL (HTTP Basic).
        host = url.removeprefix("http://")
        in_url = client.post(f"http://user:{TOKEN}@{host}/run_code", json=body)
        assert in_url.status_code == 200
        assert client.get(f"{url}/v1/metrics").status_code == 401
        assert client.get(f"{url}/v1/ping").json() == "pong"
        assert client.get(f"{url}/p/v1/ping").json() == "pong"


@pytest.mark.parametrize(
    "raw",
    ["0", "-1", "-0.5", "NaN", "Infinity", "-Infinity", "1e999", '"nan"', '"inf"'],
)
def test_run_timeout_that_is_not_a_positive_finite_number_is_400(
    local_url: str, client: httpx.Client, raw: str
) -> None:
    # A silent default would run the code under a limit the client never asked for.
    response = client.post(
        f"{local_url}/run_code",
        content=f'{{"code": "print(1)", "run_timeout": {raw}}}'.encode(),
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert "run_timeout" in response.json()["detail"]
    still_serving(local_url, client)


@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("compile_timeout", "NaN"),
        ("compile_timeout", "-1"),
        ("total_timeout", "0"),
        ("total_timeout", "NaN"),
        ("cell_timeout", "-1"),
        ("cell_timeout", "Infinity"),
    ],
)
def test_other_timeouts_that_are_not_numbers_of_seconds_are_400(
    local_url: str, client: httpx.Client, field: str, raw: str
) -> None:
    path = "/run_code" if field == "compile_timeout" else "/run_jupyter"
    code = '"code": "print(1)"' if path == "/run_code" else '"cells": ["print(1)"]'
    response = client.post(
        f"{local_url}{path}",
        content=f'{{{code}, "{field}": {raw}}}'.encode(),
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert field in response.json()["detail"]
