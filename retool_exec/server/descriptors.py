"""File descriptors: the connection bound that fits the process's limit, and running out quietly.

Every open connection holds a descriptor, and so does most of what the backend holds
open: Docker's API connections, each container's attach socket, each session's
container, a local call's pipes. With the soft ``RLIMIT_NOFILE`` most shells start
with (1024) and the default ``max_connections`` (1024), idle connections alone ran
``retool-exec serve`` out of descriptors: containers failed to start (EMFILE),
requests waited seconds for their connection to be accepted, and asyncio logged a
traceback for every failed accept, ~150,000 in 10 s (60 MB; red-team round B).

So ``retool-exec serve``:

1. raises its soft limit to the hard one (``raise_descriptor_limit``): the limit is
   the process's own, and only the hard one is an administrator's;
2. keeps ``descriptor_reserve`` descriptors for the backend and fits the connection
   bound in what is left (``fit_max_connections``): a ``--max-connections`` that does
   not fit is refused at startup, the default is lowered to fit, with one warning.

The reserve, measured with ``/proc/PID/fd`` under load (sixteen and thirty-two slots,
``reuse`` and ``fresh`` containers, eight sessions): the Docker backend holds ~28 of
its own (API connections, the event loop's, logs) plus ~1.3 per run slot (an attach
socket; ``fresh`` replaces containers through more API connections) and ~1 per
session; the local backend ~10 plus 4 per running call (three pipes and a file) and
~1 per session. So the reserve is what is open when ``serve`` starts, plus
``DESCRIPTORS_RESERVED``, plus ``DESCRIPTORS_PER_CALL`` x (run slots + sessions), plus
``ACCEPT_HEADROOM`` for connections past the bound (below): room to spare for both.

A connection past the bound is accepted before it is refused (504) and closed, a few
event-loop passes later, and asyncio accepts all that wait (up to the listen backlog,
2048) in one pass: the red team's flood ran the process out that way even within the
bound. ``ListeningSocket`` accepts at most ``ACCEPTS_PER_PASS`` a pass (the rest wait
for the next pass, a moment later), so those hold at most ``ACCEPT_HEADROOM``.

Should descriptors still run out (a backend that holds more than its reserve),
asyncio reports the failed accept and pauses accepting for a second; but it reported
(with a traceback) and scheduled that pause once for every remaining accept of the
pass, up to 2048 times, and each pause ended in another such pass.
``ListeningSocket`` makes that one report and one pause per pass, and
``quiet_accept_errors`` logs at most one line every ``ACCEPT_LOG_INTERVAL`` seconds.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from retool_exec._errors import ConfigError

__all__ = [
    "ACCEPTS_PER_PASS",
    "ACCEPT_HEADROOM",
    "ACCEPT_LOG_INTERVAL",
    "DEFAULT_MAX_CONNECTIONS",
    "DESCRIPTORS_PER_CALL",
    "DESCRIPTORS_RESERVED",
    "ListeningSocket",
    "Throttled",
    "descriptor_reserve",
    "fit_max_connections",
    "open_descriptors",
    "quiet_accept_errors",
    "raise_descriptor_limit",
]

log = logging.getLogger("retool_exec.server")

DEFAULT_MAX_CONNECTIONS = 1024
"""``retool-exec serve``'s connection bound when none is given and the limit allows it."""

DESCRIPTORS_RESERVED = 64
"""Descriptors kept for the process itself and the backend's fixed part."""

DESCRIPTORS_PER_CALL = 4
"""Descriptors kept for each run slot and each session the backend may hold."""

ACCEPTS_PER_PASS = 32
"""Connections ``ListeningSocket`` accepts in one pass of the event loop."""

ACCEPT_HEADROOM = 4 * ACCEPTS_PER_PASS
"""Descriptors kept for connections accepted past the bound and not closed yet: a
refused connection is closed three passes after it was accepted (the accept's task,
``connection_made``, ``connection_lost``), so four passes' worth."""

ACCEPT_LOG_INTERVAL = 10.0
"""Seconds between two log lines about failed accepts (or refused connections)."""

_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""The errors asyncio pauses accepting for (``selector_events._accept_connection``)."""

_HOW_TO_RAISE = (
    "raise the hard limit (ulimit -Hn as root, systemd LimitNOFILE=, docker run "
    "--ulimit nofile=N:N)"
)


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one; the ``(soft, hard)`` now in force.

    A hard limit of "unlimited" (macOS) is not a value the soft one may take: it is
    raised as far as the system lets it, else left as it is.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft in (resource.RLIM_INFINITY, hard):
        return soft, hard
    targets = [hard] if hard != resource.RLIM_INFINITY else [1 << 20, 10240]
    for target in targets:
        if target <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            break
        except (ValueError, OSError):
            continue
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


def open_descriptors() -> int:
    """Descriptors this process has open now (0 where that cannot be read)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(0, len(os.listdir(folder)) - 1)  # less the listing's own
        except OSError:
            continue
    return 0


def descriptor_reserve(*, run_slots: int, sessions: int, open_now: int = 0) -> int:
    """Descriptors to keep beside the connections: those ``open_now``, the backend's
    fixed part, ``DESCRIPTORS_PER_CALL`` for each call it runs at once and each session
    it may hold, and ``ACCEPT_HEADROOM`` (see the module)."""
    return (
        open_now
        + DESCRIPTORS_RESERVED
        + ACCEPT_HEADROOM
        + DESCRIPTORS_PER_CALL * (run_slots + sessions)
    )


