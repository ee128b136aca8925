"""AgentChannel over a socket pair: frames read on whichever loop waits (no Docker)."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from retool_exec._portal import LoopThread
from retool_exec.backends.docker.agent import wire
from retool_exec.backends.docker.backend import _asked_while_listening
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


async def _slow_no(seconds: float) -> bool:
    await asyncio.sleep(seconds)
    return False


def test_an_answer_that_comes_while_a_silent_agent_is_judged_is_the_answer(pair: Pair) -> None:
    """A verdict on a silent agent takes a while on a loaded host (2.3 s seen); the cell's
    answer came meanwhile, unread, and the verdict made it the sandbox's failure (a CI
    run of the thirty-fifth session). The frame wins over the verdict."""
    channel, agent = pair
    timer = threading.Timer(0.2, agent.sendall, (frame({"type": "result", "id": 1}),))
    timer.start()
    try:
        got = asyncio.run(_asked_while_listening(channel, _slow_no(5)))
    finally:
        timer.cancel()
    assert got == {"type": "result", "id": 1}


def test_without_an_answer_the_verdict_stands_and_the_stream_stays_whole(pair: Pair) -> None:
    """No frame: the verdict; half a frame that came meanwhile is kept for the next read,
    on the same loop. The listen, cancelled but still unwinding, removed the reader the
    next read had set, and that read never woke: an answer held in a stalled stream
    went unread once delivered (the thirty-fifth session's first version)."""
    channel, agent = pair
    whole = frame({"type": "result", "id": 2})
    agent.sendall(whole[:7])

    async def judged_then_read() -> tuple[object, dict[str, object]]:
        verdict = await _asked_while_listening(channel, _slow_no(0.2))
        threading.Timer(0.2, agent.sendall, (whole[7:],)).start()
        return verdict, await channel.receive(timeout=2)

    assert asyncio.run(judged_then_read()) == (False, {"type": "result", "id": 2})


def test_a_stream_that_ends_while_a_silent_agent_is_judged_ends_the_question(
    pair: Pair,
) -> None:
    """The end is judged as any stream's end (memory, the task limit): the verdict asked
    of a container that was stopping could still read it running (the review)."""
    channel, agent = pair
    agent.close()

    async def judged() -> tuple[float, BaseException | None]:
        began = time.monotonic()
        try:
            await _asked_while_listening(channel, _slow_no(5))
        except ProtocolError as exc:
            return time.monotonic() - began, exc
        return time.monotonic() - began, None

    took, raised = asyncio.run(judged())
    assert isinstance(raised, ProtocolError) and took < 4, (took, raised)
