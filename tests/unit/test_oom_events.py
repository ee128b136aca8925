"""Counting Docker's OOM events per container, without Docker: a stand-in for the
daemon's event stream that breaks once and is followed again from its last time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from retool_exec.backends.docker.oom_events import OomEvents


def oom(container_id: str, at: int) -> dict[str, Any]:
    return {"Type": "container", "Action": "oom", "id": container_id, "timeNano": at}


class Stream:
    """One subscription: its events, then the end of the stream (or a block until closed)."""

    def __init__(self, events: list[dict[str, Any]], then_block: bool) -> None:
        self.events = events
        self.closed = threading.Event()
        self.then_block = then_block

    def __iter__(self) -> Iterator[dict[str, Any]]:
        yield from self.events
        if self.then_block:
            self.closed.wait(10)

    def close(self) -> None:
        self.closed.set()


class Daemon:
    """``client.api.events``: each subscription gets the next stream; records ``since``."""

    def __init__(self, streams: list[Stream]) -> None:
        self.streams = streams
        self.since: list[int | None] = []
        self.api = self

    def events(self, since: int | None, filters: dict[str, str], decode: bool) -> Stream:
        assert filters == {"type": "container", "event": "oom", "label": "pool=p"}
        self.since.append(since)
        return self.streams.pop(0)


def wait_for(condition: Any) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_counts_per_container_across_a_reconnection_without_counting_twice() -> None:
    second = int(time.time()) + 5
    at = second * 10**9
    first = Stream([oom("a", at), oom("b", at + 5)], then_block=False)  # then breaks
    again = Stream([oom("b", at + 5), oom("a", at + 9)], then_block=True)  # b's is a replay
    daemon = Daemon([first, again])
    events = OomEvents(daemon, "pool=p")  # type: ignore[arg-type]
    assert events.count("a") is None  # not following yet: callers use Docker's flag
    for container_id in ("a", "b"):
        events.track(container_id)
    events.start()
    wait_for(lambda: events.count("a") == 2)
    assert (events.count("b"), events.count("c")) == (1, 0)
    assert daemon.since == [None, second]  # followed again from the last event's second
    events.forget("a")
    assert events.count("a") == 0
    events.close()
    assert again.closed.is_set()
    assert events.count("b") is None


def test_only_tracked_containers_are_counted_and_a_forgotten_one_stays_forgotten() -> None:
    """What is kept is bounded by the live containers: a removed container's late event
    (or one of a container this pool never tracked) is dropped, not kept forever."""
    at = (int(time.time()) + 5) * 10**9
    late = threading.Event()
    later = [oom("a", at + 2), oom("b", at + 3)]

    class Later(Stream):
        def __iter__(self) -> Iterator[dict[str, Any]]:
            yield from self.events
            late.wait(10)
            yield from later
            self.closed.wait(10)

    daemon = Daemon([Later([oom("a", at), oom("stranger", at + 1)], then_block=True)])
    events = OomEvents(daemon, "pool=p")  # type: ignore[arg-type]
    events.track("a")
    events.track("b")
    events.start()
    wait_for(lambda: events.count("a") == 1)
    assert events.count("stranger") == 0
    events.forget("a")
    late.set()
    wait_for(lambda: events.count("b") == 1)
    assert events.count("a") == 0
    assert set(events._counts) == {"b"} and set(events._last) == {"b"}
    events.close()


def test_a_daemon_that_refuses_leaves_it_not_following() -> None:
    class Refusing:
        api = None

        def __init__(self) -> None:
            self.api = self

        def events(self, **_: Any) -> Stream:
            raise RuntimeError("events are not allowed here")

    events = OomEvents(Refusing(), "pool=p")  # type: ignore[arg-type]
    events.start()
    assert events.count("a") is None
    events.close()
