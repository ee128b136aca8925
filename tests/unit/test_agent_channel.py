"""AgentChannel over a socket pair: frames read on whichever loop waits (no Docker)."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from retool_exec._portal import LoopThread
from retool_exec.backends.docker.agent import wire
from retool_exec.backends.docker.protocol import AgentChannel, ProtocolError

Pair = tuple[AgentChannel, socket.socket]


def record(payload: bytes, stream: int = 1) -> bytes:
    """One record of Docker's multiplexed attach stream."""
    return struct.pack(">BxxxI", stream, len(payload)) + payload


def frame(message: dict[str, object]) -> bytes:
    return record(wire.encode_frame(message))


@pytest.fixture
def pair() -> Iterator[Pair]:
    ours, agent = socket.socketpair()
    channel = AgentChannel(ours)
    yield channel, agent
    channel.close()
    agent.close()


def test_a_frame_already_in_the_socket_is_read_without_waiting(pair: Pair) -> None:
    channel, agent = pair
    agent.sendall(frame({"type": "reset", "clean": True}))

    async def main() -> dict[str, object]:
        return await channel.receive(timeout=0)

    assert asyncio.run(main()) == {"type": "reset", "clean": True}


def test_nothing_is_read_until_asked(pair: Pair) -> None:
    """An idle channel's frames wait in the socket: no loop is woken for them."""
    channel, agent = pair
    agent.sendall(frame({"type": "reset"}))
    assert channel._pending == type(channel._pending)()
    assert channel.poll()
    assert list(channel._pending) == [{"type": "reset"}]


def test_frames_are_read_on_the_loop_of_each_waiter(pair: Pair) -> None:
    """One call waits on a private loop, the next on asyncio.run's: both get their frame."""
    channel, agent = pair
    portal = LoopThread(name="test-channel")
    try:
        first = portal.submit(channel.receive(timeout=5))
        agent.sendall(frame({"type": "x", "n": 1}))
        assert first.result(5) == {"type": "x", "n": 1}

        async def second() -> dict[str, object]:
            agent.sendall(frame({"type": "x", "n": 2}))
            return await channel.receive(timeout=5)

        assert asyncio.run(second()) == {"type": "x", "n": 2}
    finally:
        portal.stop()


def test_a_frame_split_across_records_and_stderr_between(pair: Pair) -> None:
    channel, agent = pair
    data = wire.encode_frame({"type": "result", "stdout": "x" * 1000})
    agent.sendall(record(data[:10]) + record(b"agent says\n", 2) + record(data[10:]))

    async def main() -> dict[str, object]:
        return await channel.receive(timeout=5)

    assert asyncio.run(main())["stdout"] == "x" * 1000
    assert b"agent says" in channel.agent_stderr.raw


def test_silence_past_the_timeout_is_a_timeout(pair: Pair) -> None:
    channel, _ = pair

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await channel.receive(timeout=0.05)

    asyncio.run(main())


def test_the_end_of_the_stream_is_a_protocol_error_after_the_frames_before_it(
    pair: Pair,
) -> None:
    channel, agent = pair
    agent.sendall(frame({"type": "x", "n": 1}) + record(b"dying\n", 2))
    agent.close()

    async def main() -> None:
        assert await channel.receive(timeout=5) == {"type": "x", "n": 1}
        with pytest.raises(ProtocolError, match=r"ended.*dying"):
            await channel.receive(timeout=5)

    asyncio.run(main())
    assert channel.at_eof()


def test_a_broken_frame_ends_the_channel(pair: Pair) -> None:
    channel, agent = pair
    agent.sendall(record((wire.MAX_FRAME + 1).to_bytes(4, "big")))

    async def main() -> None:
        with pytest.raises(ProtocolError):
            await channel.receive(timeout=5)

    asyncio.run(main())


def test_close_from_another_thread_ends_a_wait_at_once(pair: Pair) -> None:
    channel, _ = pair

    async def main() -> None:
        threading.Timer(0.05, channel.close).start()
        with pytest.raises(ProtocolError, match="closed"):
            await channel.receive(timeout=10)

    asyncio.run(main())
    assert channel._sock.fileno() == -1, "the socket is closed once the wait let go of it"


def test_a_frame_larger_than_the_socket_buffer_is_sent_whole(pair: Pair) -> None:
    channel, agent = pair
    code = "x" * (8 << 20)
    received = bytearray()

    def drain() -> None:
        agent.settimeout(10)
        while len(received) < len(code):
            received.extend(agent.recv(1 << 20))

    reader = threading.Thread(target=drain)
    reader.start()

    async def main() -> None:
        await channel.send({"type": "run", "code": code}, timeout=10)

    asyncio.run(main())
    reader.join(10)
    decoded = wire.FrameDecoder(wire.MAX_FRAME).feed(bytes(received))
    assert decoded == [{"type": "run", "code": code}]


def test_a_send_the_agent_never_reads_times_out(pair: Pair) -> None:
    channel, _ = pair

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await channel.send({"type": "run", "code": "x" * (8 << 20)}, timeout=0.1)

    asyncio.run(main())


def test_cancelling_a_wait_unregisters_the_socket(pair: Pair) -> None:
    channel, agent = pair

    async def main() -> None:
        task = asyncio.create_task(channel.receive())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        loop = asyncio.get_running_loop()
        assert not loop.remove_reader(channel._fd), "the reader was left registered"
        agent.sendall(frame({"type": "x", "n": 3}))
        assert await channel.receive(timeout=5) == {"type": "x", "n": 3}

    asyncio.run(main())
