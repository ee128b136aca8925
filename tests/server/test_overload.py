"""Bursts: every request is answered before its client gives up, and gone clients cost nothing.

verl's SandboxFusion client (``call_sandbox_api``) reads with a timeout of
``compile_timeout + run_timeout + 10`` seconds and retries only on HTTP 504,
up to 3 attempts with a 1 s, then 2 s delay. A request the server holds in
its queue past that read timeout is a lost sample (``-1``), not a retry. So
the server bounds each request's wait by its own timeouts and answers 504 in
time; a request whose client has gone while it waited never runs.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from retool_exec import ExecResult, FakeBackend, RunRequest, Sandbox
from retool_exec.server import ServerSettings, create_app
from tests.server.conftest import serve, verl_body

pytestmark = pytest.mark.server

VERL_API_TIMEOUT = 10.0
"""verl adds this to compile_timeout + run_timeout for its read timeout."""
VERL_MAX_RETRIES = 3


@dataclass
class Attempt:
    status: int | None
    """The HTTP status, or None when the client's read timeout ran out first."""
    seconds: float


def verl_call(url: str, code: str, *, compile_timeout: float, run_timeout: float) -> list[Attempt]:
    """verl's ``call_sandbox_api`` loop: read timeout compile + run + 10, retry 504 only."""
    attempts: list[Attempt] = []
    read_timeout = compile_timeout + run_timeout + VERL_API_TIMEOUT
    body = verl_body(code, compile_timeout=compile_timeout, run_timeout=run_timeout)
    with httpx.Client(timeout=read_timeout) as http:
        for attempt in range(VERL_MAX_RETRIES):
            started = time.monotonic()
            try:
                status: int | None = http.post(f"{url}/run_code", json=body).status_code
            except httpx.TimeoutException:
                status = None
            attempts.append(Attempt(status, time.monotonic() - started))
            if status != 504:
                break
            if attempt < VERL_MAX_RETRIES - 1:
                time.sleep(1.0 * (attempt + 1))
    return attempts


async def _sleep_the_whole_limit(request: RunRequest) -> str:
    """A FakeBackend handler: code that runs until its time limit (the worst case)."""
    await asyncio.sleep(request.timeout)
    return "done\n"


def test_a_burst_of_verl_requests_never_ends_as_the_clients_read_timeout() -> None:
    # Default settings but for max_concurrency: `retool-exec serve` uses the CPU
    # count, 2 on a small machine. 40 cases of 1 s each are 20 s of work, past
    # the client's 12 s read timeout: the late ones must be told 504 in time.
    settings = ServerSettings(max_concurrency=2)
    app = create_app(FakeBackend(_sleep_the_whole_limit), settings=settings)
    with serve(app) as url, ThreadPoolExecutor(max_workers=40) as pool:
        calls = [
            pool.submit(verl_call, url, f"print({i})", compile_timeout=1, run_timeout=1)
            for i in range(40)
        ]
        outcomes = [call.result(timeout=120) for call in calls]
    attempts = [attempt for outcome in outcomes for attempt in outcome]
    timed_out = [attempt for attempt in attempts if attempt.status is None]
    assert not timed_out, f"{len(timed_out)} of {len(attempts)} attempts hit the read timeout"
    assert {attempt.status for attempt in attempts} <= {200, 504}
    assert any(attempt.status == 504 for attempt in attempts), "the burst never overloaded"
    assert sum(outcome[-1].status == 200 for outcome in outcomes) >= 4
    # A 504 comes within the request's own budget (1 s of compile_timeout + 0.5 s), not at 30 s.
    assert max(a.seconds for a in attempts if a.status == 504) < 1.5 + 2.0


