"""Multi-turn adapters on the fake backend: TRL's environment shape, verl's tool interface,
branching. A fake session's cell answers with its line's history, so state is exact.

verl is not installed here: ``AgentData`` and ``call_tool`` below do what verl's
``ToolAgentLoop`` does around every tool call (``create``, ``execute`` with its
``agent_data``, ``release``), and ``ToolListCache``'s deep copy is checked too.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import time
from typing import Any

import pytest

from retool_exec import ExecResult, FakeBackend, Sandbox
from retool_exec.adapters import (
    DEFAULT_TOOL_SCHEMA,
    SessionCodeInterpreter,
    SessionCodeTool,
    ToolSchema,
    arun_branches,
    run_branches,
    session_environment_factory,
)
from retool_exec.backends.fake import FakeCell

LOST = "the session's interpreter exited (status 3)"


def history(cell: FakeCell) -> ExecResult | str:
    """Each cell prints its line so far; ``exit`` ends the interpreter."""
    if cell.code == "exit":
        return ExecResult(False, "", "", 3, False, 0.01, detail=f"session lost: {LOST}")
    return ",".join((*cell.history, cell.code)) + "\n"


@pytest.fixture()
def sandbox() -> Any:
    with Sandbox(FakeBackend(session_handler=history), max_sessions=16) as box:
        yield box


# -- TRL: SessionCodeInterpreter ------------------------------------------------------------


def test_the_interpreter_keeps_state_until_reset(sandbox: Sandbox) -> None:
    env = SessionCodeInterpreter(sandbox)
    assert sandbox.open_sessions == 0  # nothing until the first call
    assert env.code_interpreter("a") == "a\n"
    assert env.code_interpreter("b") == "a,b\n"
    assert [result.stdout for result in env.results] == ["a\n", "a,b\n"]
    env.reset(prompt="ignored", answer="42")
    assert sandbox.open_sessions == 0
    assert env.results == []
    assert env.code_interpreter("c") == "c\n"
    with env:
        pass
    assert sandbox.open_sessions == 0


def test_the_interpreter_has_exactly_trls_tool_surface(sandbox: Sandbox) -> None:
    env = SessionCodeInterpreter(sandbox)
    public = {
        name for name in dir(env) if not name.startswith("_") and callable(getattr(env, name))
    }
    assert public == {"reset", "code_interpreter"}  # TRL exposes all but reset as tools
    signature = inspect.signature(env.code_interpreter)
    assert list(signature.parameters) == ["code"]
    assert signature.parameters["code"].annotation in (str, "str")
    assert signature.return_annotation in (str, "str")
    doc = inspect.getdoc(env.code_interpreter) or ""
    assert "\nArgs:\n    code: " in doc
    assert "persists between calls" in doc


def test_a_lost_interpreter_is_said_and_replaced(sandbox: Sandbox) -> None:
    env = SessionCodeInterpreter(sandbox)
    env.code_interpreter("a")
    text = env.code_interpreter("exit")
    assert text.endswith(
        f"[the interpreter ended ({LOST}); the next call starts a new one, without the "
        "variables, imports and files of earlier calls]"
    )
    assert env.sessions_lost == 1
    assert sandbox.open_sessions == 0
    assert env.code_interpreter("b") == "b\n"  # a new interpreter: no history


def test_an_interpreter_closed_while_idle_is_said() -> None:
    with Sandbox(FakeBackend(session_handler=history), session_ttl=0.5) as sandbox:
        env = SessionCodeInterpreter(sandbox)
        env.code_interpreter("a")
        deadline = time.monotonic() + 5
        while env.session is not None and env.session.lost is None:
            assert time.monotonic() < deadline, "the idle session was never closed"
            time.sleep(0.05)
        text = env.code_interpreter("b")
        assert text.startswith("b\n")
        assert "[the interpreter of the earlier calls had ended (it was idle" in text
        assert env.sessions_lost == 1


def test_the_environment_factory_makes_independent_interpreters(sandbox: Sandbox) -> None:
    factory = session_environment_factory(sandbox, timeout=5.0)
    first, second = factory(), factory()
    assert first is not second
    first.code_interpreter("x")
    assert second.code_interpreter("y") == "y\n"
    assert first.code_interpreter("z") == "x,z\n"
    assert first.timeout == 5.0
    first.reset()
    second.reset()


# -- verl: SessionCodeTool -----------------------------------------------------------------


class AgentData:
    """The part of verl's ``AgentData`` a tool sees: the trajectory's ``request_id``."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id


