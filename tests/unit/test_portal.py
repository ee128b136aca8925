"""The sandbox's private loop, awaited from other event loops (no Docker)."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator

import pytest

from retool_exec import FakeBackend, Sandbox, SandboxClosedError
from retool_exec._portal import LoopThread


@pytest.fixture
def portal() -> Iterator[LoopThread]:
    thread = LoopThread(name="test-portal")
    yield thread
    thread.stop()


def test_a_result_and_the_loop_it_ran_on(portal: LoopThread) -> None:
    async def where() -> int:
        assert asyncio.get_running_loop() is portal.loop
        return threading.get_ident()

    async def main() -> None:
        assert await portal.run_from_other_loop(where()) != threading.get_ident()

    asyncio.run(main())


def test_an_exception_reaches_the_caller_as_it_was_raised(portal: LoopThread) -> None:
    class Boom(Exception):
        pass

    async def fails() -> None:
        raise Boom("from the portal")

    async def main() -> None:
        with pytest.raises(Boom, match="from the portal"):
            await portal.run_from_other_loop(fails())

    asyncio.run(main())


def test_cancelling_the_caller_cancels_the_work_on_the_portal(portal: LoopThread) -> None:
    began, ended = threading.Event(), threading.Event()

    async def slow() -> None:
        began.set()
        try:
            await asyncio.sleep(30)
        finally:
            ended.set()

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(portal.run_from_other_loop(slow()), 0.2)

    asyncio.run(main())
    assert began.is_set()
    assert ended.wait(5), "the portal's task kept running after its caller gave up"


def test_cancelled_before_the_portal_started_it(portal: LoopThread) -> None:
    """Cancelled at once: the work is started and then cancelled (FIFO on the portal)."""

    async def slow() -> None:
        await asyncio.sleep(30)

    async def main() -> None:
        task = asyncio.ensure_future(portal.run_from_other_loop(slow()))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def others() -> int:
        await asyncio.sleep(0.1)  # the cancel has been run by now
        return len(asyncio.all_tasks() - {asyncio.current_task()})

    asyncio.run(main())
    assert portal.submit(others()).result(5) == 0, "work left running on the portal"


def test_work_cancelled_on_the_portal_cancels_the_caller(portal: LoopThread) -> None:
    async def cancels_itself() -> None:
        raise asyncio.CancelledError

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await portal.run_from_other_loop(cancels_itself())

    asyncio.run(main())


def test_a_stopped_portal_refuses_and_leaves_no_unawaited_coroutine(
    portal: LoopThread,
) -> None:
    portal.stop()

    async def work() -> int:
        return 1

    async def main() -> None:
        with pytest.raises(RuntimeError):
            await portal.run_from_other_loop(work())

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... was never awaited"
        asyncio.run(main())
        gc.collect()


def test_an_abandoned_failure_logs_nothing(
    portal: LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    """The caller gave up; the work then failed: nobody is told 'exception never retrieved'."""
    failed = threading.Event()

    async def fails_later() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            failed.set()
            raise ValueError("failed while being cancelled") from None

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(portal.run_from_other_loop(fails_later()), 0.1)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())
        assert failed.wait(5)
        portal.stop()
        gc.collect()
    assert "never retrieved" not in caplog.text


def test_work_handed_over_as_the_loop_stops_is_not_left_pending() -> None:
    """The loop stops with a hand-over still queued: the caller hears back, no hang."""
    portal = LoopThread(name="stop-race")
    queued, heard = threading.Event(), []

    def stop_while_a_handover_arrives() -> None:  # runs on the loop, holding its thread
        portal.loop.stop()
        queued.wait(5)  # the hand-over lands in the queue while the loop is stopping

    async def work() -> str:
        await asyncio.sleep(0.2)
        return "done"

    async def one() -> str:
        waiting = asyncio.ensure_future(portal.run_from_other_loop(work()))
        await asyncio.sleep(0.05)
        queued.set()
        try:
            return await waiting
        except asyncio.CancelledError:
            return "cancelled"
        except RuntimeError:
            return "refused"

    portal.loop.call_soon_threadsafe(stop_while_a_handover_arrives)
    caller = threading.Thread(target=lambda: heard.append(asyncio.run(one())), daemon=True)
    caller.start()
    caller.join(5)
    assert not caller.is_alive(), "the caller waits for work its closed loop will never run"
    assert heard == ["cancelled"]


def test_a_result_its_cancelled_caller_never_sees_is_abandoned(portal: LoopThread) -> None:
    """Done on the portal while its caller's loop was busy, then the caller cancelled:
    the result (a session opened for it) was dropped; ``abandoned`` now gets it."""
    given: list[int] = []
    handed = threading.Event()

    async def work() -> int:
        await asyncio.sleep(0.05)
        return 42

    async def abandon(value: int) -> None:
        given.append(value)
        handed.set()

    async def main() -> None:
        call = asyncio.ensure_future(portal.run_from_other_loop(work(), abandoned=abandon))
        await asyncio.sleep(0.01)  # handed over
        threading.Event().wait(0.3)  # this loop busy while the work ends on the portal
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(main())
    assert handed.wait(5) and given == [42]


def test_shielded_work_runs_to_its_end_however_soon_its_caller_gives_up(
    portal: LoopThread,
) -> None:
    """A close cancelled before its first step never began (the review of the
    twenty-eighth red-team round): shielded, it runs."""
    ran = threading.Event()

    async def close() -> None:
        await asyncio.sleep(0.05)
        ran.set()

    async def main() -> None:
        call = asyncio.ensure_future(portal.run_from_other_loop(close(), shielded=True))
        await asyncio.sleep(0)  # handed over, not yet begun
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(main())
    assert ran.wait(5)


def _ends_within(seconds: float, scenario: Callable[[], object]) -> list[BaseException]:
    """Run ``scenario`` in a thread of its own; fail if it is still running after ``seconds``
    (a deadlock), and return what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            scenario()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "deadlocked"
    return raised


