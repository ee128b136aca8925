"""Calls run on their caller's own event loop, on real containers (``Backend.runs_on_any_loop``).

Once the Docker backend has started, ``arun_code`` reads and writes the
container's stream on the loop that awaits it; the pool and the
``max_workers`` slots are shared by every loop. These tests hold that to
what a trainer does: a new ``asyncio.run()`` per step, several threads each
with a loop, callers that give up mid-call.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import docker
import pytest

from retool_exec import DockerConfig, Outcome, Sandbox
from retool_exec.backends.docker.backend import DockerBackend
from retool_exec.bench.pools import settle
from tests.conftest import LABELS, require_docker
from tests.docker.pool_probes import pool_containers, record_containers

pytestmark = pytest.mark.docker


@pytest.fixture()
def pool_of_two() -> Iterator[Sandbox]:
    require_docker()
    config = DockerConfig(policy="reuse", pool_size=2, timeout=20, labels=LABELS)
    with Sandbox(config, max_workers=2) as sandbox:
        sandbox.start()
        yield sandbox


def test_a_call_needs_no_hop_to_the_sandboxs_own_loop(pool_of_two: Sandbox) -> None:
    """With the sandbox's loop thread blocked, a call from another loop still completes."""
    portal = pool_of_two._portal
    assert portal is not None
    blocked, free = threading.Event(), threading.Event()

    def block() -> None:
        blocked.set()
        free.wait(30)

    portal.loop.call_soon_threadsafe(block)
    assert blocked.wait(5)
    try:
        result = asyncio.run(asyncio.wait_for(pool_of_two.arun_code("print(6 * 7)"), 15))
    finally:
        free.set()
    assert (result.outcome, result.stdout) == (Outcome.SUCCESS, "42\n"), result


