"""The MCP server in process, talked to by the SDK's own client (``mcp.Client``).

``mcp.Client(server)`` connects to an ``MCPServer`` in this process: by default
through the SDK's direct dispatcher, with ``mode="legacy"`` through in-memory
streams carrying JSON-RPC, as stdio does. Each test runs its conversation in a
fresh ``asyncio.run``; the sandbox (one per backend, started on the first call)
is shared by the module's tests, and the sessions a test opens are closed after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from mcp import Client
from mcp.types import CallToolResult, TextContent

from retool_exec import Sandbox
from retool_exec.mcp_server import SandboxTools
from tests.conftest import backend_config, require_docker

T = TypeVar("T")

MCP_BACKENDS = [pytest.param("local"), pytest.param("docker", marks=pytest.mark.docker)]


def converse(tools: SandboxTools, talk: Callable[[Client], Awaitable[T]], **client: Any) -> T:
    """Connect the SDK's client to a new server over ``tools`` and run ``talk`` with it."""

    async def main() -> T:
        async with Client(tools.server(), **client) as connected:
            return await talk(connected)

    return asyncio.run(main())


def text(result: CallToolResult) -> str:
    """The first content block's text (what the model reads)."""
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def texts(result: CallToolResult) -> list[str]:
    return [block.text for block in result.content if isinstance(block, TextContent)]


def fields(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, texts(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def make_sandbox(backend: str, **options: Any) -> Sandbox:
    """A sandbox for ``backend`` as the tests use it: timeout 10 s, one warm container for
    Docker, this session's labels; not started (the tools start it)."""
    config = backend_config(backend)
    if backend != "local":
        config = config.model_copy(update={"pool_size": 1})
    return Sandbox(config, **options)


@pytest.fixture(scope="module", params=MCP_BACKENDS)
def mcp_backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name != "local":
        require_docker()
    return name


@pytest.fixture(scope="module")
def mcp_sandbox(mcp_backend: str) -> Iterator[Sandbox]:
    """The module's sandbox for the backend under test."""
    sandbox = make_sandbox(mcp_backend, max_sessions=8)
    yield sandbox
    sandbox.close()


@pytest.fixture()
def tools(mcp_sandbox: Sandbox) -> Iterator[SandboxTools]:
    """The tools over the module's sandbox; the sessions a test leaves open are closed after it."""
    made = SandboxTools(mcp_sandbox, max_timeout=60)
    yield made
    for session in list(made._sessions.values()):
        session.close()