async def call_tool(tool: SessionCodeTool, code: str, agent_data: AgentData) -> str:
    """What verl's ``ToolAgentLoop._call_tool`` does for each call."""
    instance_id, _ = await tool.create(create_kwargs={})
    try:
        response, reward, metrics = await tool.execute(
            instance_id, {"code": code}, agent_data=agent_data
        )
    finally:
        await tool.release(instance_id)
    assert reward is None
    assert set(metrics) == {"outcome", "latency", "session_lost"}
    text: str = response.text
    return text


def test_verls_agent_loop_gets_one_session_per_trajectory(sandbox: Sandbox) -> None:
    tool = SessionCodeTool({"type": "native"}, sandbox=sandbox)

    async def rollouts() -> list[str]:
        one, two = AgentData("r1"), AgentData("r2")
        seen = [
            await call_tool(tool, "a", one),
            await call_tool(tool, "x", two),
            await call_tool(tool, "b", one),
            await call_tool(tool, "y", two),
        ]
        assert tool.open_sessions == 2  # released instances, live trajectories
        await tool.release_trajectory("r1")
        assert tool.open_sessions == 1
        seen.append(await call_tool(tool, "c", one))  # a new trajectory session
        await tool.aclose()
        return seen

    assert asyncio.run(rollouts()) == ["a\n", "x\n", "a,b\n", "x,y\n", "c\n"]
    assert sandbox.open_sessions == 0
    assert not sandbox.closed  # a sandbox passed in stays the caller's


def test_one_instance_per_trajectory_is_closed_by_release(sandbox: Sandbox) -> None:
    tool = SessionCodeTool({}, sandbox=sandbox)

    async def trajectory() -> list[str]:
        instance_id, created = await tool.create("traj-1")
        assert instance_id == "traj-1"
        assert created.text is None
        texts = [(await tool.execute(instance_id, {"code": code}))[0].text for code in "ab"]
        assert await tool.calc_reward(instance_id) == 0.0
        await tool.release(instance_id)
        return texts

    assert asyncio.run(trajectory()) == ["a\n", "a,b\n"]
    assert sandbox.open_sessions == 0


def test_parallel_calls_of_a_trajectory_share_one_session(sandbox: Sandbox) -> None:
    tool = SessionCodeTool({}, sandbox=sandbox)

    async def parallel() -> list[str]:
        data = AgentData("r")
        texts = await asyncio.gather(*(call_tool(tool, code, data) for code in "abc"))
        await tool.aclose()
        return list(texts)

    texts = asyncio.run(parallel())
    assert sorted(len(text.split(",")) for text in texts) == [1, 2, 3]  # one line of cells


def test_a_lost_session_is_said_and_the_next_call_starts_anew(sandbox: Sandbox) -> None:
    tool = SessionCodeTool({}, sandbox=sandbox)

    async def calls() -> list[str]:
        data = AgentData("r")
        texts = [await call_tool(tool, code, data) for code in ("a", "exit", "b")]
        await tool.aclose()
        return texts

    first, lost, fresh = asyncio.run(calls())
    assert first == "a\n"
    assert "[the interpreter ended (" in lost
    assert fresh == "b\n"


async def slow_history(cell: FakeCell) -> ExecResult | str:
    """``history``, after a pause for a cell that says ``slow``."""
    if cell.code == "slow":
        await asyncio.sleep(0.5)
    return history(cell)


