"""The Backend interface: where code runs. Small on purpose, like an httpx transport.

A backend starts, runs one request at a time per call of ``run`` (it may run
many concurrently), and closes. It is async-first; ``Sandbox`` is the one sync
entry point. A backend reports the code's failures in the ExecResult and its
own failures during a call as ``Outcome.SANDBOX_ERROR``; it raises only
before a call can run (see ``retool_exec._errors``).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar, Self

from retool_exec._models import ExecResult

__all__ = ["Backend", "RunRequest"]


@dataclass(frozen=True, slots=True)
class RunRequest:
    """One call: the code (already auto-printed if asked) and its limits."""

    code: str
    timeout: float
    """Wall-clock seconds; the CPU-time limit is ``int(timeout) + 5``."""
    memory_mb: int | None = None
    """Per-call memory cap where the backend supports one (clamped to its own)."""

    @property
    def cpu_seconds(self) -> int:
        """The seed's kernel-level backstop behind the wall clock."""
        return int(self.timeout) + 5


class Backend(abc.ABC):
    """Runs code. Subclass it, give it a ``name``, and register a config for it."""

    name: ClassVar[str] = "backend"

    async def start(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Get ready to run (warm containers, ...). Idempotent."""

    @abc.abstractmethod
    async def run(self, request: RunRequest) -> ExecResult:
        """Run one request and return its result; never raise for the code's failures."""

    async def close(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release everything (processes, containers). Idempotent."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
