"""Docker's OOM events for one pool's containers, counted as they come.

Docker's ``State.OOMKilled`` is set by an OOM kill of *any* process of a container and
stays set for the container's life. In a reused container or a session family, one
call's real OOM (a child killed, the call reported as ``oom``, the container clean
after its reset) made every later broken stream of that container read as the later
call's own ``oom``: an infrastructure failure charged to an unrelated sample, and a call
whose code never ran not retried (nineteenth red-team round, finding 53). Counting the
daemon's ``oom`` events per container lets a request be judged by the events that came
after it was sent. The subscription is made before any container exists, so no event
is missed; a dropped stream is followed again from the last event's time. Only the
containers between ``track`` and ``forget`` are counted, so what is kept stays bounded by
the live containers (a late event of a removed one is dropped).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from typing import Any

import docker

__all__ = ["OomEvents"]

log = logging.getLogger(__name__)

RECONNECT_PAUSE = 0.5
"""Seconds between attempts to follow the daemon's events again after the stream broke."""


class OomEvents:
    """Counts the daemon's ``oom`` events per container of one label, in a thread."""

    def __init__(self, client: docker.DockerClient, label: str) -> None:
        self._client = client
        self._label = label
        self._counts: Counter[str] = Counter()
        self._last: dict[str, int] = {}
        """Per tracked container: the time (ns) of its last event counted; a replay after
        a reconnection comes in order, so what is not later was counted already."""
        self._lock = threading.Lock()
        self._stream: Any = None
        self._since: int | None = None
        self._live = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Subscribe (blocking: when this returns, every later event is counted), then
        follow the stream in a daemon thread. A daemon that refuses leaves it not live:
        ``count`` is then None and callers fall back to Docker's flag."""
        try:
            self._subscribe()
        except Exception as exc:  # an old or remote daemon: judged by the flag instead
            log.warning("cannot follow Docker's OOM events: %s", exc)
            return
        self._thread = threading.Thread(target=self._follow, name="retool-oom-events", daemon=True)
        self._thread.start()

    def count(self, container_id: str) -> int | None:
        """The ``oom`` events seen so far for ``container_id``; None when not following."""
        with self._lock:
            return self._counts[container_id] if self._live else None

    def track(self, container_id: str) -> None:
        """Count ``container_id``'s events from now: called once it is created, before
        it starts."""
        with self._lock:
            self._last.setdefault(container_id, -1)

    def forget(self, container_id: str) -> None:
        """A removed container's count (its id is never used again)."""
        with self._lock:
            self._counts.pop(container_id, None)
            self._last.pop(container_id, None)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self._live = False
            stream = self._stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()

    def _subscribe(self) -> None:
        stream = self._client.api.events(
            since=self._since,
            filters={"type": "container", "event": "oom", "label": self._label},
            decode=True,
        )
        with self._lock:
            self._stream = stream
            self._live = not self._closed
            if self._since is None:  # what a later subscription replays from (a gap's events)
                self._since = int(time.time()) - 1
        if self._closed:
            stream.close()

    def _follow(self) -> None:
        while not self._closed:
            try:
                for event in self._stream:
                    self._note(event)
            except Exception as exc:
                if not self._closed:
                    log.warning("Docker's event stream broke: %s", exc)
            with self._lock:
                self._live = False
            while not self._closed:
                time.sleep(RECONNECT_PAUSE)
                try:
                    self._subscribe()
                    break
                except Exception as exc:
                    log.warning("cannot follow Docker's OOM events again: %s", exc)

    def _note(self, event: dict[str, Any]) -> None:
        container_id = str(event.get("id") or event.get("Actor", {}).get("ID") or "")
        at = int(event.get("timeNano") or 0)
        if not container_id or event.get("Action", event.get("status")) != "oom":
            return
        with self._lock:
            last = self._last.get(container_id)
            if last is None or at <= last:  # not tracked, or given again after a reconnection
                return
            self._last[container_id] = at
            self._counts[container_id] += 1
            self._since = max(self._since or 0, at // 1_000_000_000)