def test_queue_wait_is_bounded_by_the_requests_own_timeouts() -> None:
    gate = threading.Event()

    async def held(_request: RunRequest) -> str:
        await asyncio.to_thread(gate.wait, 30)
        return "done\n"

    settings = ServerSettings(max_concurrency=1, queue_timeout=2.0, max_run_timeout=1.0)
    with serve(create_app(FakeBackend(held), settings=settings)) as url, httpx.Client() as http:
        holder = threading.Thread(
            target=lambda: httpx.post(f"{url}/run_code", json={"code": "1"}, timeout=40)
        )
        holder.start()
        try:
            _wait_for_metric(http, url, "server/running", 1)
            cases = [
                (0.5, 1.0, 1.0),  # compile_timeout (Python compiles nothing) + half the run
                (0.0, 1.0, 0.5),  # no compile time: half the run time
                (0.0, 1.8, 1.3),  # run time the server clamps away (1.8 -> 1) is time too
                (30.0, 1.0, 2.0),  # never longer than the server's queue_timeout
            ]
            for compile_timeout, run_timeout, budget in cases:
                started = time.monotonic()
                body = verl_body("1", compile_timeout=compile_timeout, run_timeout=run_timeout)
                refused = http.post(f"{url}/run_code", json=body, timeout=30)
                waited = time.monotonic() - started
                assert refused.status_code == 504
                assert refused.headers["retry-after"]
                assert budget <= waited < budget + 1.0, (compile_timeout, run_timeout, waited)
            # SkyRL's coder1 sends no compile_timeout and reads for run_timeout + 2 s: it is
            # given no compile time to wait (the default's 10 s made its answers late).
            coder1 = {"code": "1", "language": "python", "stdin": None, "run_timeout": 1.0}
            started = time.monotonic()
            refused = http.post(f"{url}/run_code", json=coder1, timeout=30)
            waited = time.monotonic() - started
            assert refused.status_code == 504
            assert 0.5 <= waited < 1.5, waited
        finally:
            gate.set()
            holder.join(30)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("print(1)", 200),  # done in the time left: answered as if it had not waited
        ("spin", 504),  # stopped at the shorter limit: the server's fault, retried by verl
    ],
)
def test_a_request_that_waited_runs_with_what_is_left_of_its_time(code: str, status: int) -> None:
    """Waiting past ``compile_timeout`` leaves the code the rest of ``compile_timeout +
    run_timeout``; a TimeLimitExceeded is only ever earned with the whole ``run_timeout``.

    Why: a client that does not retry a 504 (Reasoning360's coder1) lost a third of its
    correct answers under a burst when a request could wait only ``compile_timeout``.
    """
    gate = threading.Event()
    limits: list[float] = []

    async def handler(request: RunRequest) -> ExecResult | str:
        if request.code == "hold":
            await asyncio.to_thread(gate.wait, 30)
            return "held\n"
        limits.append(request.timeout)
        if request.code == "spin":
            await asyncio.sleep(request.timeout)
            return ExecResult(False, "", "", None, True, request.timeout)
        return "1\n"

    settings = ServerSettings(max_concurrency=1, queue_timeout=10.0)
    with serve(create_app(FakeBackend(handler), settings=settings)) as url, httpx.Client() as http:
        holder = threading.Thread(
            target=lambda: httpx.post(f"{url}/run_code", json={"code": "hold"}, timeout=40)
        )
        holder.start()
        try:
            _wait_for_metric(http, url, "server/running", 1)
            threading.Timer(1.0, gate.set).start()  # the request below waits ~1 s of its 1.5
            body = verl_body(code, compile_timeout=0.5, run_timeout=2.0)
            started = time.monotonic()
            answer = http.post(f"{url}/run_code", json=body, timeout=30)
            took = time.monotonic() - started
            refused = http.get(f"{url}/v1/metrics").json()["server/refused"]
        finally:
            gate.set()
            holder.join(30)
    assert answer.status_code == status, answer.text
    assert refused == (1 if status == 504 else 0)
    assert limits and 1.0 < limits[0] < 1.75, limits  # 0.5 + 2.0 - ~1 s waited
    assert took < 0.5 + 2.0 + 0.5  # within compile_timeout + run_timeout
    if status == 504:
        assert "the server was busy" in answer.json()["detail"]
    else:
        assert answer.json()["run_result"]["stdout"] == "1\n"


@pytest.mark.parametrize("compile_timeout", [0.0, 0.5])
def test_a_request_that_did_not_wait_long_keeps_its_whole_time_limit(
    compile_timeout: float,
) -> None:
    """With ``compile_timeout: 0`` the moment spent parsing the request counted as waiting:
    on an idle server every program that ran to its limit was a 504 (twenty-fourth
    outside check)."""
    limits: list[float] = []

    async def handler(request: RunRequest) -> ExecResult:
        limits.append(request.timeout)
        return ExecResult(False, "", "", None, True, request.timeout)

    with serve(create_app(FakeBackend(handler))) as url, httpx.Client() as http:
        body = verl_body("spin", compile_timeout=compile_timeout, run_timeout=2.0)
        answer = http.post(f"{url}/run_code", json=body, timeout=30)
        refused = http.get(f"{url}/v1/metrics").json()["server/refused"]
    assert answer.status_code == 200, answer.text
    assert answer.json()["run_result"]["status"] == "TimeLimitExceeded"
    assert (limits, refused) == ([2.0], 0)


