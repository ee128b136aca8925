"""Plugging a Sandbox into training frameworks that take tools as plain functions.

TRL's ``GRPOTrainer(tools=[...])`` (like ``transformers``' chat templates)
builds a tool's JSON schema from the function itself: its ``__name__``, its
type hints and a Google-style docstring with an ``Args:`` entry per
parameter. ``make_code_interpreter`` returns such a function, bound to your
sandbox, whose answer is exactly the observation the seed's training loop
gives the model (``sandbox.format_tool_content``).

For frameworks that call SandboxFusion over HTTP (verl, SkyRL), run
``retool-exec serve`` instead and change their URL; see ``docs/server.md``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from retool_exec._sandbox import Sandbox

__all__ = ["make_async_code_interpreter", "make_code_interpreter"]

_DOC = """Run Python code in a fresh, isolated sandbox and return what it printed.

Every call is independent: variables, imports and files from earlier calls
are gone, so include everything the code needs. Use print() to see values.

Args:
    code: A complete Python program to run.

Returns:
    The program's standard output; or its error message if it failed; or a
    note that it timed out.
"""


def make_code_interpreter(sandbox: Sandbox) -> Callable[[str], str]:
    """A TRL-style tool ``code_interpreter(code: str) -> str`` that runs on ``sandbox``.

    Safe to call from any thread (TRL calls tools synchronously); the sandbox
    stays yours to close.
    """

    def code_interpreter(code: str) -> str:
        return sandbox.format_tool_content(sandbox.run_code(code))

    code_interpreter.__doc__ = _DOC
    return code_interpreter


def make_async_code_interpreter(sandbox: Sandbox) -> Callable[[str], Awaitable[str]]:
    """The ``async`` twin of ``make_code_interpreter``, for async tool loops."""

    async def code_interpreter(code: str) -> str:
        return sandbox.format_tool_content(await sandbox.arun_code(code))

    code_interpreter.__doc__ = _DOC
    return code_interpreter
