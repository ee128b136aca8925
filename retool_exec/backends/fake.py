"""A backend that runs nothing: for testing code that uses a Sandbox.

Like httpx's ``MockTransport``: give it a handler that maps a request to a
result (or to a string, taken as stdout of a successful run), and your
training-loop tests run without Python subprocesses or Docker.

    sandbox = Sandbox(backend=FakeBackend(lambda req: "5\\n"))

The handler sees the whole ``RunRequest`` (``stdin``, ``files``, ``fetch``,
``cells``, ...); a test that needs fetched files or notebook cells back
returns an ``ExecResult`` with ``files``/``fetch_errors``/``cells`` set, since
a plain string answer carries stdout only.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

from retool_exec._models import ExecResult
from retool_exec.backends.base import Backend, RunRequest
from retool_exec.backends.config import FakeConfig

__all__ = ["FakeBackend", "FakeHandler"]

FakeHandler = Callable[[RunRequest], "ExecResult | str | Awaitable[ExecResult | str]"]


class FakeBackend(Backend):
    """Answers every request through ``handler``; records the requests it saw."""

    name = "fake"

    def __init__(self, handler: FakeHandler | None = None) -> None:
        self._handler: FakeHandler = handler or (lambda _request: "")
        self.requests: list[RunRequest] = []
        self.started = False
        self.closed = False

    @classmethod
    def from_config(cls, config: FakeConfig) -> FakeBackend:
        """A backend that returns the config's fixed values after ``config.delay``."""

        async def fixed(_request: RunRequest) -> ExecResult:
            if config.delay:
                await asyncio.sleep(config.delay)
            return ExecResult(
                ok=not config.timed_out and config.returncode == 0,
                stdout=config.stdout,
                stderr=config.stderr,
                returncode=None if config.timed_out else config.returncode,
                timed_out=config.timed_out,
                latency=config.delay,
                backend=cls.name,
            )

        backend = cls(fixed)
        backend.config = config  # type: ignore[attr-defined]
        return backend

    async def start(self) -> None:
        self.started = True

    async def run(self, request: RunRequest) -> ExecResult:
        started = time.perf_counter()
        self.requests.append(request)
        answer = self._handler(request)
        if inspect.isawaitable(answer):
            answer = await answer
        if isinstance(answer, str):
            return ExecResult(
                True, answer, "", 0, False, time.perf_counter() - started, backend=self.name
            )
        return answer

    async def close(self) -> None:
        self.closed = True