def test_loops_of_many_threads_share_the_pool_and_max_workers(pool_of_two: Sandbox) -> None:
    """Three threads, each with its own asyncio.run(), six calls each: every result is the
    caller's own, and never more than max_workers=2 run at once (timed in the containers)."""
    code = "import time; began = time.time(); time.sleep(0.15); print({n}, began, time.time())"
    results: dict[int, Any] = {}

    def thread_main(first: int) -> None:
        async def step() -> list[Any]:
            calls = [pool_of_two.arun_code(code.format(n=n)) for n in range(first, first + 6)]
            return await asyncio.gather(*calls)

        for offset, result in enumerate(asyncio.run(step())):
            results[first + offset] = result

    threads = [threading.Thread(target=thread_main, args=(first,)) for first in (0, 6, 12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(results) == list(range(18))
    spans = []
    for n, result in results.items():
        assert result.outcome is Outcome.SUCCESS, result
        echoed, began, ended = result.stdout.split()
        assert int(echoed) == n, "a result went to the wrong caller"
        spans.append((float(began), float(ended)))
    most = max(sum(1 for b, e in spans if b <= moment < e) for moment, _ in spans)
    assert most <= 2, f"{most} calls ran at once with max_workers=2"
    assert pool_of_two._slots is not None and pool_of_two._slots.free == 2


def test_a_caller_that_gives_up_retires_its_container_and_the_pool_refills(
    pool_of_two: Sandbox,
) -> None:
    """A call abandoned on its loop may still run: its container is never handed out again."""
    seen = record_containers(pool_of_two)

    async def give_up() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pool_of_two.arun_code("import time; time.sleep(30)"), 1.0)

    asyncio.run(give_up())
    [abandoned] = seen
    asyncio.run(settle(pool_of_two, 60))
    assert abandoned not in pool_containers(pool_of_two)
    assert len(pool_containers(pool_of_two)) == 2

    async def later() -> list[Any]:
        return await asyncio.gather(*(pool_of_two.arun_code("print('next')") for _ in range(4)))

    assert [r.stdout for r in asyncio.run(later())] == ["next\n"] * 4
    assert abandoned not in seen[1:]
    assert pool_of_two._slots is not None and pool_of_two._slots.free == 2


def test_a_loop_that_ends_with_calls_in_flight_leaves_the_pool_whole(pool_of_two: Sandbox) -> None:
    """asyncio.run() cancels what its step left running: no container or slot is lost."""

    async def step() -> None:
        for _ in range(2):
            asyncio.get_running_loop().create_task(
                pool_of_two.arun_code("import time; time.sleep(30)")
            )
        await asyncio.sleep(0.5)  # both calls are in their containers now

    asyncio.run(step())
    asyncio.run(settle(pool_of_two, 60))
    assert pool_of_two._slots is not None and pool_of_two._slots.free == 2
    started = time.monotonic()
    result = pool_of_two.run_code("print('whole')")
    assert result.stdout == "whole\n", result
    assert time.monotonic() - started < 10
    assert len(pool_containers(pool_of_two)) == 2


def test_a_loop_closed_under_its_calls_leaves_the_pool_whole(pool_of_two: Sandbox) -> None:
    """A loop closed (not by ``asyncio.run``) while its calls ran never resumes them: their
    slots and containers were never given back, and every later call waited for ever
    (twenty-third outside check). They are taken back, the containers retired."""
    seen = record_containers(pool_of_two)
    loop = asyncio.new_event_loop()
    tasks = [
        loop.create_task(pool_of_two.arun_code("import time; time.sleep(30)")) for _ in range(2)
    ]
    deadline = time.monotonic() + 20
    while len(seen) < 2:  # both calls are in their containers
        assert time.monotonic() < deadline
        loop.run_until_complete(asyncio.sleep(0.05))
    loop.run_until_complete(asyncio.sleep(0.2))
    loop.close()
    abandoned = list(seen)
    assert len(abandoned) == 2
    assert_whole_again(pool_of_two, within=15, slots=2)
    assert not set(abandoned) & set(pool_containers(pool_of_two))
    del tasks


def assert_whole_again(sandbox: Sandbox, *, within: float, slots: int) -> None:
    """A new call runs within ``within`` s, and once settled every slot is free and the
    pool holds ``slots`` containers (its size here)."""
    started = time.monotonic()
    result = sandbox.run_code("print('whole')")
    assert result.stdout == "whole\n", result
    assert time.monotonic() - started < within
    asyncio.run(settle(sandbox, 60))
    assert sandbox._slots is not None and sandbox._slots.free == slots
    assert len(pool_containers(sandbox)) == slots


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # asyncio's "unclosed event loop"
def test_a_loop_dropped_unclosed_with_a_call_in_flight_leaves_the_pool_whole() -> None:
    """``asyncio.wait`` with a timeout does not cancel; a loop then dropped without
    ``close()`` kept its slot and container for ever (twenty-fourth outside check)."""
    require_docker()
    config = DockerConfig(policy="reuse", pool_size=1, timeout=20, labels=LABELS)
    with Sandbox(config, max_workers=1) as sandbox:
        sandbox.start()

        def step() -> None:
            loop = asyncio.new_event_loop()
            task = loop.create_task(sandbox.arun_code("import time; time.sleep(30)"))
            loop.run_until_complete(asyncio.wait([task], timeout=1.0))

        step()
        assert_whole_again(sandbox, within=20, slots=1)


@pytest.mark.parametrize(
    "confirmation",
    [None, {"type": "reset", "clean": False, "reason": "a process was left"}, "wrong nonce"],
    ids=["absent", "unclean", "forged"],
)
def test_a_container_whose_reset_is_not_confirmed_is_not_handed_out(confirmation: Any) -> None:
    """The next call reads the confirmation the agent sent after the last call: absent
    (past its deadline), unclean, or without the call's nonce, the container is retired
    and the call runs on another one. Absent, the call waits no longer than the deadline
    and a new container's start: a reset made long by a call's leftovers once held a
    one-container pool's next caller 5.9-11.5 s (finding 40)."""
    require_docker()
    from retool_exec.backends.docker.pool import RESET_CONFIRMATION_LIMIT

    config = DockerConfig(policy="reuse", pool_size=1, timeout=10, labels=LABELS)
    with Sandbox(config, max_workers=1) as sandbox:
        sandbox.start()
        seen = record_containers(sandbox)
        assert sandbox.run_code("print(1)").ok
        backend = sandbox.backend
        assert isinstance(backend, DockerBackend) and backend.pool is not None
        [idle] = backend.pool._ready._items
        deadline = time.monotonic() + 10
        while not idle.channel.poll() and time.monotonic() < deadline:
            time.sleep(0.01)
        [sent] = list(idle.channel._pending)
        assert sent["type"] == "reset" and sent["clean"] is True, sent
        idle.channel._pending.clear()
        if confirmation == "wrong nonce":
            idle.channel._pending.append({**sent, "nonce": "0" * 32})
        elif confirmation is not None:
            idle.channel._pending.append({**confirmation, "nonce": idle.nonce})
        idle.reset_due = time.monotonic() + RESET_CONFIRMATION_LIMIT  # as the release set it
        result = sandbox.run_code("print('elsewhere')")
        assert (result.outcome, result.stdout) == (Outcome.SUCCESS, "elsewhere\n"), result
        assert result.queue_wait < RESET_CONFIRMATION_LIMIT + 4.0, result.queue_wait
        assert seen[-1] != seen[0]
        asyncio.run(settle(sandbox, 60))
        assert seen[0] not in pool_containers(sandbox)


def test_a_container_still_resetting_does_not_hold_up_the_call_that_drew_it() -> None:
    """A call can leave a reset that takes long (or never ends); the next call that draws
    that container lets a confirmed one go first instead of waiting out the limit."""
    require_docker()
    from retool_exec.backends.docker.pool import RESET_CONFIRMATION_LIMIT

    config = DockerConfig(policy="reuse", pool_size=2, timeout=10, labels=LABELS)
    with Sandbox(config, max_workers=2) as sandbox:
        sandbox.start()
        seen = record_containers(sandbox)
        assert all(r.ok for r in sandbox.run_many(["print(1)", "print(2)"]))
        backend = sandbox.backend
        assert isinstance(backend, DockerBackend) and backend.pool is not None
        slow, other = backend.pool._ready._items
        deadline = time.monotonic() + 10
        while not (slow.channel.poll() and other.channel.poll()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        slow.channel._pending.clear()  # its confirmation never comes: the reset still runs
        slow.reset_due = time.monotonic() + RESET_CONFIRMATION_LIMIT
        started = time.monotonic()
        result = sandbox.run_code("print('not held up')")
        took = time.monotonic() - started
    assert result.stdout == "not held up\n", result
    assert seen[-1] == other.id
    assert took < 2.0, f"the call waited {took:.1f} s on a container still resetting"


def test_a_call_waiting_for_a_slot_when_the_sandbox_closes_ends_and_starts_nothing() -> None:
    """Closed while a caller's loop waits for a slot: that call ends (SandboxClosedError),
    and no pool is started again on the caller's loop."""
    require_docker()
    config = DockerConfig(policy="reuse", pool_size=1, timeout=20, labels=LABELS)
    sandbox = Sandbox(config, max_workers=1)
    sandbox.start()
    backend = sandbox.backend
    assert isinstance(backend, DockerBackend) and backend._factory is not None
    label = f"org.retool_exec.pool={backend._factory.pool_id}"
    outcomes: dict[str, Any] = {}

    def caller(name: str, code: str) -> None:
        async def call() -> Any:
            return await sandbox.arun_code(code)

        try:
            outcomes[name] = asyncio.run(call())
        except Exception as exc:
            outcomes[name] = exc

    holding = threading.Thread(target=caller, args=("holding", "import time; time.sleep(3)"))
    holding.start()
    deadline = time.monotonic() + 10
    while sandbox._slots is None or sandbox._slots.free:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    waiting = threading.Thread(target=caller, args=("waiting", "print('late')"))
    waiting.start()
    time.sleep(0.3)
    sandbox.close()
    holding.join(30)
    waiting.join(30)
    from retool_exec import SandboxClosedError

    assert isinstance(outcomes["waiting"], SandboxClosedError), outcomes
    assert getattr(outcomes["holding"], "outcome", None) is not Outcome.SUCCESS
    client = docker.from_env()
    try:
        assert client.api.containers(all=True, filters={"label": label}) == []
        assert backend._pool is None
    finally:
        client.close()
