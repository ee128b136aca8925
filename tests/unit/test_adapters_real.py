"""Multi-turn adapters on real interpreters: the local backend and a Docker container.

The fake-backend tests (``test_adapters_sessions.py``) pin the adapters' rules;
these check that a real interpreter behind them keeps real state: variables
and imports across turns of a trajectory, forks that never meet, and an
interpreter that dies being said in the observation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from retool_exec import Sandbox
from retool_exec.adapters import SessionCodeInterpreter, SessionCodeTool, run_branches
from tests.conftest import backend_config, needs_docker, require_docker

BACKENDS = [
    pytest.param(name, id=name, marks=[pytest.mark.docker] if needs_docker(name) else [])
    for name in ("local", "docker-reuse")
]


@pytest.fixture(scope="module", params=BACKENDS)
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    name: str = request.param
    if needs_docker(name):
        require_docker()
    with Sandbox(backend_config(name), max_sessions=8) as box:
        yield box


def test_a_trl_trajectory_builds_on_its_earlier_turns(sandbox: Sandbox) -> None:
    with SessionCodeInterpreter(sandbox, timeout=10.0) as env:
        assert env.code_interpreter("import math\nr = 3") == ""
        assert env.code_interpreter("area = math.pi * r ** 2\nround(area, 2)") == "28.27\n"
        assert env.code_interpreter("print(f'{area:.1f}')") == "28.3\n"
        died = env.code_interpreter("import os\nos._exit(7)")
        assert "[the interpreter ended (" in died
        fresh = env.code_interpreter("print('area' in globals())")
        assert fresh == "False\n"
    assert sandbox.open_sessions == 0


class AgentData:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id


def test_a_verl_trajectory_keeps_its_session_across_tool_calls(sandbox: Sandbox) -> None:
    tool = SessionCodeTool({"type": "native", "timeout": 10}, sandbox=sandbox)

    async def call(code: str, request_id: str) -> str:
        instance_id, _ = await tool.create()
        try:
            response, _, _ = await tool.execute(
                instance_id, {"code": code}, agent_data=AgentData(request_id)
            )
        finally:
            await tool.release(instance_id)
        text: str = response.text
        return text

    async def two_trajectories() -> list[str]:
        await call("from fractions import Fraction\nx = Fraction(1, 3)", "one")
        await call("x = 5", "two")
        answers = [await call("print(x * 3, Fraction(1, 2))", "one"), await call("x", "two")]
        await tool.aclose()
        return answers

    assert asyncio.run(two_trajectories()) == ["1 1/2\n", "5\n"]
    assert sandbox.open_sessions == 0


def test_branches_fork_real_state(sandbox: Sandbox) -> None:
    prefix = "data = list(range(10))\nopen('log.txt', 'w').write('prefix;')"
    continuations = [
        [
            "data.append(99)",
            "open('log.txt', 'a').write('a;')",
            "print(len(data), open('log.txt').read())",
        ],
        ["data.clear()", "print(len(data), open('log.txt').read())"],
    ]
    outcome = run_branches(sandbox, prefix, continuations, timeout=10.0, concurrency=1)
    assert outcome.prefix[0].ok
    assert [branch[-1].stdout for branch in outcome.branches] == ["11 prefix;a;\n", "0 prefix;\n"]
    assert sandbox.open_sessions == 0
