"""Handoff and Slots: items and slots shared by waiters on many event loops (no Docker)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Iterator
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retool_exec import _handoff
from retool_exec._handoff import Handoff, Slots
from retool_exec._portal import LoopThread

T = TypeVar("T")


@pytest.fixture
def other_loop() -> Iterator[LoopThread]:
    thread = LoopThread(name="test-handoff")
    yield thread
    thread.stop()


def waiting_on(
    loop: LoopThread, handoff: Handoff[T], timeout: float | None = None
) -> concurrent.futures.Future[T]:
    """A ``get`` on ``loop``, once it is waiting."""
    waiting = loop.submit(handoff.get(timeout=timeout))
    while not handoff._waiters:
        threading.Event().wait(0.001)
    return waiting


def test_items_come_out_in_the_order_they_went_in() -> None:
    handoff: Handoff[int] = Handoff()
    for item in range(5):
        handoff.put(item)

    async def main() -> list[int]:
        return [await handoff.get() for _ in range(5)]

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]
    assert handoff.get_nowait() is None


def test_a_waiter_on_another_loop_gets_an_item_put_from_this_one(other_loop: LoopThread) -> None:
    handoff: Handoff[str] = Handoff()
    waiting = waiting_on(other_loop, handoff, timeout=10)

    async def main() -> None:
        handoff.put("container")  # from this loop to the waiter's

    asyncio.run(main())
    assert waiting.result(5) == "container"
    assert len(handoff) == 0


def test_the_oldest_waiter_is_served_first() -> None:
    handoff: Handoff[int] = Handoff()

    async def main() -> list[int]:
        order: list[int] = []

        async def wait(name: int) -> None:
            await handoff.get()
            order.append(name)

        tasks = []
        for name in range(3):
            tasks.append(asyncio.create_task(wait(name)))
            await asyncio.sleep(0)
        for item in range(3):
            handoff.put(item)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(main()) == [0, 1, 2]


def test_a_timed_out_waiter_leaves_the_queue_and_takes_nothing() -> None:
    handoff: Handoff[int] = Handoff()

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await handoff.get(timeout=0.01)
        assert not handoff._waiters
        handoff.put(7)
        assert len(handoff) == 1

    asyncio.run(main())


def test_an_item_handed_to_a_waiter_cancelled_before_it_ran_is_passed_on() -> None:
    """The item reached the waiter's future, then its task was cancelled: not lost."""
    handoff: Handoff[int] = Handoff()

    async def main() -> None:
        first = asyncio.create_task(handoff.get())
        second = asyncio.create_task(handoff.get())
        await asyncio.sleep(0)
        handoff.put(1)  # set on first's future; first has not resumed yet
        first.cancel()
        assert await asyncio.wait_for(second, 1) == 1
        with pytest.raises(asyncio.CancelledError):
            await first

    asyncio.run(main())


def test_an_item_on_its_way_to_a_waiter_of_another_loop_that_left_is_passed_on(
    other_loop: LoopThread,
) -> None:
    """The waiter's loop is busy while it is cancelled and an item is put for it: the
    cancellation runs first there, so the item arrives for a waiter that left."""
    handoff: Handoff[int] = Handoff()
    gone = waiting_on(other_loop, handoff)
    busy, free = threading.Event(), threading.Event()

    def block() -> None:
        busy.set()
        free.wait(5)

    other_loop.loop.call_soon_threadsafe(block)
    assert busy.wait(5)
    gone.cancel()  # queued on the busy loop
    handoff.put(5)  # the waiter has not left yet: the item is queued behind the cancel
    free.set()

    async def main() -> int:
        return await handoff.get(timeout=5)

    assert asyncio.run(main()) == 5


def test_a_waiter_whose_loop_is_closed_is_skipped() -> None:
    handoff: Handoff[int] = Handoff()
    dead = asyncio.new_event_loop()
    orphan: asyncio.Future[int] = dead.create_future()
    handoff._waiters.append(orphan)
    dead.close()
    handoff.put(3)
    assert handoff.get_nowait() == 3


class Closed(Exception):
    pass


def test_closing_fails_every_waiter_now_and_later(other_loop: LoopThread) -> None:
    """A closing pool's waiters once waited out their whole timeout (60 s by default)."""
    handoff: Handoff[str] = Handoff()
    elsewhere = waiting_on(other_loop, handoff, timeout=30)

    async def main() -> None:
        here = asyncio.ensure_future(handoff.get(timeout=30))
        await asyncio.sleep(0)  # it starts waiting
        assert len(handoff._waiters) == 2
        handoff.close(lambda: Closed("closed"))
        with pytest.raises(Closed):
            await asyncio.wait_for(here, 5)
        with pytest.raises(Closed):
            await handoff.get(timeout=30)

    asyncio.run(main())
    with pytest.raises(Closed):
        elsewhere.result(5)


def test_items_kept_before_closing_can_still_be_taken() -> None:
    handoff: Handoff[int] = Handoff()
    handoff.put(1)
    handoff.close(lambda: Closed("closed"))
    assert handoff.get_nowait() == 1
    handoff.put(2)  # a container given back after the close: the closer retires it
    assert asyncio.run(handoff.get()) == 2


def test_slots_bound_the_calls_of_every_loop_together(other_loop: LoopThread) -> None:
    slots = Slots(2)
    inside = 0
    most = 0
    lock = threading.Lock()

    async def one() -> None:
        nonlocal inside, most
        async with slots.hold():
            with lock:
                inside += 1
                most = max(most, inside)
            await asyncio.sleep(0.005)
            with lock:
                inside -= 1

    async def many() -> None:
        await asyncio.gather(*(one() for _ in range(20)))

    there = other_loop.submit(many())
    asyncio.run(many())
    there.result(10)
    assert most == 2
    assert slots.free == 2


