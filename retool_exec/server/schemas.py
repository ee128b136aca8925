"""Request and response bodies in SandboxFusion's exact shape, plus retool_exec's own.

Requests are lenient, because real clients are: ``language`` may be missing
(verl's tutorial tool posts only ``{"code": ...}``), any field may be null
(it then takes its default), and unknown fields are ignored. Responses are
exact: the same field names, the same enum strings, nothing extra, so a
client written against SandboxFusion parses them unchanged.
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "CellRunResult",
    "CommandRunResult",
    "CommandRunStatus",
    "ExecRequest",
    "RunCodeRequest",
    "RunCodeResponse",
    "RunJupyterRequest",
    "RunJupyterResponse",
    "RunStatus",
    "SessionCreateRequest",
    "SessionCreated",
    "SessionRunRequest",
    "SessionRunResponse",
]


class CommandRunStatus(enum.StrEnum):
    """How one command (SandboxFusion: compile or run) ended."""

    FINISHED = "Finished"
    """It ran to its end, with any return code."""
    ERROR = "Error"
    """The sandbox failed to run it."""
    TIME_LIMIT_EXCEEDED = "TimeLimitExceeded"
    """It was killed for time."""


class RunStatus(enum.StrEnum):
    """The request's verdict, derived from its commands."""

    SUCCESS = "Success"
    FAILED = "Failed"
    SANDBOX_ERROR = "SandboxError"


class _Lenient(BaseModel):
    """Unknown fields are ignored; a null field takes its default."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _nulls_take_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


class RunCodeRequest(_Lenient):
    """``POST /run_code``."""

    code: str
    """The program to run."""
    language: str = "python"
    """Only ``python`` (and its spellings ``python3``, ``py``) runs here."""
    compile_timeout: float = 10.0
    """Python has no compile step, so nothing is compiled. Zero or more; NaN, inf or
    negative: HTTP 400."""
    run_timeout: float | None = None
    """Wall-clock seconds (clamped to the server's maximum); absent: the server's default.
    Zero, negative, NaN or inf: HTTP 400 (never a silent default)."""
    memory_limit_MB: int = -1  # SandboxFusion's spelling
    """Memory cap in MB; -1 (or any value below 1) means the server's limit."""
    stdin: str | None = None
    """Text the program reads from ``sys.stdin``."""
    files: dict[str, str | None] = Field(default_factory=dict)
    """Path (relative to the working directory) → base64 content, written before
    the code runs; a null content skips the entry (as SandboxFusion does)."""
    fetch_files: list[str] = Field(default_factory=list)
    """Paths to read back, base64-encoded, after the code ran."""
    request_id: str | int | None = None
    """Echoed back when given (some clients match replies by it)."""


class CommandRunResult(BaseModel):
    """One command's result."""

    status: CommandRunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    """The answer to ``/run_code``; HTTP 200 whatever the code did."""

    status: RunStatus
    message: str
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    request_id: str | int | None = None


class RunJupyterRequest(_Lenient):
    """``POST /run_jupyter``: cells run in order, sharing one namespace, in one sandbox."""

    cells: list[str]
    cell_timeout: float = 0.0
    """Seconds per cell; 0 means no per-cell limit (negative, NaN or inf: HTTP 400)."""
    total_timeout: float = 45.0
    """Seconds for all cells together (clamped to the server's maximum; zero, negative,
    NaN or inf: HTTP 400)."""
    kernel: str = "python3"
    files: dict[str, str | None] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)
    request_id: str | int | None = None


class CellRunResult(BaseModel):
    """One cell's output, as a Jupyter kernel would report it."""

    stdout: str
    stderr: str
    display: list[dict[str, Any]] = Field(default_factory=list)
    """``{"text/plain": repr(value)}`` for a cell ending in an expression that is not None."""
    error: list[dict[str, Any]] = Field(default_factory=list)
    """``{"ename", "evalue", "traceback": [str]}`` when the cell raised."""


class RunJupyterResponse(BaseModel):
    """The answer to ``/run_jupyter``."""

    status: RunStatus
    message: str
    driver: CommandRunResult | None = None
    cells: list[CellRunResult] = Field(default_factory=list)
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    request_id: str | int | None = None


class ExecRequest(BaseModel):
    """``POST /v1/exec``: retool_exec's own API, answered with an ``ExecResult``."""

    model_config = ConfigDict(extra="forbid")

    code: str
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Wall-clock seconds (clamped to the server's maximum); None: the server's default."""
    memory_mb: int | None = Field(default=None, ge=1)
    """Memory cap in MB (clamped to the server's maximum)."""


class SessionCreateRequest(BaseModel):
    """``POST /sessions`` (the body may be empty)."""

    model_config = ConfigDict(extra="forbid")

    memory_mb: int | None = Field(default=None, ge=1)
    """Memory cap in MB for the session's interpreter (clamped to the server's maximum)."""


class SessionCreated(BaseModel):
    """The answer to ``POST /sessions`` and ``POST /sessions/{id}/fork`` (HTTP 201)."""

    session_id: str
    """The new session's id: unguessable, and good only for the client that made it."""
    ttl: float
    """Seconds the session may stay idle before the server closes it (its id then answers 404)."""


class SessionRunRequest(BaseModel):
    """``POST /sessions/{id}/run``: one cell in the session's interpreter."""

    model_config = ConfigDict(extra="forbid")

    code: str
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Wall-clock seconds for this cell (clamped to the server's maximum); None: the server's
    default. Past it the cell is interrupted and the session lives on (see docs/server.md)."""


class SessionRunResponse(BaseModel):
    """The answer to ``POST /sessions/{id}/run``: ``/run_code``'s verdict plus the cell's own.

    HTTP 200 whatever the cell did; ``status``, ``message`` and ``run_result`` follow
    ``/run_code``'s rules (an exception in the cell is return code 1, ``Failed``).
    """

    status: RunStatus
    message: str
    run_result: CommandRunResult
    display: list[dict[str, str]] = Field(default_factory=list)
    """``{"text/plain": repr(value)}`` when the cell ends in an expression that is not None."""
    error: list[dict[str, Any]] = Field(default_factory=list)
    """``{"ename", "evalue", "traceback": [str]}`` when the cell raised."""
    session_lost: bool = False
    """The interpreter ended in this cell (killed after its timeout, out of memory, exited):
    the id answers 410 from now on. False: the session lives on with its state."""
