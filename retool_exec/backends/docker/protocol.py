"""Host side of the agent protocol, carried over Docker's attach stream.

Two layers, both pure parsers so they are unit-testable without Docker:
Docker multiplexes a non-TTY attach stream into 8-byte-headed records
(stream id, size), and inside the stdout records the agent speaks
length-prefixed JSON frames. ``AgentChannel`` puts them on asyncio streams.
"""

from __future__ import annotations

import asyncio
import struct
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
    """Send frames to and receive frames from one container's agent."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._demux = StreamDemuxer()
        self._frames = FrameDecoder()
        self._pending: deque[dict[str, Any]] = deque()
        self.agent_stderr = TailBuffer(4096)

    async def send(self, message: dict[str, Any]) -> None:
        try:
            self._writer.write(encode_frame(message))
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise ProtocolError(f"cannot write to the agent: {exc}") from exc

    async def receive(self) -> dict[str, Any]:
        while not self._pending:
            try:
                data = await self._reader.read(1 << 16)
            except (ConnectionError, OSError) as exc:
                raise ProtocolError(f"cannot read from the agent: {exc}") from exc
            if not data:
                raise ProtocolError(f"the agent's stream ended{self._stderr_hint()}")
            for stream, payload in self._demux.feed(data):
                if stream == STDOUT:
                    self._pending.extend(self._frames.feed(payload))
                elif stream == STDERR:
                    self.agent_stderr.feed(payload)
        return self._pending.popleft()

    def at_eof(self) -> bool:
        """Whether the stream has ended (the container is gone) with no frame left to read."""
        return not self._pending and self._reader.at_eof()

    def _stderr_hint(self) -> str:
        text = self.agent_stderr.raw.decode("utf-8", errors="replace").strip()
        return f" (agent stderr: {text[-500:]})" if text else ""

    def close(self) -> None:
        self._writer.close()