@pytest.mark.parametrize("held", ["hand-over gate", "sandbox lock", "stats lock"])
def test_close_from_a_signal_handler_while_its_thread_holds_a_lock(held: str) -> None:
    """A signal handler runs in the caller's thread between its steps: one that closed the
    sandbox while that thread was handing a call over (holding the gate) hung the process
    for ever (thirty-third red-team round). The thread holding the lock stands for it."""
    sandbox = Sandbox(FakeBackend(lambda request: "1\n"))
    sandbox.start()
    assert sandbox._portal is not None
    lock = {
        "hand-over gate": sandbox._portal._gate,
        "sandbox lock": sandbox._lock,
        "stats lock": sandbox.stats._lock,
    }[held]

    def handler_in_the_middle() -> None:
        with lock:
            sandbox.stats.metrics()
            sandbox.close()

    assert _ends_within(10, handler_in_the_middle) == []
    assert sandbox.closed


def test_a_close_while_start_waits_is_sandbox_closed() -> None:
    """``start()`` raised a bare ``concurrent.futures.CancelledError`` when ``close()`` came
    while it waited; a call gets ``SandboxClosedError`` (thirty-third red-team round)."""

    class SlowStart(FakeBackend):
        async def start(self) -> None:
            await asyncio.sleep(5)

    sandbox = Sandbox(SlowStart(lambda request: ""))
    starting = threading.Thread(target=lambda: raised.extend(_ends_within(10, sandbox.start)))
    raised: list[BaseException] = []
    starting.start()
    time.sleep(0.3)
    sandbox.close()
    starting.join(15)
    assert [type(exc) for exc in raised] == [SandboxClosedError], raised


def test_close_from_a_handler_in_metrics_while_a_call_ends() -> None:
    """The handler's thread was in ``metrics()`` (holding the stats' lock) as another
    thread's call ended: the call's ``record`` waited for that lock on the sandbox's loop,
    so the close the handler waited for never ran (the review of the thirty-third round)."""

    async def slow(request: object) -> str:
        await asyncio.sleep(0.2)
        return "1\n"

    sandbox = Sandbox(FakeBackend(slow))
    sandbox.start()
    caller = threading.Thread(target=lambda: _ends_within(10, lambda: sandbox.run_code("1")))
    caller.start()

    def handler_in_metrics() -> None:
        with sandbox.stats._lock:
            time.sleep(0.6)  # the call ends meanwhile, and is recorded
            sandbox.close()

    assert _ends_within(10, handler_in_metrics) == []
    caller.join(15)
    assert sandbox.stats.metrics()["sandbox/calls"] == 1.0
