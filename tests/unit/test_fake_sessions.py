"""Sessions on the fake backend: what a user's test of session code can rely on."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from retool_exec import ExecResult, FakeBackend, Outcome, RunRequest, Sandbox, SessionLimitError
from retool_exec._errors import SessionLostError
from retool_exec.backends.fake import FakeCell, FakeSession


def echo_history(cell: FakeCell) -> str:
    """Answers with what the session has run before this cell, one line each."""
    return "".join(f"{code}\n" for code in cell.history)


def test_a_cell_goes_to_the_session_handler_with_its_history() -> None:
    backend = FakeBackend(session_handler=echo_history)
    with Sandbox(backend) as sandbox, sandbox.session() as session:
        first = session.run_code("x = 1")
        second = session.run_code("print(x)", timeout=3)
        assert (first.ok, first.stdout, first.outcome) == (True, "", Outcome.SUCCESS)
        assert second.stdout == "x = 1\n"
        assert [cell.stdout for cell in second.cells] == ["x = 1\n"]
        assert second.cells[0].finished
    [one, two] = backend.cells
    assert (one.session, one.code, one.history, one.index, one.parent) == (1, "x = 1", (), 0, None)
    assert (two.code, two.timeout, two.history, two.index) == ("print(x)", 3, ("x = 1",), 1)
    assert backend.requests == []


def test_a_fork_starts_from_its_parents_history_and_then_diverges() -> None:
    backend = FakeBackend(session_handler=echo_history)
    with Sandbox(backend) as sandbox, sandbox.session() as session:
        session.run_code("a = 1")
        with session.fork() as branch:
            session.run_code("b = 'parent'")
            branch.run_code("b = 'branch'")
            assert branch.run_code("b").stdout == "a = 1\nb = 'branch'\n"
            assert session.run_code("b").stdout == "a = 1\nb = 'parent'\n"
    parent, child = backend.sessions
    assert (parent.id, parent.parent, child.id, child.parent) == (1, None, 2, 1)
    assert child.history == ("a = 1", "b = 'branch'", "b")
    assert [cell.session for cell in backend.cells] == [1, 1, 2, 2, 1]
    assert all(cell.parent == 1 for cell in backend.cells if cell.session == 2)


def test_without_a_session_handler_cells_go_to_the_handler_as_requests() -> None:
    seen: list[RunRequest] = []

    def handler(request: RunRequest) -> str:
        seen.append(request)
        return f"ran {request.code}\n"

    backend = FakeBackend(handler)
    with Sandbox(backend) as sandbox, sandbox.session() as session:
        assert session.run_code("1 + 1", timeout=2).stdout == "ran 1 + 1\n"
    assert [(request.code, request.timeout, request.cells) for request in seen] == [
        ("1 + 1", 2, ())
    ]
    assert backend.requests == []  # ``requests`` is for run(); session cells are in ``cells``


def test_a_result_can_say_the_session_was_lost() -> None:
    def handler(cell: FakeCell) -> ExecResult | str:
        if "os._exit" in cell.code:
            return ExecResult(
                ok=False,
                stdout="",
                stderr="",
                returncode=3,
                timed_out=False,
                latency=0.0,
                detail="session lost: the session's interpreter exited (status 3)",
            )
        return ""

    with Sandbox(FakeBackend(session_handler=handler)) as sandbox:
        session = sandbox.open_session()
        result = session.run_code("import os; os._exit(3)")
        assert (result.returncode, result.outcome) == (3, Outcome.ERROR)
        assert session.lost == "the session's interpreter exited (status 3)"
        with pytest.raises(SessionLostError, match="exited"):
            session.run_code("1")
        with pytest.raises(SessionLostError):
            session.fork()


def test_close_ends_a_session_and_its_forks_live_on() -> None:
    backend = FakeBackend()
    with Sandbox(backend) as sandbox:
        session = sandbox.open_session()
        branch = session.fork()
        session.close()
        assert session.closed and session.lost is not None
        with pytest.raises(SessionLostError):
            session.run_code("1")
        with pytest.raises(SessionLostError):
            session.fork()
        assert branch.run_code("1").ok
    assert branch.closed  # the Sandbox closed what was left open
    assert all(fake.closed for fake in backend.sessions)


def test_the_sandboxs_limits_apply() -> None:
    with Sandbox(FakeBackend(), max_sessions=1) as sandbox:
        session = sandbox.open_session()
        with pytest.raises(SessionLimitError):
            session.fork()
        with pytest.raises(SessionLimitError):
            sandbox.open_session()


def test_the_async_api_and_an_async_handler() -> None:
    async def slow(cell: FakeCell) -> str:
        await asyncio.sleep(0.01)
        return f"{cell.session}:{cell.index}\n"

    backend = FakeBackend(session_handler=slow)

    async def scenario() -> list[str]:
        async with Sandbox(backend) as sandbox, sandbox.session() as session:
            await session.arun_code("a")
            branch = await session.afork()
            results = await asyncio.gather(session.arun_code("b"), branch.arun_code("c"))
            await branch.aclose()
            return [result.stdout for result in results]

    assert asyncio.run(scenario()) == ["1:1\n", "2:1\n"]


def test_the_backend_alone_closes_its_sessions() -> None:
    async def scenario() -> FakeSession:
        async with FakeBackend() as backend:
            session = await backend.open_session()
            await session.run("x = 1", 5)
            return session

    session = asyncio.run(scenario())
    assert session.closed
    with pytest.raises(SessionLostError):
        asyncio.run(session.run("x", 5))


def test_a_fake_from_config_answers_session_cells_with_its_values() -> None:
    with Sandbox("fake") as sandbox, sandbox.session() as session:
        result = session.run_code("anything")
        assert (result.ok, result.stdout) == (True, "")


def test_a_cells_value_in_the_observation_is_bounded_like_a_stream() -> None:
    """The agent keeps up to 64 KiB of a value; the observation shows its head, at most
    ``max_output_chars``, and how much was left out (the sixth red-team round)."""
    from retool_exec import CellResult

    def handler(cell: FakeCell) -> ExecResult | str:
        value = "A" * 65_536 if "big" in cell.code else "42"
        return ExecResult(
            ok=True,
            stdout="printed\n",
            stderr="",
            returncode=0,
            timed_out=False,
            latency=0.0,
            cells=[CellResult(finished=True, display=[{"text/plain": value}])],
        )

    with Sandbox(FakeBackend(session_handler=handler)) as sandbox, sandbox.session() as session:
        small = session.format_tool_content(session.run_code("x"))
        big_result = session.run_code("big")
        big = session.format_tool_content(big_result)
        value = session.value_text(big_result)
    assert "printed\n42\n" in small
    assert value == "[... truncated 61440 chars ...]\n" + "A" * 4096
    assert value + "\n" in big and len(big) < 4096 + 200


INTERRUPTED_AS_THE_SESSION_OPENS = """
import os, signal, time
from retool_exec import FakeBackend, Sandbox

