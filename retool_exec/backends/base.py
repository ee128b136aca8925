"""The Backend interface: where code runs. Small on purpose, like an httpx transport.

A backend starts, runs one request at a time per call of ``run`` (it may run
many concurrently), and closes. It is async-first; ``Sandbox`` is the one sync
entry point. A backend reports the code's failures in the ExecResult and its
own failures during a call as ``Outcome.SANDBOX_ERROR``; it raises only
before a call can run (see ``retool_exec._errors``).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import ClassVar, Self

from retool_exec._errors import SessionsUnsupportedError
from retool_exec._models import ExecResult
from retool_exec.backends.docker.agent import wire

__all__ = ["MAX_STACK_MB", "Backend", "RunRequest", "SessionHandle"]

MAX_STACK_MB = 1 << 16
"""The largest ``RunRequest.stack_mb``: a bound on the number, far above any memory limit."""


def exact_bytes(data: bytes | bytearray | memoryview) -> bytes:
    """``data``'s content as exact ``bytes``, read through the buffer protocol: never a
    ``bytes`` subclass's ``__len__`` or ``__bytes__``, which are the caller's code. Exact
    ``bytes`` are returned as they are (a 16 MiB stdin is not copied on the call's path)."""
    if type(data) is bytes:
        return data
    with memoryview(data) as view:
        return view.tobytes()


@dataclass(frozen=True, slots=True)
class RunRequest:
    """One call: the code as written, its inputs and its limits.

    ``stdin``, ``files`` and ``fetch`` are handled by the backend *outside* the
    user's process (written before it starts, read after it ends), so nothing
    the code prints can change them. Paths are relative to the call's working
    directory and validated here (``wire.check_relative_path``): a bad one
    raises ValueError before anything runs.
    """

    code: str
    timeout: float
    """Wall-clock seconds; the CPU-time limit is ``int(timeout) + 5``."""
    memory_mb: int | None = None
    """Per-call memory cap where the backend supports one (clamped to its own)."""
    stack_mb: int | None = None
    """The soft stack limit (``RLIMIT_STACK``) of the code's process, in MiB; None: the
    interpreter's (8 MiB on Linux, as for ``python3``). Deep recursion through C frames
    (``functools.lru_cache``, generator expressions) needs more: SandboxFusion gives a
    request's code ``memory_limit_MB`` of stack, and the server passes that on. Set in
    the running interpreter, so threads keep their default stacks; the Docker backend
    clamps it to the container's memory."""
    stdin: bytes | None = None
    """What the code reads from stdin (None: an empty stdin, as ``/dev/null``)."""
    files: Mapping[str, bytes] = field(default_factory=dict)
    """Files written into the working directory before the code starts."""
    fetch: tuple[str, ...] = ()
    """Files read back from the working directory after the code ends (``ExecResult.files``)."""
    fetch_budget: int = wire.MAX_FETCH_BYTES
    """Bytes the fetched files may hold in all; a file past what is left is not read and is
    named in ``fetch_errors``. At most ``wire.MAX_FETCH_BYTES``."""
    script: str | None = None
    """Run the code as ``python SCRIPT`` would: the file (relative to the working directory)
    holds the code, and ``__file__`` and ``sys.argv[0]`` name it. Tracebacks still say
    ``<sandbox>``. None: as ``python -c`` (the seed's way)."""
    cells: tuple[str, ...] = ()
    """Notebook mode: run these cells in order in one interpreter (``code`` must be empty).

    Each cell's output is captured apart (``ExecResult.cells``); the call's own
    ``stdout`` and ``stderr`` hold only what was written outside every cell (an
    at-exit function's output, a thread's between cells). An exception ends only
    its cell; the process exiting or being killed ends the call, and the cells
    after it are not run. ``timeout`` bounds the whole notebook."""
    cell_output_chars: int | None = None
    """Notebook mode: the characters of each cell's stdout and stderr kept (their tails, cut
    where they are captured, as ``max_output_chars`` cuts a call's); None: the backend's
    ``max_output_chars``, which also caps it. Why: a server that shows each cell a share
    of 4096 characters held up to 1 MiB a stream for each of 128 cells."""
    cell_timeout: float | None = None
    """Notebook mode: seconds per cell; past it the cell is interrupted (KeyboardInterrupt),
    and if it does not stop within a second the process is killed."""
    auto_print: bool = False
    """Print the value of a final expression, as ``add_auto_print`` would. The backend does
    it where the code runs (``agent/auto_print.py``): the host never parses the code."""
    fetch_asked: tuple[tuple[str, str], ...] = field(init=False, default=())
    """Each fetch path as the caller wrote it, with its normalised form (``fetch``): the
    result names a file by the caller's spelling (``Sandbox``), the backend by the form.
    Why: keyed ``out.txt`` for a call that asked for ``./out.txt``, a present answer was
    in neither ``files`` nor ``fetch_errors`` under the name the grader looked up (the
    thirty-fourth red-team round)."""

    def __post_init__(self) -> None:
        if not isinstance(self.code, str) or not all(isinstance(c, str) for c in self.cells):
            raise TypeError("code and cells must be str")
        # Exact types, so every size checked here and after is the content's own (a
        # subclass's ``__len__`` is the caller's: thirty-third red-team round).
        object.__setattr__(self, "code", str.__str__(self.code))
        object.__setattr__(self, "cells", tuple(str.__str__(cell) for cell in self.cells))
        if self.stdin is not None:
            if not isinstance(self.stdin, bytes):
                raise TypeError(f"stdin must be bytes, not {type(self.stdin).__name__}")
            object.__setattr__(self, "stdin", exact_bytes(self.stdin))
            if len(self.stdin) > wire.MAX_STDIN_BYTES:
                raise ValueError(
                    f"stdin of {len(self.stdin)} bytes; at most {wire.MAX_STDIN_BYTES}"
                )
        if self.cells and self.code:
            raise ValueError("give either code or cells, not both")
        if not 0 <= self.fetch_budget <= wire.MAX_FETCH_BYTES:
            raise ValueError(
                f"fetch_budget of {self.fetch_budget} bytes; from 0 to {wire.MAX_FETCH_BYTES}"
            )
        if self.stack_mb is not None and (
            isinstance(self.stack_mb, bool)
            or not isinstance(self.stack_mb, int)
            or not 1 <= self.stack_mb <= MAX_STACK_MB
        ):
            raise ValueError(f"stack_mb of {self.stack_mb!r}; an integer from 1 to {MAX_STACK_MB}")
        if self.cell_output_chars is not None and self.cell_output_chars < 0:
            raise ValueError(f"cell_output_chars of {self.cell_output_chars}; at least 0")
        object.__setattr__(self, "files", wire.check_uploads(dict(self.files)))
        asked = tuple(self.fetch)
        object.__setattr__(self, "fetch", wire.check_fetch(asked))
        spelled = tuple((str.__str__(path), wire.check_relative_path(path)) for path in asked)
        object.__setattr__(self, "fetch_asked", spelled)
        if self.script is not None:
            object.__setattr__(self, "script", wire.check_relative_path(self.script))
            if self.script in self.files:
                raise ValueError(f"the script {self.script!r} is also one of the files")
            clash = wire.file_and_directory([*self.files, self.script])
            if clash is not None:  # (else the agent refused it, after the call was sent)
                raise ValueError(
                    f"the script {self.script!r} and the files clash: {clash!r} is "
                    "both a file and a directory"
                )
            if self.cells:
                raise ValueError("a script is run as code, not as notebook cells")

    @property
    def cpu_seconds(self) -> int:
        """The seed's kernel-level backstop behind the wall clock."""
        return int(self.timeout) + 5


class Backend(abc.ABC):
    """Runs code. Subclass it, give it a ``name``, and register a config for it."""

    name: ClassVar[str] = "backend"

    @property
    def capacity(self) -> int | None:
        """How many calls it runs at once (None: no fixed bound). ``Sandbox`` queues the rest."""
        return None

    @property
    def runs_on_any_loop(self) -> bool:
        """Whether ``run`` may now be awaited on any event loop, not only the one that
        started the backend. ``Sandbox`` then runs calls on their caller's loop, with no
        hop to its own loop thread and back (two thread wake-ups per call)."""
        return False

    async def start(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Get ready to run (warm containers, ...). Idempotent."""

    @abc.abstractmethod
    async def run(self, request: RunRequest) -> ExecResult:
        """Run one request and return its result; never raise for the code's failures."""

    async def open_session(self, *, memory_mb: int | None = None) -> SessionHandle:
        """A new long-lived interpreter (see ``Sandbox.session``); not every backend has one."""
        raise SessionsUnsupportedError(f"the {self.name} backend has no sessions")

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


class SessionHandle(abc.ABC):
    """One live interpreter of a backend, driven cell by cell.

    ``run`` returns the cell's ExecResult (its own stdout and stderr only; an
    exception is the cell's error and the interpreter lives on; a cell past
    its timeout is interrupted with KeyboardInterrupt and, if it does not
    stop within a grace period, the interpreter is killed). Once the
    interpreter is gone, ``lost`` says why and ``run``/``fork`` raise
    ``SessionLostError``. ``fork`` returns an independent copy of the state at
    that instant.
    """

    lost: str | None = None
    """Why the interpreter is gone; None while it lives."""

    @abc.abstractmethod
    async def run(self, code: str, timeout: float) -> ExecResult:
        """Run one cell in this interpreter."""

    @abc.abstractmethod
    async def fork(self) -> SessionHandle:
        """A new, independent interpreter whose state is a copy of this one's now."""

    @abc.abstractmethod
    async def close(self) -> None:
        """End the interpreter. Idempotent."""
