"""The session tools through the SDK's client, on the local backend and on Docker: state
kept from cell to cell, forks that are copies, the server's cap, the sandbox's TTL, and
every misuse answered as an error in the result."""

from __future__ import annotations

import asyncio
from typing import Any

from mcp import Client
from mcp.types import CallToolResult

from retool_exec.mcp_server import SandboxTools
from tests.mcp.conftest import converse, fields, make_sandbox, text, texts


async def open_(client: Client) -> str:
    session_id: str = fields(await client.call_tool("session_open", {}))["session_id"]
    return session_id


async def cell(client: Client, session_id: str, code: str, **arguments: Any) -> CallToolResult:
    return await client.call_tool(
        "session_run", {"session_id": session_id, "code": code, **arguments}
    )


def test_state_persists_and_the_last_expression_is_shown(tools: SandboxTools) -> None:
    async def talk(client: Client) -> list[CallToolResult]:
        session_id = await open_(client)
        return [
            await cell(client, session_id, "x = 6\nprint('set')"),
            await cell(client, session_id, "x * 7"),
            await cell(client, session_id, "open('note.txt', 'w').write('kept')"),
            await cell(client, session_id, "print(open('note.txt').read())"),
        ]

    first, value, _, note = converse(tools, talk)
    assert text(first) == "set\n"
    assert text(value) == "42\n"
    assert fields(value)["value"] == "42"
    assert fields(value)["stdout"] == ""
    assert fields(value)["session_lost"] is None
    assert text(note) == "kept\n"


def test_a_fork_is_an_independent_copy(tools: SandboxTools) -> None:
    async def talk(client: Client) -> list[str]:
        session_id = await open_(client)
        await cell(client, session_id, "items = [1, 2]")
        forked = await client.call_tool("session_fork", {"session_id": session_id})
        branch = fields(forked)["session_id"]
        assert branch != session_id
        await cell(client, branch, "items.append(3)")
        return [
            text(await cell(client, branch, "items")),
            text(await cell(client, session_id, "items")),
        ]

    assert converse(tools, talk) == ["[1, 2, 3]\n", "[1, 2]\n"]


def test_close_and_unknown_ids(tools: SandboxTools) -> None:
    async def talk(client: Client) -> list[CallToolResult]:
        session_id = await open_(client)
        return [
            await client.call_tool("session_close", {"session_id": session_id}),
            await cell(client, session_id, "print(1)"),
            await client.call_tool("session_close", {"session_id": session_id}),
            await client.call_tool("session_fork", {"session_id": "no-such-id"}),
            await cell(client, "no-such-id", "print(1)"),
        ]

    closed, *errors = converse(tools, talk)
    assert fields(closed)["closed"] is True
    for error in errors:
        assert error.is_error
        assert "no open session" in text(error)
        assert "session_open" in text(error)
    assert tools.open_sessions == 0


def test_a_cell_that_times_out_keeps_the_session(tools: SandboxTools) -> None:
    async def talk(client: Client) -> list[CallToolResult]:
        session_id = await open_(client)
        await cell(client, session_id, "kept = 'yes'")
        slow = await cell(client, session_id, "import time\ntime.sleep(30)", timeout=1)
        return [slow, await cell(client, session_id, "kept")]

    slow, after = converse(tools, talk)
    assert texts(slow)[0] == "Error: execution timed out after 1 seconds."
    assert fields(slow)["timed_out"] is True
    assert "kept" in texts(slow)[1]
    assert text(after) == "'yes'\n"


def test_an_interpreter_that_ends_is_reported_then_gone(tools: SandboxTools) -> None:
    async def talk(client: Client) -> list[CallToolResult]:
        session_id = await open_(client)
        return [
            await cell(client, session_id, "import os\nos._exit(3)"),
            await cell(client, session_id, "print(1)"),
            await client.call_tool("session_fork", {"session_id": session_id}),
            await client.call_tool("session_close", {"session_id": session_id}),
        ]

    ended, after, fork, close = converse(tools, talk)
    assert not ended.is_error
    assert fields(ended)["session_lost"]
    assert "its state is lost" in texts(ended)[-1]
    for error in (after, fork):
        assert error.is_error
        assert "is gone" in text(error)
    assert fields(close)["closed"] is True


def test_the_server_caps_open_sessions(mcp_backend: str) -> None:
    with make_sandbox(mcp_backend, max_sessions=2) as sandbox:
        tools = SandboxTools(sandbox)

        async def talk(client: Client) -> list[CallToolResult]:
            first = await open_(client)
            await client.call_tool("session_fork", {"session_id": first})  # forks count too
            refused = await client.call_tool("session_open", {})
            refused_fork = await client.call_tool("session_fork", {"session_id": first})
            await client.call_tool("session_close", {"session_id": first})
            return [refused, refused_fork, await client.call_tool("session_open", {})]

        refused, refused_fork, reopened = converse(tools, talk)
    for error in (refused, refused_fork):
        assert error.is_error
        assert "max_sessions" in text(error)
        assert "session_close" in text(error)
    assert fields(reopened)["session_id"]


def test_an_idle_session_expires_after_the_sandboxs_ttl(mcp_backend: str) -> None:
    with make_sandbox(mcp_backend, session_ttl=1.0) as sandbox:
        tools = SandboxTools(sandbox)

        async def talk(client: Client) -> tuple[dict[str, Any], CallToolResult]:
            opened = fields(await client.call_tool("session_open", {}))
            for _ in range(150):  # the sandbox checks a few times per TTL
                if not tools.open_sessions:
                    break
                await asyncio.sleep(0.2)
            return opened, await cell(client, opened["session_id"], "print(1)")

        opened, expired = converse(tools, talk)
    assert opened["ttl_seconds"] == 1.0
    assert expired.is_error
    assert "idle" in text(expired)


def test_a_value_whose_repr_holds_a_lone_surrogate_is_answered(tools: SandboxTools) -> None:
    """repr() may return lone surrogates; UTF-8 may not carry them. Over JSON-RPC (as
    stdio) the answer could not be serialised and the whole server exited (the fifth
    red-team round): now they read as '?' and the session goes on."""
    repr_with_surrogate = "class A:\n    def __repr__(self):\n        return 'ok \\ud800 end'\nA()"

    async def talk(client: Client) -> list[CallToolResult]:
        session_id = await open_(client)
        return [
            await cell(client, session_id, repr_with_surrogate),
            await cell(client, session_id, "raise ValueError('\\udcff')"),
            await cell(client, session_id, "print('still here')"),
        ]

    value, error, after = converse(tools, talk, mode="legacy")
    assert "ok ? end" in text(value) and fields(value)["value"] == "ok ? end"
    assert "ValueError: " in text(error)  # (stderr: python3 writes it as \\udcff)
    assert text(after) == "still here\n"