class InterruptedAsItOpens(FakeBackend):
    async def open_session(self, *, memory_mb=None):
        session = await super().open_session(memory_mb=memory_mb)
        os.kill(os.getpid(), signal.SIGINT)  # the caller's Ctrl-C, as the session is made
        return session

interrupted, kept = 0, []
with Sandbox(InterruptedAsItOpens(), max_sessions=100) as sandbox:
    for _ in range(20):
        try:
            # (append, a C call, keeps a session handed over before Python next looks for
            # signals: a bare expression statement would drop it in this frame)
            kept.append(sandbox.open_session())
        except KeyboardInterrupt:
            interrupted += 1
    for session in kept:
        session.close()
    deadline = time.monotonic() + 10
    while sandbox.open_sessions and time.monotonic() < deadline:
        time.sleep(0.05)
    print(interrupted, sandbox.open_sessions)
"""


def test_a_session_made_as_its_sync_caller_is_interrupted_is_closed() -> None:
    """Ctrl-C landing as ``open_session()`` finished dropped the session, still open and
    counted against ``max_sessions`` (20 of 20 here; red team D, the thirty-sixth round).
    Its own process: the test sends SIGINT."""
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_AS_THE_SESSION_OPENS],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    interrupted, left_open = map(int, done.stdout.split())
    assert interrupted >= 10, "too few interrupts landed: the test proves little"
    assert left_open == 0, (interrupted, left_open)
