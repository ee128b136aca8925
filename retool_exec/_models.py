"""The result of one code call: the seed's six fields, plus what they could not say.

``ExecResult(ok, stdout, stderr, returncode, timed_out, latency)`` is the
contract training code already depends on, so those six fields keep their
positions, types and meaning. Everything added has a default, so the seed's
positional constructions still build and compare the same; the added
``outcome`` separates cases the six fields blur together (an OOM kill and a
segfault both look like a negative return code; a broken sandbox looks like a
user error), so a trainer can drop infrastructure failures from the reward.
"""

from __future__ import annotations

import enum
import signal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from retool_exec._text import utf8_safe

__all__ = ["CellResult", "ExecResult", "Outcome", "classify_exit"]


class Outcome(enum.StrEnum):
    """What happened to one call, in words a trainer can branch on."""

    SUCCESS = "success"
    """The code ran to the end and exited 0."""
    ERROR = "error"
    """The code exited non-zero (an uncaught exception, ``sys.exit(3)``, ...)."""
    TIMEOUT = "timeout"
    """The wall-clock limit passed and the process group was killed."""
    OOM = "oom"
    """The memory limit was hit and the kernel killed a process of the code (the main one,
    or one it started), and the code did not exit 0."""
    CPU_LIMIT = "cpu_limit"
    """The CPU-time limit (``RLIMIT_CPU``) was used up: killed by SIGXCPU. A SIGXCPU the
    code sent itself is a ``signal`` where the backend can tell (the Docker backends)."""
    SIGNAL = "signal"
    """Killed by another signal (a segfault, ``os.abort()``, ...)."""
    SANDBOX_ERROR = "sandbox_error"
    """The sandbox itself failed; the code's own behaviour is unknown."""
    REJECTED = "rejected"
    """The code was refused before running (for example: too large)."""


class CellResult(BaseModel):
    """One notebook cell's share of a call run with ``cells=`` (see ``RunRequest.cells``).

    Its streams are captured by the backend apart from every other cell's, so
    one cell cannot write another's output. ``display`` and ``error`` are what
    the interpreter reported for this cell; a cell shares its interpreter with
    the cells after it (as in Jupyter), so earlier cells can change how later
    ones behave, but not which cells ran: ``finished`` is the backend's own
    record that this cell's turn ended and the next one was handed over.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    stdout: str = ""
    stderr: str = ""
    stdout_dropped_chars: int = Field(default=0, ge=0)
    stderr_dropped_chars: int = Field(default=0, ge=0)
    display: list[dict[str, str]] = Field(default_factory=list)
    """A final expression's value as ``{"text/plain": repr(value)}`` (a kernel's execute_result)."""
    error: list[dict[str, Any]] = Field(default_factory=list)
    """An uncaught exception: ``{"ename", "evalue", "traceback": [lines]}``."""
    finished: bool = False
    """The cell ran to its end (False: the process died, exited or timed out in it)."""
    timed_out: bool = False
    """The cell's own time limit passed (it was interrupted, or the process was killed)."""

    @field_validator("display", "error", mode="after")
    @classmethod
    def _utf8_safe(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A value's repr and an exception's text are the code's to make, lone surrogates
        included; the record a trainer tokenizes and a server serialises must be UTF-8."""
        safe: list[dict[str, Any]] = utf8_safe(value)  # type: ignore[assignment]
        return safe


class ExecResult(BaseModel):
    """One code call's result. Immutable, JSON round-trips.

    The first six fields are the seed's, positional as in the seed
    (``ExecResult(True, "5\\n", "", 0, False, 0.03)``); the rest are keyword-only
    with defaults.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64"
    )

    ok: bool
    """``not timed_out and returncode == 0``."""
    stdout: str
    """Captured stdout after tail truncation (raw: not sanitized)."""
    stderr: str
    """Captured stderr after tail truncation (raw: not sanitized)."""
    returncode: int | None
    """Exit status, negative for a signal; None when killed for time or never run."""
    timed_out: bool
    """Killed because the wall-clock limit passed."""
    latency: float
    """Seconds from before waiting for a concurrency slot to the result."""
    outcome: Outcome = Outcome.SUCCESS
    """What happened; derived from the six fields when not given."""
    stdout_dropped_chars: int = Field(default=0, ge=0)
    """Characters of stdout that were cut away (the whole stream's, where seen)."""
    stderr_dropped_chars: int = Field(default=0, ge=0)
    """Characters of stderr that were cut away."""
    backend: str = ""
    """Name of the backend that ran the call (``"local"``, ``"docker"``, ...)."""
    queue_wait: float = Field(default=0.0, ge=0.0)
    """Seconds of ``latency`` spent waiting for a slot or a warm container (the sandbox's
    own start included, for the calls that wait for it)."""
    detail: str = ""
    """For sandbox failures and rejections: what went wrong, for the operator."""
    files: dict[str, bytes] = Field(default_factory=dict)
    """Files fetched from the working directory after the call (``fetch=``), by path as
    the call wrote it (``./out.txt`` and ``out.txt`` are one file under two names)."""
    fetch_errors: dict[str, str] = Field(default_factory=dict)
    """Paths asked for in ``fetch=`` that could not be read back, with the reason."""
    cells: list[CellResult] = Field(default_factory=list)
    """For a call run with ``cells=``: one entry per cell that started, in order."""
    timeout: float | None = Field(default=None, gt=0)
    """The wall-clock limit this call ran under (set by ``Sandbox``), for the timeout message."""

    def __init__(self, *args: Any, **data: Any) -> None:
        # The seed builds results positionally; pydantic models take keywords only.
        if args:
            names = list(_POSITIONAL)
            if len(args) > len(names):
                raise TypeError(f"ExecResult takes at most {len(names)} positional arguments")
            for name, value in zip(names, args, strict=False):
                if name in data:
                    raise TypeError(f"ExecResult got multiple values for argument {name!r}")
                data[name] = value
        if "outcome" not in data and {"timed_out", "returncode"} <= data.keys():
            data["outcome"] = classify_exit(data["returncode"], timed_out=bool(data["timed_out"]))
        super().__init__(**data)

    @field_validator("stdout", "stderr", "detail", "fetch_errors", mode="after")
    @classmethod
    def _utf8_safe(cls, value: Any) -> Any:
        """What a trainer tokenizes and a server serialises must be UTF-8 (see
        ``CellResult``); the backends decode output with replacement already, so this
        only ever changes text that could not be encoded."""
        return utf8_safe(value)

    @classmethod
    def sandbox_failure(
        cls, detail: str, *, backend: str, latency: float, queue_wait: float = 0.0
    ) -> ExecResult:
        """The result of a call the sandbox itself failed: never looks like the code's error."""
        return cls(
            ok=False,
            stdout="",
            stderr="",
            returncode=None,
            timed_out=False,
            latency=latency,
            outcome=Outcome.SANDBOX_ERROR,
            backend=backend,
            queue_wait=queue_wait,
            detail=detail,
        )

    def __hash__(self) -> int:
        # Hashable like the seed's result although ``files``/``cells`` are containers:
        # equal results have equal seed fields, so hashing those is consistent.
        return hash(
            (self.ok, self.stdout, self.stderr, self.returncode, self.timed_out, self.latency)
        )

    def __repr_args__(self) -> Any:
        """A fetched file longer than ``REPR_FILE_BYTES`` shows its size, not its bytes: the
        code chooses that size, and a repr of 31 MiB of fetched data took 0.5 s and 89 MiB
        of text (``asyncio.run`` reprs its main task's result; red team D)."""
        for name, value in super().__repr_args__():
            if name == "files":
                yield name, {path: _FileRepr(data) for path, data in value.items()}
            else:
                yield name, value

    @property
    def truncated(self) -> bool:
        """Whether either stream lost characters to the output cap."""
        return self.stdout_dropped_chars > 0 or self.stderr_dropped_chars > 0

    @property
    def infrastructure_failure(self) -> bool:
        """True when the sandbox, not the code, failed: drop such samples from the reward."""
        return self.outcome is Outcome.SANDBOX_ERROR