def test_a_slot_held_from_a_loop_closed_under_it_comes_back_once() -> None:
    """A call whose loop was closed while it ran held its slot for ever, and every later
    call waited for ever (twenty-third outside check). Taken back, it is not given back
    a second time when the abandoned coroutine is finalized."""
    slots = Slots(1)
    dead = asyncio.new_event_loop()
    holding = threading.Event()

    async def abandoned() -> None:
        async with slots.hold():
            holding.set()
            await asyncio.sleep(3600)

    task = dead.create_task(abandoned())
    dead.run_until_complete(asyncio.sleep(0.01))
    assert holding.is_set() and slots.free == 0
    dead.close()  # without cancelling the task: it never resumes

    async def next_call() -> int:
        async with slots.hold():
            return slots.free

    assert asyncio.run(asyncio.wait_for(next_call(), 5)) == 0
    assert slots.free == 1
    task_coroutine = task.get_coro()
    del task
    assert task_coroutine is not None
    with contextlib.suppress(RuntimeError):
        task_coroutine.close()  # its ``finally`` runs now: the slot is not given twice
    assert slots.free == 1


def test_a_slot_on_its_way_to_a_loop_stopped_then_closed_comes_back(
    other_loop: LoopThread,
) -> None:
    """A slot freed while its next taker's loop was stopped went on its way there, and
    was lost when that loop closed: nothing recorded who had it (twenty-fourth outside
    check). It is recorded when it is handed over, and taken back."""
    slots = Slots(1)
    release = threading.Event()

    async def hold_until_released() -> None:
        async with slots.hold():
            await asyncio.to_thread(release.wait, 10)

    holder = other_loop.submit(hold_until_released())
    while slots.free:
        threading.Event().wait(0.001)
    stopped = asyncio.new_event_loop()

    async def in_line() -> None:
        async with slots.hold():
            pass

    task = stopped.create_task(in_line())
    stopped.run_until_complete(asyncio.sleep(0.05))  # it waits in line; the loop stops
    release.set()
    holder.result(5)  # the slot is now on its way to the stopped loop
    stopped.close()

    async def next_call() -> None:
        async with slots.hold():
            pass

    asyncio.run(asyncio.wait_for(next_call(), 5))
    assert slots.free == 1
    del task


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # asyncio's "unclosed event loop"
def test_a_slot_held_from_a_loop_dropped_unclosed_comes_back() -> None:
    """``asyncio.wait`` with a timeout leaves its task running; a loop then dropped without
    ``close()`` kept its slot for ever (twenty-fourth outside check). The slot names its
    loop weakly, and a caller waiting long has the collector find the dropped loop."""
    _handoff._Collections.last = 0.0  # no collection of another test's holds this one back
    slots = Slots(1)

    def step() -> None:
        loop = asyncio.new_event_loop()

        async def held() -> None:
            async with slots.hold():
                await asyncio.sleep(3600)

        task = loop.create_task(held())
        loop.run_until_complete(asyncio.wait([task], timeout=0.05))  # gives up, not cancels

    step()
    assert slots.free == 0

    async def next_call() -> None:
        async with slots.hold():
            pass

    asyncio.run(asyncio.wait_for(next_call(), 10))
    assert slots.free == 1


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # asyncio's "unclosed event loop"
@pytest.mark.parametrize("ending", ["closed", "dropped"])
def test_a_loop_with_more_calls_than_slots_ended_under_them_stops_nobody(ending: str) -> None:
    """One call holds the slot, one waits first in line, both on a loop then closed or
    dropped: the waiter's own timer never fired, it alone looked for abandoned slots,
    and every later call waited for ever (twenty-fifth outside check)."""
    _handoff._Collections.last = 0.0
    slots = Slots(1)

    def step() -> None:
        loop = asyncio.new_event_loop()

        async def call() -> None:
            async with slots.hold():
                await asyncio.sleep(3600)

        tasks = [loop.create_task(call()) for _ in range(2)]
        loop.run_until_complete(asyncio.wait(tasks, timeout=0.05))
        if ending == "closed":
            loop.close()

    step()
    assert (slots.free, len(slots._waiting)) == (0, 1)

    async def next_call() -> None:
        async with slots.hold():
            pass

    asyncio.run(asyncio.wait_for(next_call(), 10))
    assert slots.free == 1


def test_slots_are_counted_not_stored() -> None:
    """``max_workers=2**40`` built 2**40 tokens: the first call never returned."""
    slots = Slots(2**40)
    assert slots.free == 2**40

    async def one() -> None:
        async with slots.hold():
            assert slots.free == 2**40 - 1

    asyncio.run(asyncio.wait_for(one(), 5))
    assert slots.free == 2**40


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["put", "get", "cancel", "timeout"]), min_size=1, max_size=40))
def test_no_item_is_lost_or_duplicated(steps: list[str]) -> None:
    """Whatever mix of puts, gets, cancels and timeouts: every item put is got once or kept."""
    handoff: Handoff[int] = Handoff()

    async def main() -> None:
        got: list[int] = []
        waiters: list[asyncio.Task[int]] = []
        put = 0
        for step in steps:
            if step == "put":
                handoff.put(put)
                put += 1
            elif step == "get":
                waiters.append(asyncio.create_task(handoff.get()))
            elif step == "cancel" and waiters:
                waiters[len(waiters) // 2].cancel()
            elif step == "timeout":
                waiters.append(asyncio.create_task(handoff.get(timeout=0)))
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        for task in waiters:
            if task.done() and not task.cancelled() and task.exception() is None:
                got.append(task.result())
            else:
                task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        while (item := handoff.get_nowait()) is not None:
            got.append(item)
        assert sorted(got) == list(range(put))

    asyncio.run(main())