class _OneAtATime(FakeBackend):
    """A FakeBackend that, like a Docker pool of one, runs one call at a time."""

    @property
    def capacity(self) -> int:
        return 1


def test_the_server_queues_no_more_than_the_sandbox_runs() -> None:
    # max_concurrency above what the sandbox runs at once would park requests in
    # the Sandbox's own queue, where no server bound applies.
    gate = threading.Event()

    async def held(_request: RunRequest) -> str:
        await asyncio.to_thread(gate.wait, 30)
        return "done\n"

    sandbox = Sandbox(_OneAtATime(held))
    try:
        settings = ServerSettings(max_concurrency=4)
        with serve(create_app(sandbox, settings=settings)) as url, httpx.Client() as http:
            holder = threading.Thread(
                target=lambda: httpx.post(f"{url}/run_code", json={"code": "1"}, timeout=40)
            )
            holder.start()
            try:
                _wait_for_metric(http, url, "server/running", 1)
                started = time.monotonic()
                body = verl_body("1", compile_timeout=0.5, run_timeout=1)  # waits 0.5 + 0.5 s
                refused = http.post(f"{url}/run_code", json=body, timeout=30)
                assert refused.status_code == 504
                assert time.monotonic() - started < 2.0
                assert http.get(f"{url}/v1/metrics").json()["server/max_concurrency"] == 1
            finally:
                gate.set()
                holder.join(30)
    finally:
        sandbox.close()


def test_queued_work_whose_client_disconnected_is_dropped() -> None:
    gate = threading.Event()
    ran: list[str] = []

    async def held(request: RunRequest) -> str:
        ran.append(request.code)
        if request.code == "hold":
            await asyncio.to_thread(gate.wait, 30)
        return "done\n"

    settings = ServerSettings(max_concurrency=1, queue_timeout=30.0)
    with serve(create_app(FakeBackend(held), settings=settings)) as url, httpx.Client() as http:
        holder = threading.Thread(
            target=lambda: httpx.post(f"{url}/run_code", json={"code": "hold"}, timeout=40)
        )
        holder.start()
        try:
            _wait_for_metric(http, url, "server/running", 1)
            port = int(url.rsplit(":", 1)[1])
            body = b'{"code": "gone", "compile_timeout": 30, "run_timeout": 30}'
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                raw.sendall(
                    b"POST /run_code HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                _wait_for_metric(http, url, "server/waiting", 1)
            # The client is gone: its request leaves the queue without running.
            _wait_for_metric(http, url, "server/waiting", 0)
            assert http.get(f"{url}/v1/metrics").json()["server/abandoned"] == 1
        finally:
            gate.set()
            holder.join(30)
        assert http.post(f"{url}/run_code", json={"code": "after"}).status_code == 200
    assert ran == ["hold", "after"]


def _wait_for_metric(http: httpx.Client, url: str, name: str, value: float) -> None:
    deadline = time.monotonic() + 10
    while http.get(f"{url}/v1/metrics").json().get(name) != value:
        assert time.monotonic() < deadline, f"{name} never became {value}"
        time.sleep(0.02)


def test_admission_never_loses_a_slot_when_waiters_give_up() -> None:
    # Waiters that time out, or whose client leaves, at the moment a slot is handed
    # to them must pass it on: afterwards every slot is free and no counter is off.
    from retool_exec.server.admission import Admission, ClientGone, Overloaded

    async def scenario() -> tuple[int, int, int, int]:
        admission = Admission(max_concurrency=2, max_queue=100, queue_timeout=5.0)
        served = 0

        async def one(index: int) -> None:
            nonlocal served
            leave_at = asyncio.get_running_loop().time() + 0.01 * (index % 7)

            async def gone() -> bool:
                await asyncio.sleep(0)  # a slot may be handed over meanwhile, as with a socket
                return index % 3 == 0 and asyncio.get_running_loop().time() >= leave_at

            try:
                async with admission.slot(wait=0.005 * (index % 5), gone=gone):
                    served += 1
                    await asyncio.sleep(0.002 * (index % 4))
            except (Overloaded, ClientGone):
                pass

        await asyncio.gather(*(one(index) for index in range(200)))
        async with admission.slot(wait=0.0), admission.slot(wait=0.0):
            pass  # both slots are free again
        return served, admission.admitted, admission.running, admission.refused

    served, admitted, running, refused = asyncio.run(scenario())
    assert (admitted, running) == (0, 0)
    assert served > 0
    assert refused > 0