def test_finished_trajectories_make_room_for_the_next_batch() -> None:
    """verl never says a trajectory is over: the sessions of one batch held
    ``max_sessions`` until their idle time ran out, and the next batch's correct code
    got an exception for its observation (red team, the thirty-sixth round). The least
    recently used idle session makes room; its trajectory's next call says so."""
    with Sandbox(FakeBackend(session_handler=history), max_sessions=2) as box:
        tool = SessionCodeTool({}, sandbox=box)

        async def batches() -> list[str]:
            first = [await call_tool(tool, "a", AgentData(f"old-{n}")) for n in range(2)]
            second = [await call_tool(tool, "b", AgentData(f"new-{n}")) for n in range(2)]
            again = await call_tool(tool, "c", AgentData("old-0"))
            await tool.aclose()
            return [*first, *second, again]

        *answers, again = asyncio.run(batches())
        assert answers == ["a\n", "a\n", "b\n", "b\n"]
        assert again.startswith("c\n"), again  # a new interpreter, and it says so
        assert "[the interpreter of the earlier calls had ended (closed for a newer" in again
        assert box.open_sessions == 0


def test_a_call_with_no_session_free_is_the_sandboxs_error_not_an_exception() -> None:
    with Sandbox(FakeBackend(session_handler=slow_history), max_sessions=1) as box:
        tool = SessionCodeTool({}, sandbox=box)

        async def at_once() -> list[tuple[str, dict[str, Any]]]:
            async def one(request_id: str, code: str) -> tuple[str, dict[str, Any]]:
                instance_id, _ = await tool.create()
                response, _, metrics = await tool.execute(
                    instance_id, {"code": code}, agent_data=AgentData(request_id)
                )
                await tool.release(instance_id)
                return response.text, metrics

            busy = asyncio.ensure_future(one("busy", "slow"))
            await asyncio.sleep(0.1)  # its session is open and in use
            refused = await one("late", "a")
            answered = await busy
            await tool.aclose()
            return [answered, refused]

        (answered, _), (refused, metrics) = asyncio.run(at_once())
        assert answered == "slow\n"
        assert refused.startswith("Error: the code did not run: no interpreter is free")
        assert metrics["outcome"] == "sandbox_error"


