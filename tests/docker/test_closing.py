"""Ending things on Docker while work is in flight: a close runs to its end even when its
caller gives up, and nothing waits behind a running cell or for a container that will
never come (the twelfth red-team round)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from retool_exec import (
    DockerConfig,
    ExecResult,
    Outcome,
    Sandbox,
    SandboxClosedError,
    SessionLostError,
)
from retool_exec.backends.docker.backend import DockerBackend
from tests.conftest import LABELS, TEST_LABEL, require_docker, session_containers

pytestmark = pytest.mark.docker

SLACK = 5.0
"""Seconds a close may take on a loaded two-core machine (a container's removal)."""


@pytest.fixture()
def one_session_sandbox() -> Iterator[Sandbox]:
    require_docker()
    config = DockerConfig(policy="reuse", pool_size=1, labels=LABELS)
    with Sandbox(config, max_sessions=1) as sandbox:
        sandbox.start()
        yield sandbox


def _docker(sandbox: Sandbox) -> DockerBackend:
    assert isinstance(sandbox.backend, DockerBackend)
    return sandbox.backend


def _settled(sandbox: Sandbox, within: float = SLACK) -> bool:
    """No session is counted and no session container is left, within ``within`` s."""
    deadline = time.monotonic() + within
    while sandbox.open_sessions or _docker(sandbox)._session_containers:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("gives_up_after", [0.002, 0.02, 0.2])
def test_a_close_whose_caller_gives_up_still_ends_the_session(
    one_session_sandbox: Sandbox, gives_up_after: float
) -> None:
    """It once left the container running until the Sandbox closed, uncounted by
    max_sessions: each cancelled close leaked one more container."""
    sandbox = one_session_sandbox
    used: list[str] = []

    async def rounds() -> None:
        for _ in range(3):
            session = await sandbox.aopen_session()  # max_sessions=1: the last one is gone
            used.append(session._handle.family.container.id)  # type: ignore[attr-defined]
            assert (await session.arun_code("x = 1")).ok
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(session.aclose(), gives_up_after)
            if not session.closed:  # given up before the close began, or while it goes on
                try:
                    assert (await session.arun_code("x")).ok
                except SessionLostError:
                    assert session.closed  # the close went on after its caller gave up
                await session.aclose()
            assert await asyncio.to_thread(_settled, sandbox)

    asyncio.run(rounds())
    assert not set(used) & set(session_containers())


def test_closing_the_sandbox_does_not_wait_for_a_running_cell() -> None:
    """Closed 1.5 s into a 20 s cell, the Sandbox once waited for the cell to end."""
    require_docker()
    sandbox = Sandbox(DockerConfig(policy="reuse", pool_size=1, labels=LABELS))
    session = sandbox.open_session()
    fork = session.fork()  # a family of two: the closes of both must not queue
    results: list[ExecResult] = []
    running = threading.Thread(
        target=lambda: results.append(session.run_code("import time\ntime.sleep(20)", timeout=30))
    )
    running.start()
    time.sleep(1.5)
    started = time.monotonic()
    sandbox.close()
    took = time.monotonic() - started
    running.join(SLACK)
    assert took < SLACK, took
    [result] = results
    assert result.outcome is Outcome.SANDBOX_ERROR, result
    assert result.detail == "session lost: the sandbox was closed", result
    assert fork.closed and session.closed


def test_a_call_waiting_for_a_container_ends_when_the_sandbox_closes() -> None:
    """It once waited out the whole start_timeout for a container nobody would start."""
    require_docker()
    config = DockerConfig(policy="fresh", pool_size=1, start_timeout=60, labels=LABELS)
    sandbox = Sandbox(config)
    sandbox.start()
    outcomes: list[ExecResult | BaseException] = []

    def call(code: str) -> None:
        try:
            outcomes.append(sandbox.run_code(code, timeout=30))
        except Exception as exc:  # what the caller sees is the point
            outcomes.append(exc)

    first = threading.Thread(target=call, args=("import time\ntime.sleep(1)",))
    waiting = threading.Thread(target=call, args=("print('served')",))
    first.start()
    time.sleep(0.3)
    waiting.start()  # behind the first call; then for the container that replaces its own
    first.join(SLACK)
    started = time.monotonic()
    sandbox.close()
    waiting.join(SLACK)
    assert time.monotonic() - started < SLACK
    outcomes.pop(0)
    [outcome] = outcomes
    if isinstance(outcome, ExecResult) and outcome.ok:
        pytest.skip("the new container was ready before the close: nothing waited")
    # As a call still waiting for its slot: the caller's close, not the sandbox failing.
    assert isinstance(outcome, SandboxClosedError), repr(outcome)


def test_a_sync_call_in_flight_when_the_sandbox_closes_gets_an_explicit_answer() -> None:
    """A call on another thread once raised a bare concurrent.futures.CancelledError."""
    require_docker()
    sandbox = Sandbox(DockerConfig(policy="reuse", pool_size=1, labels=LABELS), max_workers=2)
    sandbox.start()
    outcomes: list[ExecResult | BaseException] = []

    def call() -> None:
        try:
            outcomes.append(sandbox.run_code("import time\ntime.sleep(20)", timeout=30))
        except BaseException as exc:
            outcomes.append(exc)

    calls = [threading.Thread(target=call) for _ in range(2)]  # one runs, one queues
    for each in calls:
        each.start()
    time.sleep(1.5)
    sandbox.close()
    for each in calls:
        each.join(SLACK + 6)
    assert len(outcomes) == 2
    # The running call too: it came back as the sandbox's failure ("the agent's stream
    # ended"), counted in the stats as one (red team D, the thirty-sixth round).
    assert all(isinstance(outcome, SandboxClosedError) for outcome in outcomes), outcomes
    assert sandbox.stats.metrics()["sandbox/sandbox_error_rate"] == 0.0


FORGETFUL = """
import gc, os, sys, time
from retool_exec import DockerConfig, Sandbox
sandbox = Sandbox(DockerConfig(policy="reuse", pool_size=2, labels={{{label!r}: {value!r}}}))
assert sandbox.run_code("print(1)").stdout == "1\\n"
print(os.getpid(), flush=True)
if sys.argv[1] == "dropped":
    del sandbox
    gc.collect()
if sys.argv[1] == "dropped-in-a-cycle":  # collected as garbage, its threads stopped first
    class Holder:
        def __init__(self, sandbox):
            self.sandbox, self.me = sandbox, self
    Holder(sandbox)
    del sandbox
    gc.collect()
if sys.argv[1] == "left-to-a-thread":  # main returns; the worker goes on using it
    import threading
    def work():
        time.sleep(0.3)
        for i in range(3):
            print(sandbox.run_code(f"print({{i}})").stdout, end="", flush=True)
    threading.Thread(target=work).start()
"""


def _owned_by(pid: int) -> list[str]:
    """Containers whose owner label names process ``pid``."""
    import docker

    client = docker.from_env()
    try:
        return [
            container.id
            for container in client.containers.list(all=True, filters={"label": TEST_LABEL})
            if f":{pid}:" in container.labels.get("org.retool_exec.owner", "")
        ]
    finally:
        client.close()


@pytest.mark.parametrize(
    "forgotten", ["at exit", "dropped", "dropped in a cycle", "left to a thread"]
)
def test_a_sandbox_never_closed_leaves_no_container(forgotten: str) -> None:
    """At exit (``concurrent.futures`` had stopped the removal threads before ``atexit``)
    and when dropped (nothing closed it): every container stayed. Closed when collected,
    a sandbox in a reference cycle hung its process at exit (its removal threads had
    been stopped by the collector first): a sandbox left open stays open until exit."""
    require_docker()
    [(label, value)] = LABELS.items()
    program = FORGETFUL.format(label=label, value=value)
    mode = forgotten.replace(" ", "-")
    with subprocess.Popen(
        [sys.executable, "-c", program, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None and child.stdin is not None
            pid = int(child.stdout.readline())
            if forgotten == "left to a thread":  # closed after the thread, not under it
                assert child.stdout.read() == "0\n1\n2\n"
            assert child.wait(60) == 0
        finally:
            if child.poll() is None:
                child.kill()
    assert _owned_by(pid) == []


def test_an_idle_session_is_reaped_on_time_beside_a_family_running_a_long_cell() -> None:
    """The reaper awaited each close in turn, and an idle session whose family ran a long
    cell waited for that cell: every other idle session outlived its TTL by the cell's
    time (red team D, the thirty-sixth round)."""
    require_docker()
    config = DockerConfig(policy="reuse", pool_size=1, labels=LABELS)

    async def reaped_after() -> float:
        with Sandbox(config, timeout=30, session_ttl=1.0) as sandbox:
            busy_family = await sandbox.aopen_session()
            await busy_family.arun_code("x = 1")
            fork = await busy_family.afork()
            other = await sandbox.aopen_session()  # after the family: reaped after it
            await other.arun_code("y = 1")
            long = asyncio.ensure_future(fork.arun_code("import time; time.sleep(8)"))
            started = time.monotonic()
            while other.lost is None and time.monotonic() - started < 15:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            took = time.monotonic() - started
            await long
            return took

    assert asyncio.run(reaped_after()) < 5.0
