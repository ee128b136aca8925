"""Host side of the agent protocol, carried over Docker's attach stream.

Two layers, both pure parsers so they are unit-testable without Docker:
Docker multiplexes a non-TTY attach stream into 8-byte-headed records
(stream id, size), and inside the stdout records the agent speaks
length-prefixed JSON frames. ``AgentChannel`` carries them over the socket,
on whichever event loop is waiting for a frame.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
import weakref
from collections import deque
from typing import Any

from retool_exec._output import TailBuffer
from retool_exec.backends.docker.agent import wire

__all__ = ["AgentChannel", "FrameDecoder", "ProtocolError", "StreamDemuxer", "encode_frame"]

MAX_FRAME = wire.MAX_FRAME
_DOCKER_HEADER = struct.Struct(">BxxxI")
STDOUT, STDERR = 1, 2


class ProtocolError(Exception):
    """The agent's stream broke the protocol (or ended): the container is unusable."""


def encode_frame(message: dict[str, Any]) -> bytes:
    """A length-prefixed JSON frame (``wire.encode_frame``), as a ProtocolError when too large."""
    try:
        return wire.encode_frame(message)
    except wire.WireError as exc:
        raise ProtocolError(str(exc)) from exc


class StreamDemuxer:
    """Splits Docker's multiplexed attach stream into (stream id, payload) records."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        records = []
        while len(self._buf) >= _DOCKER_HEADER.size:
            stream, size = _DOCKER_HEADER.unpack_from(self._buf)
            end = _DOCKER_HEADER.size + size
            if len(self._buf) < end:
                break
            records.append((stream, bytes(self._buf[_DOCKER_HEADER.size : end])))
            del self._buf[:end]
        return records


class FrameDecoder:
    """Turns the agent's stdout bytes into JSON messages (``wire.FrameDecoder``)."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._decoder = wire.FrameDecoder(max_frame)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        try:
            return self._decoder.feed(data)
        except wire.WireError as exc:
            raise ProtocolError(f"agent {exc}") from exc


class AgentChannel:
    """Send frames to and receive frames from one container's agent, on any event loop.

    The attach socket is non-blocking and read only while its owner waits for
    a frame (``receive``) or asks what has come (``poll``), on the owner's own
    event loop: a call awaited on a training loop reads its result there, with
    no hop to another thread, and an idle container's frames (its reset
    confirmation) wait in the socket until the next call takes it, instead of
    waking a loop of their own. One owner at a time (a call, the pool, a
    session); ``close`` may come from any thread.
    """

    READ_SIZE = 1 << 18

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._fd = sock.fileno()
        self._demux = StreamDemuxer()
        self._frames = FrameDecoder()
        self._pending: deque[dict[str, Any]] = deque()
        self._ended: str | None = None  # why no more frames can come, once that is so
        self._lock = threading.Lock()  # a wait's registration against close()
        # Weakly: a loop dropped in a wait must stay collectable (``_handoff.collect_stalled``).
        self._waiting: (
            tuple[weakref.ref[asyncio.AbstractEventLoop], weakref.ref[asyncio.Future[None]]] | None
        ) = None
        self._closed = False
        self.agent_stderr = TailBuffer(4096)

    async def send(self, message: dict[str, Any], timeout: float | None = None) -> None:
        """Write one frame; TimeoutError when the agent has not taken it in ``timeout`` s."""
        view = memoryview(encode_frame(message))
        deadline = None if timeout is None else time.monotonic() + timeout
        while view:
            if self._ended is not None:
                raise ProtocolError(f"cannot write to the agent: {self._ended}")
            try:
                sent = self._sock.send(view)
            except (BlockingIOError, InterruptedError):
                await self._ready(deadline, writing=True)
                continue
            except OSError as exc:
                self._end(f"cannot write to the agent: {exc}")
                raise ProtocolError(f"cannot write to the agent: {exc}") from exc
            view = view[sent:]

    async def receive(self, timeout: float | None = None) -> dict[str, Any]:
        """The next frame; TimeoutError after ``timeout`` seconds, ProtocolError once the
        stream has ended or broken the protocol (frames already parsed come first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._pending:
            if self._ended is not None:
                raise ProtocolError(self._ended)
            if not self._read_available():
                await self._ready(deadline, writing=False)
        return self._pending.popleft()

    def poll(self) -> bool:
        """Read what has arrived, without waiting: whether a frame is ready or the stream ended."""
        if not self._pending and self._ended is None:
            self._read_available()
        return bool(self._pending) or self._ended is not None

    def at_eof(self) -> bool:
        """Whether the stream has ended (the container is gone) with no frame left to read."""
        return not self._pending and self._ended is not None

    def close(self) -> None:
        """Close the socket (from any thread); a wait in progress ends with ProtocolError."""
        with self._lock:
            self._end("the channel was closed")
            self._closed = True
            if self._waiting is None:
                self._sock.close()
                return
            loop, waiter = self._waiting[0](), self._waiting[1]()
        if loop is not None and waiter is not None:
            try:
                loop.call_soon_threadsafe(_wake, waiter)  # its wait closes the socket at its end
                return
            except RuntimeError:  # that loop is closed
                pass
        with self._lock:  # the wait never resumes: the socket closes now
            self._waiting = None
            self._sock.close()

    def _read_available(self) -> bool:
        """Read until a frame is parsed or nothing more has come; False if nothing came."""
        got = False
        while self._ended is None and not self._pending:
            try:
                data = self._sock.recv(self.READ_SIZE)
            except (BlockingIOError, InterruptedError):
                return got
            except OSError as exc:
                self._end(f"cannot read from the agent: {exc}{self._stderr_hint()}")
                return True
            got = True
            if not data:
                self._end(f"the agent's stream ended{self._stderr_hint()}")
                return True
            try:
                for stream, payload in self._demux.feed(data):
                    if stream == STDOUT:
                        self._pending.extend(self._frames.feed(payload))
                    elif stream == STDERR:
                        self.agent_stderr.feed(payload)
            except ProtocolError as exc:
                self._end(str(exc))
        return got

    async def _ready(self, deadline: float | None, *, writing: bool) -> None:
        """Wait, on the running loop, until the socket can be read (or written) or
        ``deadline`` (TimeoutError) or ``close()``."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._closed:
                raise ProtocolError(self._ended or "the channel was closed")
            if writing:
                loop.add_writer(self._fd, _wake, waiter)
            else:
                loop.add_reader(self._fd, _wake, waiter)
            self._waiting = (weakref.ref(loop), weakref.ref(waiter))
        timer = None
        if deadline is not None:
            timer = loop.call_later(max(0.0, deadline - time.monotonic()), _expire, waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            with self._lock:
                self._waiting = None
                if writing:
                    loop.remove_writer(self._fd)
                else:
                    loop.remove_reader(self._fd)
                if self._closed:
                    self._sock.close()

    def _end(self, reason: str) -> None:
        if self._ended is None:
            self._ended = reason

    def _stderr_hint(self) -> str:
        text = self.agent_stderr.raw.decode("utf-8", errors="replace").strip()
        return f" (agent stderr: {text[-500:]})" if text else ""


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