def test_a_call_without_agent_data_is_warned_about_once(
    sandbox: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    """verl's agent loop before 2025-12-09 passed no ``agent_data``: every call got a new
    interpreter, and nothing said so (red team, the thirty-sixth round)."""
    tool = SessionCodeTool({}, sandbox=sandbox)

    async def old_verl() -> list[str]:
        texts = []
        for code in "ab":
            instance_id, _ = await tool.create(create_kwargs={})
            texts.append((await tool.execute(instance_id, {"code": code}))[0].text)
            await tool.release(instance_id)
        return texts

    with caplog.at_level(logging.WARNING, logger="retool_exec"):
        assert asyncio.run(old_verl()) == ["a\n", "b\n"]
    warnings = [r.getMessage() for r in caplog.records if "agent_data" in r.getMessage()]
    assert len(warnings) == 1, warnings


def test_the_default_schema_is_verls_shape(sandbox: Sandbox) -> None:
    tool = SessionCodeTool({}, sandbox=sandbox)
    assert tool.name == "code_interpreter"
    assert tool.get_openai_tool_schema() is tool.tool_schema
    dumped = tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
    assert dumped == DEFAULT_TOOL_SCHEMA
    custom = ToolSchema.model_validate(
        {"type": "function", "function": {"name": "python", "description": "Run code."}}
    )
    assert SessionCodeTool({}, custom, sandbox=sandbox).name == "python"


def test_the_tool_builds_its_own_sandbox_from_the_config(caplog: Any) -> None:
    config = {
        "type": "native",
        "backend": "fake",
        "backend_config": {"stdout": "hi\n"},
        "timeout": 7,
        "max_sessions": 3,
        "session_ttl": 60,
        "rate_limit": 10,
    }
    with caplog.at_level(logging.WARNING, logger="retool_exec.adapters"):
        tool = SessionCodeTool(config)
    assert "ignores config keys rate_limit" in caplog.text

    async def use() -> str:
        instance_id, _ = await tool.create()
        response, _, _ = await tool.execute(instance_id, {"code": "anything"})
        sandbox = tool.sandbox
        assert (sandbox.max_sessions, sandbox.session_ttl, sandbox.timeout) == (3, 60.0, 7.0)
        await tool.aclose()
        assert sandbox.closed  # its own sandbox: closed with it
        text: str = response.text
        return text

    assert asyncio.run(use()) == "hi\n"


def test_a_deep_copy_is_an_independent_tool(sandbox: Sandbox) -> None:
    own = SessionCodeTool({"backend": "fake", "backend_config": {"stdout": "x\n"}})
    copied = copy.deepcopy(own)  # verl's ToolListCache hands out deep copies
    assert copied is not own
    assert copied.sandbox is not own.sandbox
    shared = SessionCodeTool({}, sandbox=sandbox)
    assert copy.deepcopy(shared).sandbox is sandbox  # a sandbox passed in is shared
    for tool in (own, copied):
        asyncio.run(tool.aclose())


# -- branching -------------------------------------------------------------------------------


def test_branches_share_the_prefix_and_never_meet(sandbox: Sandbox) -> None:
    outcome = run_branches(sandbox, ["p1", "p2"], ["a", ["b1", "b2"], "c"])
    assert [result.stdout for result in outcome.prefix] == ["p1\n", "p1,p2\n"]
    assert [[result.stdout for result in branch] for branch in outcome.branches] == [
        ["p1,p2,a\n"],
        ["p1,p2,b1\n", "p1,p2,b1,b2\n"],
        ["p1,p2,c\n"],
    ]
    assert sandbox.open_sessions == 0


def test_one_string_of_continuations_is_refused_not_split_into_characters(
    sandbox: Sandbox,
) -> None:
    """``run_branches(sb, "x = 1", "print(x)")`` ran one branch per character, most of them
    a ``NameError`` (thirty-seventh round's new-user pass); ``run_many`` refuses so too."""
    for given in ("print(x)", b"print(x)"):
        with pytest.raises(TypeError, match="not one string"):
            run_branches(sandbox, "x = 1", given)  # type: ignore[arg-type]
    assert sandbox.open_sessions == 0


def test_a_branch_whose_interpreter_ends_stops_there(sandbox: Sandbox) -> None:
    outcome = run_branches(sandbox, "p", [["exit", "never"], ["fine"]])
    assert [len(branch) for branch in outcome.branches] == [1, 1]
    assert outcome.branches[0][0].detail == f"session lost: {LOST}"
    assert outcome.branches[1][0].stdout == "p,fine\n"


def test_concurrency_bounds_the_open_forks() -> None:
    most = 0

    async def slow(cell: FakeCell) -> str:
        nonlocal most
        most = max(most, box.open_sessions)
        await asyncio.sleep(0.01)
        return ""

    with Sandbox(FakeBackend(session_handler=slow)) as box:
        asyncio.run(arun_branches(box, "p", ["a"] * 6, concurrency=2))
        assert most == 3  # the root and two forks
        with pytest.raises(ValueError, match="concurrency"):
            run_branches(box, "p", ["a"], concurrency=0)


def test_trajectories_whose_sessions_ended_by_themselves_are_not_kept() -> None:
    """verl never says a trajectory is over: sessions end when idle past the TTL, and
    the tool kept every one of them in its tables (the sixth red-team round). Now it
    keeps only why they ended, for their next call, and a bounded number of those."""
    from retool_exec import adapters

    with Sandbox(FakeBackend(session_handler=history), session_ttl=0.2) as sandbox:
        tool = SessionCodeTool({}, sandbox=sandbox)

        async def rollouts() -> tuple[int, int, str]:
            for number in range(40):
                await call_tool(tool, "x", AgentData(f"r{number}"))
            deadline = time.monotonic() + 10
            while sandbox.open_sessions and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # (the TTL reaper has no event to wait on)
            again = await call_tool(tool, "y", AgentData("r0"))  # the first trajectory
            kept = len(tool._sessions) + len(tool._opening)
            live = tool.open_sessions
            await tool.aclose()
            return kept, live, again

        kept, live, again = asyncio.run(rollouts())
    assert kept <= 2 and live == 1
    assert "[the interpreter of the earlier calls had ended (it was idle" in again
    assert adapters.ENDED_KEPT >= 1024  # the notes a long run still gives


def test_a_parallel_call_after_one_ended_the_interpreter_gets_an_observation(
    sandbox: Sandbox,
) -> None:
    """The second of two parallel calls of a trajectory, whose first ended the interpreter,
    raised SessionLostError out of ``execute``: no observation, no metrics (the
    twenty-eighth red-team round)."""
    tool = SessionCodeTool({}, sandbox=sandbox)

    async def calls() -> tuple[list[str], str]:
        data = AgentData("r")
        await call_tool(tool, "a", data)
        texts = await asyncio.gather(call_tool(tool, "exit", data), call_tool(tool, "b", data))
        after = await call_tool(tool, "c", data)
        await tool.aclose()
        return list(texts), after

    texts, after = asyncio.run(calls())
    # The other call either met the ended interpreter or, arriving after, ran in a new
    # one: either way its observation says so.
    said = ("[the interpreter ended (", "[the interpreter of the earlier calls had ended (")
    assert all(any(note in text for note in said) for text in texts), texts
    assert after in ("c\n", "b,c\n")  # nothing of the interpreter that ended


def test_arguments_that_are_not_an_object_get_an_observation(sandbox: Sandbox) -> None:
    tool = SessionCodeTool({}, sandbox=sandbox)

    async def call() -> tuple[Any, dict[str, Any]]:
        instance_id, _ = await tool.create()
        response, _, metrics = await tool.execute(instance_id, ["print(1)"])  # type: ignore[arg-type]
        await tool.release(instance_id)
        return response, metrics

    response, metrics = asyncio.run(call())
    assert response.text.startswith('Error: the arguments must be an object with a "code"')
    assert metrics == {"outcome": "rejected", "latency": 0.0, "session_lost": False}
    assert sandbox.open_sessions == 0


def test_trajectories_that_could_not_open_a_session_are_not_kept() -> None:
    """With ``max_sessions`` taken, every new trajectory's failed open left a lock behind,
    without bound (the twenty-eighth red-team round). (The slot is held by a session of
    the sandbox's own user: the tool makes room only among its idle sessions.)"""
    with Sandbox(FakeBackend(session_handler=history), max_sessions=1) as box:
        tool = SessionCodeTool({}, sandbox=box)

        async def rollouts() -> int:
            holder = await box.aopen_session()
            for number in range(200):
                text = await call_tool(tool, "x", AgentData(f"r{number}"))
                assert text.startswith("Error: the code did not run: no interpreter is free")
            kept = len(tool._opening) + len(tool._waiting) + len(tool._used)
            await holder.aclose()
            await tool.aclose()
            return kept

        assert asyncio.run(rollouts()) <= 1


class SlowOpen(FakeBackend):
    """A fake backend whose sessions take ``open_delay`` seconds to open."""

    open_delay = 0.2

    async def open_session(self, *, memory_mb: int | None = None) -> Any:
        await asyncio.sleep(self.open_delay)
        return await super().open_session(memory_mb=memory_mb)


def test_a_trajectory_whose_interpreter_ended_leaves_nothing_behind() -> None:
    """Its lock was kept for good (the review of the twenty-eighth round)."""
    with Sandbox(FakeBackend(session_handler=history), max_sessions=4) as box:
        tool = SessionCodeTool({}, sandbox=box)

        async def rollouts() -> tuple[int, int]:
            for number in range(50):
                await call_tool(tool, "exit", AgentData(f"r{number}"))
            kept = len(tool._sessions) + len(tool._opening) + len(tool._waiting)
            return kept, box.open_sessions

        assert asyncio.run(rollouts()) == (0, 0)


def test_a_release_while_the_trajectory_opens_leaves_one_session() -> None:
    """The release dropped the lock a call held: a second call opened a second session,
    one of them never closed (the review of the twenty-eighth round)."""
    with Sandbox(SlowOpen(session_handler=history), max_sessions=8) as box:
        tool = SessionCodeTool({}, sandbox=box)

        async def calls() -> tuple[list[str], int, int]:
            data = AgentData("r")
            first = asyncio.create_task(call_tool(tool, "a", data))
            await asyncio.sleep(0.05)  # it holds the trajectory's lock, opening
            await tool.release_trajectory("r")
            second = asyncio.create_task(call_tool(tool, "c", data))
            texts = await asyncio.gather(first, second)
            during = box.open_sessions
            await tool.aclose()
            return list(texts), during, box.open_sessions

        texts, during, after = asyncio.run(calls())
    assert texts == ["a\n", "a,c\n"]
    assert (during, after) == (1, 0)


def test_a_call_cancelled_while_its_session_opens_leaves_none_open() -> None:
    """The session opened for it stayed open, in no table, until its TTL (the review of
    the twenty-eighth round). Now the sandbox closes a session whose caller gave up
    before it was handed over (``LoopThread.run_from_other_loop``'s ``abandoned``)."""
    backend = SlowOpen(session_handler=history)
    backend.open_delay = 0.05
    with Sandbox(backend, max_sessions=8) as box:
        tool = SessionCodeTool({}, sandbox=box)

        async def cancelled() -> int:
            call = asyncio.create_task(call_tool(tool, "a", AgentData("r")))
            await asyncio.sleep(0.01)  # the open is under way on the sandbox's own loop
            time.sleep(0.3)  # noqa: ASYNC251 - this loop busy while the open completes there
            call.cancel()  # (as ``asyncio.wait_for``'s timeout would)
            with pytest.raises(asyncio.CancelledError):
                await call
            await tool.aclose()
            deadline = time.monotonic() + 5  # (closed on the sandbox's own loop, soon)
            while box.open_sessions and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            return box.open_sessions

        assert asyncio.run(cancelled()) == 0


def test_a_failed_open_keeps_the_note_for_the_next_call() -> None:
    """Why the earlier interpreter ended was taken before the open, and lost with it."""
    with Sandbox(FakeBackend(session_handler=history), max_sessions=1, session_ttl=0.2) as box:
        tool = SessionCodeTool({}, sandbox=box)

        async def calls() -> str:
            await call_tool(tool, "a", AgentData("r"))
            deadline = time.monotonic() + 10
            while box.open_sessions and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # r's session idles out
            holder = await box.aopen_session()  # takes the one slot (not the tool's)
            refused = await call_tool(tool, "b", AgentData("r"))
            assert refused.startswith("Error: the code did not run"), refused
            await holder.aclose()
            text = await call_tool(tool, "b", AgentData("r"))
            await tool.aclose()
            return text

        said = asyncio.run(calls())
    assert "[the interpreter of the earlier calls had ended (it was idle" in said


def test_an_ended_session_forgotten_between_calls_is_closed() -> None:
    """A call cancelled just as its cell ended the interpreter left the session lost but
    open; forgetting it did not close it (the review of the twenty-eighth round)."""

    async def slow(cell: FakeCell) -> ExecResult | str:
        await asyncio.sleep(0.05)
        return history(cell)

    with Sandbox(FakeBackend(session_handler=slow), max_sessions=8) as box:
        tool = SessionCodeTool({}, sandbox=box)

        async def calls() -> tuple[bool, bool]:
            await call_tool(tool, "a", AgentData("r"))
            ending = asyncio.create_task(call_tool(tool, "exit", AgentData("r")))
            await asyncio.sleep(0.01)  # its cell runs
            time.sleep(0.2)  # noqa: ASYNC251 - this loop busy while the cell ends it
            ending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await ending
            session = tool._sessions["request:r"]
            await call_tool(tool, "x", AgentData("other"))  # forgets r's ended session
            deadline = time.monotonic() + 5  # (its close is handed over, not awaited)
            while not session.closed and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            closed = session.closed
            await tool.aclose()
            return session.lost is not None, closed

        assert asyncio.run(calls()) == (True, True)


@pytest.mark.parametrize(("key", "given"), [("timeout", "abc"), ("memory_mb", [512])])
def test_a_session_tool_config_that_is_not_a_number_names_its_key(key: str, given: object) -> None:
    """``{"timeout": "abc"}`` said only "could not convert string to float" (the new-user
    pass of the thirty-seventh round)."""
    with pytest.raises(ValueError, match=rf"config '{key}' must be a number"):
        SessionCodeTool({key: given})
    assert SessionCodeTool({"timeout": "12.5", "memory_mb": "256"}).timeout == 12.5