_POSITIONAL = ("ok", "stdout", "stderr", "returncode", "timed_out", "latency")

REPR_FILE_BYTES = 256
"""A fetched file is shown whole in ``repr(ExecResult)`` up to this many bytes."""


class _FileRepr:
    """A fetched file in ``repr(ExecResult)``: its bytes if short, else its size."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        if len(self.data) <= REPR_FILE_BYTES:
            return repr(self.data)
        return f"<{len(self.data)} bytes: {self.data[:32]!r}...>"


def not_returned(result: ExecResult) -> str:
    """Why a file asked for was neither in ``result.files`` nor named in its
    ``fetch_errors`` by the backend: the call's end took the read-back with it (the
    sandbox failed, or a container killed whole or past its deadline lost its output)."""
    if result.infrastructure_failure:
        return "not read back: the sandbox failed"
    return "not returned by the sandbox"


_SIGXCPU = int(getattr(signal, "SIGXCPU", 24))


def classify_exit(
    returncode: int | None, *, timed_out: bool, oom: bool = False, cpu_limit: bool | None = None
) -> Outcome:
    """Map how a process ended to an Outcome (a pure function every backend shares).

    ``cpu_limit``: whether the process used its CPU-time limit, where the backend can
    tell (from the process's own CPU time); a SIGXCPU death without it is a ``signal``
    (any process can send itself SIGXCPU). None: the backend cannot tell, and the
    signal is taken at its word.
    """
    if timed_out:
        return Outcome.TIMEOUT
    if oom:
        return Outcome.OOM
    if returncode is None:
        return Outcome.SANDBOX_ERROR
    if returncode == 0:
        return Outcome.SUCCESS
    if returncode == -_SIGXCPU and cpu_limit is not False:
        return Outcome.CPU_LIMIT
    if returncode < 0:
        return Outcome.SIGNAL
    return Outcome.ERROR
