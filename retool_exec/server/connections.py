"""The HTTP layer under the app: slow and surplus connections never reach it.

uvicorn closes an idle connection only after it has answered a request on it
(``timeout_keep_alive``), and never bounds how many connections are open. A
client that opens connections and sends its headers a byte at a time
(slowloris), or nothing at all, would hold a socket and a file descriptor for
as long as it likes, before any token check could refuse it.

``GuardedH11Protocol`` is uvicorn's h11 protocol with two additions:

- **header timeout**: a request's headers (the request line included) must
  be complete ``header_timeout`` seconds after the connection opened, or
  after the first byte of a later request on a kept-alive connection; else
  the server answers ``408`` and closes the connection. The app, and so the
  token check, never sees such a request.
- **body timeout**: once the headers are in, the body must be complete within
  ``body_timeout`` seconds; else the same answer (408, closed). Why: a body sent a
  byte every few seconds held its connection for as long as the client liked, and
  1024 of them shut every other client out (504), each holding up to the body
  limit (``BodyLimitMiddleware``, 8 MiB) of memory (eighteenth red-team round).
- **send timeout**: an answer the client does not read must still leave:
  while anything of it is buffered (the connection closing or not), the
  buffer must shrink every ``send_timeout`` seconds, else the connection is
  dropped with what it holds. Why: a client that never read its answer held the connection and the
  whole answer's memory (~13 MB for 1 MiB of output on each stream) for as
  long as it liked, past every other timeout (twentieth red-team round).
- **connection bound**: past ``max_connections`` open connections, a new one
  gets ``504`` (the status SandboxFusion clients retry on) and is closed at
  once (logged at most once every ``ACCEPT_LOG_INTERVAL`` seconds: a client that
  reconnects as fast as it can must not write the log as fast).
- **shutdown**: uvicorn's graceful shutdown calls ``shutdown`` on every open
  connection first; that tells the app's service (``begin_shutdown``) at once, so
  queued requests are answered then, not cancelled ten seconds later
  (``shutdown.py``).

``uvicorn_config`` builds a ``uvicorn.Config`` for an app from ``create_app``
with this protocol and the app's settings; ``retool-exec serve`` uses it. It
also turns off uvicorn's proxy headers, which are on by default for connections
from 127.0.0.1: with them, any local process (and every client of a tunnel or
port-forward, all of which arrive from 127.0.0.1) chose the address the server
took for it by sending ``X-Forwarded-For``, and so became another client, able
to use that client's sessions and to pass its own cap (thirtieth red-team
round). A client is its TCP peer, or its token; the headers a client writes
never say who it is. And it keeps session ids out of the access log
(``access_log.py``).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import sys
import termios
from typing import Any, ClassVar, Protocol

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from retool_exec.server.access_log import redact_session_ids
from retool_exec.server.descriptors import Throttled
from retool_exec.server.settings import ServerSettings

__all__ = ["GuardedH11Protocol", "Stoppable", "guarded_protocol", "uvicorn_config"]

log = logging.getLogger("retool_exec.server")

_refusals = Throttled(log)


class Stoppable(Protocol):
    """What is told that the server has begun to shut down (a ``SandboxService``)."""

    def begin_shutdown(self) -> None: ...


def _raw_answer(status: bytes, detail: str, *extra: bytes) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, written before h11 saw a
    request: the app's error shape (``{"detail": ...}``), so a client that reads every
    error as JSON reads these too."""
    body = json.dumps({"detail": detail}).encode("ascii")
    head = [
        b"HTTP/1.1 " + status,
        b"content-type: application/json",
        *extra,
        b"connection: close",
        b"content-length: " + str(len(body)).encode("ascii"),
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


_TIMED_OUT = _raw_answer(b"408 Request Timeout", "the request headers came in too slowly")
_BODY_TIMED_OUT = _raw_answer(b"408 Request Timeout", "the request body came in too slowly")
_TOO_MANY = _raw_answer(
    b"504 Gateway Timeout", "too many open connections; retry later", b"retry-after: 1"
)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, plus a header timeout and a bound on open connections."""

    header_timeout: ClassVar[float] = 5.0
    """Seconds a request's headers may take to arrive."""
    body_timeout: ClassVar[float] = 30.0
    """Seconds a request's body may take to arrive once its headers are in."""
    send_timeout: ClassVar[float] = 30.0
    """Seconds an answer held back by the client may go without its buffer shrinking."""
    max_connections: ClassVar[int | None] = 1024
    """Most connections open at once (None: no bound)."""
    stoppable: ClassVar[Stoppable | None] = None
    """Told once uvicorn begins to shut down (the app's service), if any."""

    _header_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None
    _send_timer: asyncio.TimerHandle | None = None
    _send_buffered = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limit = self.max_connections
        if limit is not None and len(self.connections) > limit:
            _refusals.warning("refused a connection: %d are open (max_connections)", limit)
            self.transport.write(_TOO_MANY)
            self.transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first bytes of a request: its headers are timed from now
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # the headers are in; the app takes over
        self._time_the_body()

    def _time_the_body(self) -> None:
        """A request whose headers are in and whose body is not has ``body_timeout``."""
        if self.conn.their_state is h11.SEND_BODY:
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(self.body_timeout, self._body_too_slow)
        else:
            self._stop_body_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_sending()  # (a "Connection: close" answer is closing now, still buffered)
        # A pipelined request uvicorn took from its buffer here, not in data_received:
        # its body is timed from now (eighteenth red-team round's review).
        self._time_the_body()
        # A pipelined request already (partly) buffered is timed from now.
        if (
            not self.transport.is_closing()
            and self.conn.their_state is h11.IDLE
            and self.conn.trailing_data[0]
        ):
            self._arm()

    def shutdown(self) -> None:
        """uvicorn begins its graceful shutdown: the app hears of it first (queued and
        new requests are refused at once), then the connection closes when idle."""
        if self.stoppable is not None:
            self.stoppable.begin_shutdown()
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_body_timer()
        self._stop_send_timer()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The answer is buffered past the high-water mark: it must keep leaving."""
        super().pause_writing()
        self._watch_sending()

    def timeout_keep_alive_handler(self) -> None:
        super().timeout_keep_alive_handler()
        self._watch_sending()  # closing waits for what is buffered: it must leave too

    def resume_writing(self) -> None:
        super().resume_writing()
        self._watch_sending()

    def _watch_sending(self) -> None:
        """While anything of an answer is buffered (the response complete or not, the
        transport closing or not), check every ``send_timeout`` that it shrinks. A watch
        already running goes on unless more is buffered now than it started from (a
        next answer on the connection): then it starts again from there."""
        if self.transport.get_write_buffer_size() == 0:
            return  # nothing held here (what the kernel holds, it sends or drops itself)
        buffered = self._unsent()
        if self._send_timer is not None and buffered <= self._send_buffered:
            return
        self._stop_send_timer()
        self._send_buffered = buffered
        self._send_timer = self.loop.call_later(self.send_timeout, self._check_sending)

    def _unsent(self) -> int:
        """Bytes of answers not sent yet: the transport's buffer and the socket's queue.

        Why the queue too: the kernel says a socket is writable again only once a good
        part of its send buffer is free (megabytes, autotuned), so a client reading
        steadily left the transport's buffer unchanged for seconds, and was dropped."""
        unsent = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        try:
            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, bytes(4))  # SIOCOUTQ
            unsent += int.from_bytes(queued, sys.byteorder, signed=True)
        except (AttributeError, OSError, ValueError):
            pass
        return unsent

    def _check_sending(self) -> None:
        self._send_timer = None
        if self.transport.get_write_buffer_size() == 0:
            return  # all of it left here: watched again if more is held back
        buffered = self._unsent()
        if buffered < self._send_buffered:  # the client reads, however slowly
            self._send_buffered = buffered
            self._send_timer = self.loop.call_later(self.send_timeout, self._check_sending)
            return
        log.warning(
            "dropped a connection whose client stopped reading its answer for %.0f s "
            "(%d bytes held)",
            self.send_timeout,
            buffered,
        )
        self.transport.abort()  # close() would wait to send what it holds

    def _stop_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _stop_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_too_slow(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        log.warning("closed a connection whose request body took over %.0f s", self.body_timeout)
        if self.conn.our_state is h11.SEND_RESPONSE:  # the app has not answered yet
            self.transport.write(_BODY_TIMED_OUT)
        self.transport.close()

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.our_state is h11.IDLE:  # not in the middle of an answer
            self.transport.write(_TIMED_OUT)
        self.transport.close()


def guarded_protocol(
    settings: ServerSettings, stoppable: Stoppable | None = None
) -> type[GuardedH11Protocol]:
    """``GuardedH11Protocol`` with ``settings``' timeouts and connection bound, telling
    ``stoppable`` when the server begins to shut down."""
    return type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {
            "header_timeout": settings.header_timeout,
            "body_timeout": settings.body_timeout,
            "send_timeout": settings.send_timeout,
            "max_connections": settings.max_connections,
            "stoppable": stoppable,
        },
    )


def uvicorn_config(app: Any, **options: Any) -> uvicorn.Config:
    """A ``uvicorn.Config`` serving ``app`` over ``GuardedH11Protocol``.

    ``app`` is one ``create_app`` built (its settings are read from it); any
    other ASGI app gets the default settings. ``options`` go to
    ``uvicorn.Config`` (``host``, ``port``, ``log_level``, ...); ``http`` and
    ``ws`` are set here, and ``proxy_headers`` is off unless given (an embedder
    behind its own proxy may pass ``proxy_headers=True, forwarded_allow_ips=...``).
    The app's service hears when a shutdown begins (``GuardedH11Protocol.shutdown``).
    """
    service = getattr(getattr(app, "state", None), "service", None)
    settings = getattr(service, "settings", None)
    if not isinstance(settings, ServerSettings):
        settings = ServerSettings()
    stoppable = service if callable(getattr(service, "begin_shutdown", None)) else None
    options.setdefault("proxy_headers", False)
    config = uvicorn.Config(app, http=guarded_protocol(settings, stoppable), ws="none", **options)
    redact_session_ids()  # (after the Config: it configures uvicorn's loggers)
    return config
