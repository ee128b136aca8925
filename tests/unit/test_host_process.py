"""``host_process``: what the host reads of a process to tell an agent waiting for its
next request (an answer in Docker's stream) from one that is busy, stopped or gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from retool_exec.backends.docker.host_process import (
    READ_SYSCALL,
    has_ended,
    syscall_reads_stdin,
    waits_to_read_stdin,
)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("0 0x0 0x7f00 0x4 0x0 0x0 0x0 0x7ffd 0x7f00", True),
        ("0 0x3 0x7f00 0x4 0x0 0x0 0x0 0x7ffd 0x7f00", False),  # read, another descriptor
        ("7 0x0 0x1 0xffffffff 0x0 0x0 0x0 0x7ffd 0x7f00", False),  # poll
        ("running", False),
        ("-1 0x7ffd 0x7f00", False),  # blocked outside a system call
        ("", False),
        ("zero 0x0", None),
    ],
)
def test_a_syscall_line_reads_as_reading_stdin_only_for_read_on_descriptor_0(
    line: str, expected: bool | None
) -> None:
    assert syscall_reads_stdin(line.split(), 0) is expected


@pytest.fixture()
def reader() -> Iterator[subprocess.Popen[bytes]]:
    """A process blocked reading its standard input, ended whatever the test did."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import os; os.read(0, 1)"], stdin=subprocess.PIPE
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()
        assert process.stdin is not None
        process.stdin.close()


def _until(predicate: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.uname().machine.lower() not in READ_SYSCALL,
    reason="reads Linux's /proc on a machine whose read call it knows",
)
def test_a_process_reads_as_waiting_only_while_it_sleeps_in_read(
    reader: subprocess.Popen[bytes],
) -> None:
    """Stopped in the same call (a signal, a tracer) it answers nothing: not waiting. Gone,
    the host cannot tell."""
    assert _until(lambda: waits_to_read_stdin(reader.pid) is True)
    os.kill(reader.pid, signal.SIGSTOP)
    assert _until(lambda: waits_to_read_stdin(reader.pid) is False)
    os.kill(reader.pid, signal.SIGCONT)
    assert _until(lambda: waits_to_read_stdin(reader.pid) is True)
    reader.kill()
    reader.wait()
    assert waits_to_read_stdin(reader.pid) is None


def test_a_busy_process_is_not_waiting() -> None:
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert waits_to_read_stdin(process.pid) is not True
    finally:
        process.kill()
        process.wait()


def test_a_verdict_docker_does_not_give_in_time_is_no() -> None:
    """At a silent call's deadline the host asks Docker whether the agent answered or the
    container is busy; a daemon stalling the stream may stall those answers too (60 s
    in docker-py): past ``VERDICT_PROBE_BUDGET`` the answer is no."""
    import asyncio

    from retool_exec.backends.docker import backend

    async def stalled() -> bool:
        await asyncio.sleep(30)
        return True

    async def prompt() -> bool:
        return True

    async def both() -> tuple[bool, bool, float]:
        began = time.monotonic()
        late = await backend._answered_within(stalled(), 0.2, False)
        return late, await backend._answered_within(prompt(), 0.2, False), time.monotonic() - began

    late, on_time, took = asyncio.run(both())
    assert (late, on_time) == (False, True)
    assert took < 5


def test_a_zombie_has_ended_and_a_live_or_unseen_process_has_not() -> None:
    """A dying gVisor sandbox showed as a zombie while Docker still had it running: the
    host then reads its container as stopped (thirty-fifth session's review)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])  # not reaped until waited
    try:
        give_up = time.monotonic() + 10
        while not has_ended(child.pid) and time.monotonic() < give_up:
            time.sleep(0.01)
        assert has_ended(child.pid)
        assert not has_ended(os.getpid())
    finally:
        child.wait()
    assert not has_ended(child.pid)  # reaped: not in view, Docker's word stands