def fit_max_connections(
    requested: int | None, *, limit: int, reserve: int, default: int = DEFAULT_MAX_CONNECTIONS
) -> tuple[int, str | None]:
    """The connection bound to serve with, and a warning when the default was lowered.

    ``requested`` is the one given (``--max-connections``), None for the default;
    ``limit`` the soft ``RLIMIT_NOFILE`` (``RLIM_INFINITY``: any fits); ``reserve``
    what the backend keeps. A given bound that does not fit in ``limit - reserve`` is
    a ``ConfigError`` naming the numbers and the way out, never silently changed; the
    default is lowered to fit, or refused the same way if nothing fits.
    """
    if limit == resource.RLIM_INFINITY:
        return (default if requested is None else requested), None
    room = limit - reserve
    if requested is not None:
        if requested > room:
            raise ConfigError(
                f"--max-connections {requested} does not fit the file-descriptor limit: "
                f"{requested} connections and the {reserve} descriptors kept for the "
                f"backend need {requested + reserve}, and this process may open {limit} "
                f"(RLIMIT_NOFILE, raised to its hard limit); {_HOW_TO_RAISE}, or give "
                f"--max-connections {room} or less"
                if room >= 1
                else _no_room(limit, reserve)
            )
        return requested, None
    if room >= default:
        return default, None
    if room < 1:
        raise ConfigError(_no_room(limit, reserve))
    return room, (
        f"max_connections lowered from {default} to {room} to fit the file-descriptor "
        f"limit ({limit}, RLIMIT_NOFILE at its hard limit; {reserve} kept for the "
        f"backend); for more, {_HOW_TO_RAISE}"
    )


def _no_room(limit: int, reserve: int) -> str:
    return (
        f"the file-descriptor limit leaves no room for connections: this process may "
        f"open {limit} (RLIMIT_NOFILE, raised to its hard limit) and keeps {reserve} for "
        f"the backend; {_HOW_TO_RAISE}, or lower --max-concurrency"
    )


class Throttled:
    """A warning that may recur without bound, logged at most once per ``interval``
    seconds, with the count of those held back since the last line."""

    def __init__(self, logger: logging.Logger, interval: float = ACCEPT_LOG_INTERVAL) -> None:
        self.logger = logger
        self.interval = interval
        self._last: float | None = None
        self._held = 0

    def warning(self, message: str, *args: object) -> None:
        now, last = time.monotonic(), self._last
        if last is not None and now - last < self.interval:
            self._held += 1
            return
        if self._held and last is not None:
            message += f" (and {self._held} more like it in the last {now - last:.0f} s)"
        self._last, self._held = now, 0
        self.logger.warning(message, *args)


@contextmanager
def quiet_accept_errors(interval: float = ACCEPT_LOG_INTERVAL) -> Iterator[None]:
    """While in the block, the running loop reports a failed accept (EMFILE...) in one
    line at most every ``interval`` seconds, without the traceback; whatever else the
    loop reports goes to the handler it had."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    failures = Throttled(log, interval)

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if (
            str(context.get("message", "")).startswith("socket.accept() out of system resource")
            and isinstance(exc, OSError)
            and exc.errno in _OUT_OF_DESCRIPTORS
        ):
            failures.warning(
                "cannot accept connections for a second: %s (the process has no file "
                "descriptor left; see max_connections)",
                exc.strerror or exc,
            )
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
    try:
        yield
    finally:
        if loop.get_exception_handler() is handle:
            loop.set_exception_handler(previous)


class ListeningSocket(socket.socket):
    """A listening socket that ends an event-loop pass of accepts early: after
    ``ACCEPTS_PER_PASS`` connections, and after the first failure for lack of
    descriptors.

    asyncio's accept loop (``selector_events._accept_connection``, 3.11 to 3.13) accepts
    up to the backlog (2048) in one pass, and goes on after a failed accept: every
    remaining accept of the pass fails too, and each is reported and schedules its own
    retry a second later. Here a pass ends when it has its share (the listening socket
    is still readable, so the next pass comes at once), and the first failure raises
    as usual (asyncio reports it and pauses accepting) while the rest of its pass finds
    nothing to accept. Used outside an event loop, it is a plain socket.
    """

    _accepted = 0
    _exhausted = False
    _reset_scheduled = False

    def accept(self) -> tuple[socket.socket, Any]:
        if self._exhausted or self._accepted >= ACCEPTS_PER_PASS:
            raise BlockingIOError(errno.EAGAIN, "this pass of accepts has ended")
        try:
            accepted = super().accept()
        except OSError as exc:
            if exc.errno in _OUT_OF_DESCRIPTORS:
                self._exhausted = True
                self._end_pass_soon()
            raise
        self._accepted += 1
        self._end_pass_soon()
        return accepted

    def _end_pass_soon(self) -> None:
        """The next pass of the running loop starts with a clean count."""
        if self._reset_scheduled:
            return
        try:
            asyncio.get_running_loop().call_soon(self._next_pass)
        except RuntimeError:  # no loop, no passes: hold nothing back
            self._next_pass()
            return
        self._reset_scheduled = True

    def _next_pass(self) -> None:
        self._accepted = 0
        self._exhausted = False
        self._reset_scheduled = False
